#!/usr/bin/python3
"""doc_links.py ROOT [PAGE...]: every relative link of the Markdown pages resolves.

ROOT is a directory (the installed share/doc/stagefs, or the source tree); PAGE... are pages
under it (default: every *.md below ROOT). A link [text](target) outside code is checked: its
file exists relative to the page, and an anchor (#name) names a heading of that file (GitHub's
rule: lower case, punctuation dropped, spaces as hyphens). Web links are not followed.
Prints each broken link and exits 1; 0 when all hold. Standard library only.
"""
import os
import re
import sys

LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def prose_lines(path):
    """The lines of a page outside fenced code blocks, with inline code removed."""
    out, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                out.append((n, re.sub(r"`[^`]*`", "", line)))
    return out


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    found = set()
    fenced = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                found.add(slug(line.lstrip("#").replace("`", "")))
    return found


def check(root, pages):
    broken = []
    for page in pages:
        for n, line in prose_lines(page):
            for _text, target in LINK.findall(line):
                if re.match(r"^(https?:|mailto:)", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
                where = "%s:%d: %s" % (os.path.relpath(page, root), n, target)
                if not os.path.exists(dest):
                    broken.append(where + " (no such file)")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    broken.append(where + " (no heading #%s)" % anchor)
    return broken


def main(argv):
    root = argv[1]
    pages = [os.path.join(root, p) for p in argv[2:]]
    if not pages:
        for d, _, files in os.walk(root):
            pages += [os.path.join(d, f) for f in files if f.endswith(".md")]
    if not pages:
        print("no pages under %s" % root)
        return 1
    broken = check(root, sorted(pages))
    for b in broken:
        print("broken link: " + b)
    print("%d page(s), %d broken link(s)" % (len(pages), len(broken)))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
