#!/usr/bin/python3
"""A reader of stagefs profiles written from docs/profile-format.md alone (not from the C++
codec), so that the tests check the file against its documentation. Standard library only.

    profile_format.py FILE      print the profile as JSON
    decode(bytes) -> dict       {"version", "truncated", "chunk_size", "uid", "created",
                                 "source", "files": [{"path", "first_ms", "chunks"}]}
Raises ValueError on anything the format does not allow.
"""
import json
import sys

MAGIC = b"STGPROF"
CRC64_POLY = 0xC96C5795D7870F42  # ECMA-182, reflected (CRC-64/XZ)


def _crc64_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ CRC64_POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc64_table()


def crc64(data):
    crc = 0xFFFFFFFFFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFFFFFFFFFF


class _Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def varint(self):
        v = shift = 0
        while True:
            if self.pos >= len(self.data) or shift > 63:
                raise ValueError("bad varint")
            b = self.data[self.pos]
            self.pos += 1
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7

    def string(self):
        n = self.varint()
        if n > len(self.data) - self.pos:
            raise ValueError("string past the end")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s


def _unzigzag(v):
    return (v >> 1) ^ -(v & 1)


def decode(data):
    if len(data) < 24 or data[:7] != MAGIC:
        raise ValueError("not a stagefs profile")
    version, flags = data[7], data[8]
    if version != 1 or flags & ~1 or data[9:12] != b"\0\0\0":
        raise ValueError("unknown version or flags")
    length = int.from_bytes(data[12:16], "little")
    if length != len(data) - 24:
        raise ValueError("length")
    if crc64(data[:16 + length]) != int.from_bytes(data[16 + length:], "little"):
        raise ValueError("checksum")
    r = _Reader(data[16:16 + length])
    out = {"version": version, "truncated": bool(flags & 1), "chunk_size": r.varint(), "uid": r.varint(),
           "created": r.varint(), "source": r.string().decode(errors="surrogateescape"), "files": []}
    dirs, prev = [], b""
    for _ in range(r.varint()):
        shared = r.varint()
        d = prev[:shared] + r.string()
        dirs.append(d)
        prev = d
    ms = 0
    for _ in range(r.varint()):
        d = dirs[r.varint()]
        name = r.string()
        ms += r.varint()
        chunks, c = [], -1
        for _ in range(r.varint()):
            c += _unzigzag(r.varint())
            chunks.append(c)
        path = (d + b"/" + name) if d else name
        out["files"].append({"path": path.decode(errors="surrogateescape"), "first_ms": ms, "chunks": chunks})
    if r.pos != len(r.data):
        raise ValueError("bytes after the last file")
    return out


def read(path):
    with open(path, "rb") as f:
        return decode(f.read())


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1]), indent=1))
