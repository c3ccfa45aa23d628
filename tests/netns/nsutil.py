#!/usr/bin/python3
"""Tiny tools the netns tests run inside a simulated node (standard library only).

    nsutil.py read PATH         open PATH, hash it: "ok <sha256> <size> <seconds>" (exit 0)
                                or "err <ERRNO_NAME> <seconds> <message>" (exit 1)
    nsutil.py xattr PATH NAME   print the attribute's value (exit 0) or "err <ERRNO_NAME>" (exit 1)
"""
import errno
import hashlib
import os
import sys
import time


def read(path):
    t0 = time.monotonic()
    h = hashlib.sha256()
    size = 0
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            while True:
                b = os.read(fd, 4 << 20)
                if not b:
                    break
                h.update(b)
                size += len(b)
        finally:
            os.close(fd)
    except OSError as e:
        print("err %s %.3f %s" % (errno.errorcode.get(e.errno, str(e.errno)), time.monotonic() - t0, e.strerror),
              flush=True)
        return 1
    print("ok %s %d %.3f" % (h.hexdigest(), size, time.monotonic() - t0), flush=True)
    return 0


def xattr(path, name):
    try:
        print(os.getxattr(path, name).decode(errors="replace"), flush=True)
        return 0
    except OSError as e:
        print("err %s" % errno.errorcode.get(e.errno, str(e.errno)), flush=True)
        return 1


def main(argv):
    if len(argv) == 3 and argv[1] == "read":
        return read(argv[2])
    if len(argv) == 4 and argv[1] == "xattr":
        return xattr(argv[2], argv[3])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
