#!/usr/bin/env python3
"""The library's include graph (include/, src/, cuda/): its depth and its layering faults.

    scripts/include_graph.py            the figures docs/architecture.md gives
    scripts/include_graph.py --check    exit 1 on a layering fault or a cycle (a ctest runs this)

A file's level is 1 for a file that includes nothing of the library, else one more than the
highest level among what it includes; the depth is the highest level of any file. Every file has a
layer (LAYERS: the first pattern its path matches); an include is a layering fault when it points
to a higher layer than the including file's. FOGO's and Muon's private headers (their stages, each
with its ATen reference) sit below the one dispatch point that chooses between those references
and the CUDA kernels; their optimizers' sources sit above it.
"""
import argparse
import fnmatch
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Lowest first: (layer, the paths in it).
LAYERS = [
    ("public", ["include/*"]),
    ("cuda", ["src/fogo_private/cuda/*", "cuda/*.cu", "cuda/*.cuh", "cuda/step_graph.cpp"]),
    ("frame", ["src/fogo_private/frame/*", "src/frame/*"]),
    ("newton_schulz", ["src/fogo_private/newton_schulz/*", "src/newton_schulz/*"]),
    ("stages", ["src/fogo_private/fogo/*", "src/fogo_private/muon/*"]),
    ("ops", ["src/fogo_private/ops/*", "src/ops/*", "cuda/ops_cuda.cpp"]),
    ("optimizers", ["src/fogo/*", "src/muon/*"]),
    ("hybrid", ["src/hybrid/*"]),
    ("distributed", ["src/fogo_private/distributed/*", "src/distributed/*"]),
]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
SOURCE = (".h", ".cuh", ".cpp", ".cu")


def library_files():
    files = []
    for top in ("include", "src", "cuda"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            files += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names
                      if n.endswith(SOURCE)]
    return sorted(files)


def layer(path):
    """The index in LAYERS of the first layer a pattern of which matches `path`."""
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatch(path, p) for p in patterns):
            return i
    return None


def resolve(path, name, files):
    """The library file `#include name` in `path` means, or None (torch, std, ...)."""
    for base in (os.path.dirname(path), "include", "src"):
        candidate = os.path.normpath(os.path.join(base, name))
        if candidate in files:
            return candidate
    return None


def graph():
    files = library_files()
    known = set(files)
    edges = {}
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as text:
            names = INCLUDE.findall(text.read())
        edges[f] = sorted({r for r in (resolve(f, n, known) for n in names) if r and r != f})
    return edges


def levels(edges):
    level, active, cycles = {}, set(), []

    def visit(f, chain):
        if f in level:
            return level[f]
        if f in active:
            cycles.append(chain[chain.index(f):] + [f])
            return 0
        active.add(f)
        level[f] = 1 + max((visit(g, chain + [g]) for g in edges[f]), default=0)
        active.discard(f)
        return level[f]

    for f in edges:
        visit(f, [f])
    return level, cycles


def deepest_chain(edges, level):
    f = max(level, key=lambda k: (level[k], k))
    chain = [f]
    while edges[f]:
        f = max(edges[f], key=lambda k: (level[k], k))
        chain.append(f)
    return chain


def faults(edges):
    out = []
    for f, targets in edges.items():
        for g in targets:
            if layer(g) > layer(f):
                out.append((f, g))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    edges = graph()
    unknown = [f for f in edges if layer(f) is None]
    if unknown:
        sys.exit(f"include_graph: files in no layer: {unknown} (add a pattern to LAYERS)")
    level, cycles = levels(edges)
    chain = deepest_chain(edges, level)
    bad = faults(edges)
    print(f"{len(edges)} files, {sum(map(len, edges.values()))} includes among them")
    print(f"depth: {max(level.values())} levels, e.g. " + " -> ".join(chain))
    print(f"layering faults: {len(bad)}")
    for f, g in bad:
        print(f"  {f} ({LAYERS[layer(f)][0]}) includes {g} ({LAYERS[layer(g)][0]})")
    for c in cycles:
        print("  cycle: " + " -> ".join(c))
    if args.check and (bad or cycles):
        sys.exit(1)


if __name__ == "__main__":
    main()
