#!/usr/bin/env python3
"""Import circles between the modules of each crate.

A module is a file of a crate's `src/` (`driver/mod.rs` is `driver`, `http/list.rs` is
`http::list`). Module A imports B when A's code (not its comments or test module) names
`crate::B...`, `super::...` or `self::...` resolving to B (in a `use` or inline), a
submodule of its own by name (`jobs::start` in `driver`), or its parent by `super::*`.
Parents and their submodules count like any other pair: a parent that uses its child and
a child that uses an item of its parent are a circle (declaring `mod child;` is no use of
it). The crate root does not count. Circles are the strongly connected components of
more than one module.

    scripts/import-cycles.py            print the circles of every crate
    scripts/import-cycles.py --check    also fail (exit 1) on a circle not listed in
                                        scripts/import-cycles.known (one per line, its
                                        modules sorted and joined by ' '), or on a listed
                                        one that grew; listed ones that are gone are said

The known list only shrinks: fix a circle, then take its line out.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KNOWN = os.path.join(ROOT, "scripts", "import-cycles.known")


def modules(src):
    """{module path: file text} of one crate's src directory (bin/ excluded)."""
    out = {}
    for d, dirs, files in os.walk(src):
        dirs[:] = [x for x in dirs if x != "bin"]
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(d, f), src)[:-3].split(os.sep)
            if rel[-1] == "mod":
                rel = rel[:-1]
            if rel in (["lib"], ["main"]):
                continue
            with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            # Test modules may import anything of their crate; comments (links in doc
            # comments) import nothing.
            cut = text.find("#[cfg(test)]")
            code = text if cut < 0 else text[:cut]
            out["::".join(rel)] = re.sub(r"//.*", "", code)
    return out


def edges(mods):
    names = set(mods)

    def resolve(path):
        """The longest known module that `path` (a list of segments) starts with."""
        for n in range(len(path), 0, -1):
            m = "::".join(path[:n])
            if m in names:
                return m
        return None

    out = {m: set() for m in mods}
    for m, text in mods.items():
        me = m.split("::")
        # `mod child;` declares a child; it is no use of it.
        text = re.sub(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;", "", text, flags=re.M)
        refs = []
        for prefix, rest in re.findall(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)", text):
            segs = rest.strip(":").split("::")
            if prefix == "super":
                # `super` from a file module `a::b` is `a`; from `a::b` (a dir mod.rs) too.
                segs = me[:-1] + segs
            elif prefix == "self":
                segs = me + segs
            refs.append(segs)
        # `use super::*`: everything of the parent.
        if len(me) > 1 and re.search(r"\bsuper::\*", text):
            refs.append(me[:-1])
        # A child named by its own name (`jobs::start`, `use jobs::{...}`).
        for child in (n for n in names if n.startswith(m + "::") and n.count("::") == m.count("::") + 1):
            if re.search(r"(?<![:\w])" + re.escape(child.rsplit("::", 1)[1]) + r"::", text):
                refs.append(child.split("::"))
        # `use crate::{a, b::c}`, `use super::{a, B}` and `use self::{...}` groups: an
        # item that is no module names the module the group is in.
        for prefix, group in re.findall(r"\b(crate|super|self)::\{([^}]*)\}", text):
            base = [] if prefix == "crate" else me[:-1] if prefix == "super" else me
            for item in group.split(","):
                item = item.strip()
                if item and item != "self":
                    refs.append(base + item.split("::"))
                elif item == "self" and base:
                    refs.append(base)
        for segs in refs:
            target = resolve(segs)
            if target and target != m:
                out[m].add(target)
    return out


def circles(graph):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def main():
    check = "--check" in sys.argv[1:]
    found = []
    crates = os.path.join(ROOT, "crates")
    for c in sorted(os.listdir(crates)):
        src = os.path.join(crates, c, "src")
        if not os.path.isdir(src):
            continue
        for comp in circles(edges(modules(src))):
            found.append(f"{c}: " + " ".join(comp))
    for line in found:
        print(line)
    print(f"{len(found)} import circles")
    if not check:
        return 0
    known = []
    if os.path.exists(KNOWN):
        with open(KNOWN, encoding="utf-8") as fh:
            known = [l.strip() for l in fh if l.strip() and not l.startswith("#")]
    bad = []
    for line in found:
        crate, mods = line.split(": ", 1)
        if line in known:
            continue
        # A known circle may shrink (a subset of a listed one), never grow or appear.
        if any(k.startswith(crate + ": ") and set(mods.split()) <= set(k.split(": ", 1)[1].split()) for k in known):
            continue
        bad.append(line)
    for k in known:
        if k not in found:
            print(f"gone (take it out of {os.path.relpath(KNOWN, ROOT)}): {k}")
    if bad:
        for b in bad:
            print(f"NEW import circle: {b}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
