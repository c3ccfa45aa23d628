#!/usr/bin/python3
"""A reader of stagefs profiles written from docs/profile-format.md alone (not from the C++
codec), so that the tests check the file against its documentation. Standard library only.

    profile_format.py FILE      print the profile as JSON
    decode(bytes) -> dict       {"version", "truncated", "chunk_size", "uid", "created",
                                 "source", "files": [{"path", "first_ms", "chunks"}]}
Raises ValueError on anything the format does not allow.
"""
import json
import os
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


def _varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _zigzag(v):
    return (v << 1) ^ (v >> 63) if v >= 0 else ((-v) << 1) - 1


def encode(profile):
    """The bytes of a profile (a dict as decode() returns; missing fields 0 or empty), written
    as the format says, whatever it holds: tests use it to forge profiles."""
    files = profile.get("files", [])
    split = [(f["path"].rsplit("/", 1) if "/" in f["path"] else ["", f["path"]]) for f in files]
    dirs = sorted({d.encode(errors="surrogateescape") for d, _ in split})
    body = bytearray()
    source = profile.get("source", "").encode(errors="surrogateescape")
    body += _varint(profile.get("chunk_size", 0)) + _varint(profile.get("uid", 0)) + _varint(profile.get("created", 0))
    body += _varint(len(source)) + source + _varint(len(dirs))
    prev = b""
    for d in dirs:
        shared = 0
        while shared < min(len(prev), len(d)) and prev[shared] == d[shared]:
            shared += 1
        body += _varint(shared) + _varint(len(d) - shared) + d[shared:]
        prev = d
    body += _varint(len(files))
    ms = 0
    for f, (d, name) in zip(files, split):
        n = name.encode(errors="surrogateescape")
        body += _varint(dirs.index(d.encode(errors="surrogateescape"))) + _varint(len(n)) + n
        body += _varint(max(f.get("first_ms", 0) - ms, 0))
        ms = max(ms, f.get("first_ms", 0))
        chunks = f.get("chunks", [])
        body += _varint(len(chunks))
        c = -1
        for k in chunks:
            body += _varint(_zigzag(k - c))
            c = k
    head = MAGIC + bytes([1, 1 if profile.get("truncated") else 0, 0, 0, 0]) + len(body).to_bytes(4, "little")
    data = head + bytes(body)
    return data + crc64(data).to_bytes(8, "little")


def write(path, profile, mode=0o600):
    with open(path, "wb") as f:
        f.write(encode(profile))
    os.chmod(path, mode)


def read(path):
    with open(path, "rb") as f:
        return decode(f.read())


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1]), indent=1))
