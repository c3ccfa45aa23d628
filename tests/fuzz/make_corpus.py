#!/usr/bin/env python3
"""Writes seed inputs for fuzz_decode: valid control messages and manifests (the fuzzer
mutates from there). Usage: make_corpus.py DIR"""
import os, struct, sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)

def msg(t, ident, path, uid=0, flags=0, frm="", until=""):
    p, f, u = path.encode(), frm.encode(), until.encode()
    return struct.pack("<IBQIIBHH", 0x53544643, t, ident, len(p), uid, flags, len(f), len(u)) + p + f + u

CHUNK = 16 << 20

def entry(path, typ, size, target=b"", holes=()):
    p = path.encode()
    return (struct.pack("<I", len(p)) + p + struct.pack("<B", typ) +
            struct.pack("<QQQQQQI", size, size, 1, 2, 3, 4, 0o644) + struct.pack("<I", len(target)) + target +
            struct.pack("<I", len(holes)) + b"".join(struct.pack("<QQ", off, n) for off, n in holes))

def manifest(tree, entries):
    return struct.pack("<IBQQ", 0x53544734, 1 if tree else 0, CHUNK, len(entries)) + b"".join(entries)

seeds = {
    "req": msg(1, 0, "images/pytorch.sqsh"),
    "shutdown": msg(2, 7, ""),
    "batch_slice": msg(3, 4, "data/train", uid=1000, flags=1, frm="f00017", until="f04113"),
    "single": manifest(False, [entry("", 1, 123)]),
    "sparse": manifest(False, [entry("", 1, 1 << 40, holes=[(0, 2 * CHUNK), (4 * CHUNK, (1 << 40) - 4 * CHUNK)])]),
    "tree": manifest(True, [entry("", 2, 0), entry("a", 2, 0), entry("a/f", 1, 10), entry("l", 3, 0, b"a/f")]),
}
# A profile (docs/profile-format.md), as tests/mount/profile_format.py writes it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mount"))
sys.dont_write_bytecode = True
import profile_format  # noqa: E402
seeds["profile"] = profile_format.encode({"chunk_size": 16 << 20, "uid": 1000, "source": "/shared/data", "files": [
    {"path": "img.sqsh", "first_ms": 0, "chunks": [0, 63, 1, 2]}, {"path": "train/d001/a.jpg", "first_ms": 30},
    {"path": "train/d000/b.jpg", "first_ms": 31}, {"path": "top", "first_ms": 900}]})
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
