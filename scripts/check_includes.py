#!/usr/bin/env python3
"""Checks that every #include "..." in quire's sources points down the floors.

    python3 scripts/check_includes.py [--root DIR] [--graph]

The floors (DESIGN.md's Layout):

    server -> engine -> {spec, grammar, kernels, model, text, store} -> base

Each source folder is a room; ROOMS below names the rooms a room's files may
include from (its own always).  An include is resolved as the compiler does
with the build's include directories: beside the including file first, then
by the path under each room's folder.  A header name must be unique across the
rooms (bare names are how the code includes), so a second header of the same
name is an error too, as is a quoted include that resolves to nothing.

Exit status 0 when the graph is clean, 1 with one line per violation.
tests/, bench/ and generated code may include anything and are not checked.
"""
import argparse
import os
import re
import sys

# room -> (folder, rooms it may include besides itself)
ROOMS = {
    "base": ("base", []),
    "kernels": ("kernels", ["base"]),
    "grammar": ("grammar", ["base"]),
    # A draft model runs on a backend.
    "spec": ("spec", ["kernels", "base"]),
    "store": ("engine/store", ["base"]),
    # The model owns the tensors' description, which backend.h declares.
    "model": ("engine/model", ["kernels", "base"]),
    # A tokenizer or chat template is read from a model file's metadata.
    "text": ("engine/text", ["model", "kernels", "base"]),
    "engine": ("engine", ["model", "text", "store", "spec", "grammar", "kernels", "base"]),
    "server": ("server", ["engine", "model", "text", "store", "spec", "grammar", "kernels", "base"]),
}
# The build's include directories (CMakeLists.txt), searched in this order.
INCLUDE_DIRS = ["base", "engine", "engine/model", "engine/text", "engine/store", "kernels",
                "kernels/cuda", "grammar", "spec", "server"]
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(rel):
    """The room of a path relative to the root: the longest folder that holds it."""
    best = None
    for name, (folder, _) in ROOMS.items():
        if rel == folder or rel.startswith(folder + "/"):
            if best is None or len(folder) > len(ROOMS[best][0]):
                best = name
    return best


def sources(root):
    for name, (folder, _) in ROOMS.items():
        top = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(top):
            for f in sorted(filenames):
                if f.endswith(SOURCE_EXT):
                    rel = os.path.relpath(os.path.join(dirpath, f), root)
                    if room_of(rel) == name:
                        yield rel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--graph", action="store_true", help="print the room-to-room include counts")
    args = ap.parse_args()
    root = os.path.abspath(args.root)

    files = sorted(set(sources(root)))
    bad = []
    by_name = {}
    for rel in files:
        if rel.endswith((".h", ".cuh")):
            base = os.path.basename(rel)
            if base in by_name:
                bad.append(f"{rel}: header name also used by {by_name[base]}")
            else:
                by_name[base] = rel
    def resolve(rel, inc):
        here = os.path.normpath(os.path.join(os.path.dirname(rel), inc))
        if os.path.isfile(os.path.join(root, here)):
            return here
        for folder in INCLUDE_DIRS:
            cand = os.path.normpath(os.path.join(folder, inc))
            if os.path.isfile(os.path.join(root, cand)):
                return cand
        return None

    edges = {}
    for rel in files:
        src_room = room_of(rel)
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for m in INCLUDE_RE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            target = resolve(rel, inc)
            if target is None:
                bad.append(f"{rel}:{line}: \"{inc}\" is not a file of the project")
                continue
            dst_room = room_of(target)
            edges[(src_room, dst_room)] = edges.get((src_room, dst_room), 0) + 1
            if dst_room != src_room and dst_room not in ROOMS[src_room][1]:
                bad.append(f"{rel}:{line}: {src_room} includes {target} ({dst_room}), "
                           f"up or across the floors ({src_room} may include: "
                           f"{', '.join(ROOMS[src_room][1]) or 'nothing'})")
    if args.graph:
        for (a, b), n in sorted(edges.items()):
            if a != b:
                print(f"{a:8} -> {b:8} {n}")
    for b in bad:
        print(b)
    print(f"check_includes: {len(files)} files, {sum(edges.values())} includes, "
          f"{len(bad)} violation{'s' if len(bad) != 1 else ''}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
