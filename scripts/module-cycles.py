#!/usr/bin/env python3
"""Fails when a crate's modules import each other in a cycle.

For every module of a crate, its child modules (each with everything below it) must form an
acyclic graph: child A depends on child B when code under A names anything under B (`use`
paths and inline `crate::`/`super::`/`self::` paths). A parent's own file may use its children
and they may use it: that is containment, not a cycle. Test code (`#[cfg(test)]` modules) is
left out. This is the layering `cargo modules dependencies --acyclic` checks, without its
rust-analyzer build.

Usage: scripts/module-cycles.py [--max N] [crate-src-dir ...]   (default: every crates/*/src)
With --max, it fails only when more than N cycles remain: the suite holds the count where it
stands, so none is added while the known ones are taken apart (docs/testing.md).
"""
import os
import re
import sys


def modules(src):
    """module path (tuple) -> file, for every .rs file under src."""
    out = {}
    for d, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(d, f), src)[:-3].split(os.sep)
            if rel[-1] in ("lib", "main", "mod"):
                rel = rel[:-1]
            if rel and rel[0] == "bin":
                continue
            out[tuple(rel)] = os.path.join(d, f)
    return out


def code_of(path):
    text = open(path, encoding="utf-8").read()
    # The file's test module and everything after it (kmirror keeps its tests module last).
    m = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod tests\b", text, re.M)
    if m:
        text = text[: m.start()]
    text = re.sub(r"//[^\n]*", "", text)
    return text


def expand(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']"""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0].strip()]
    head = tree[:i]
    body = tree[i + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            out += [head + x for x in expand(p)]
    return out


def paths(code):
    found = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        found += expand(m.group(1))
    found += re.findall(r"\b(?:crate|super|self)(?:::\w+)+", code)
    return found


def resolve(path, here, known):
    """The module a path names, relative to module `here`, or None outside the crate."""
    segs = [s.strip() for s in path.split("::") if s.strip()]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    mod = base
    for s in segs:
        if mod + (s,) in known:
            mod = mod + (s,)
        else:
            break
    return mod


def cycles(src):
    known = modules(src)
    deps = {}
    for mod, path in known.items():
        deps[mod] = {
            t for t in (resolve(p, mod, known) for p in paths(code_of(path))) if t is not None
        }
    found = []
    for parent in sorted(known):
        children = sorted(m for m in known if len(m) == len(parent) + 1 and m[:-1] == parent)
        if len(children) < 2:
            continue
        edges = {c: set() for c in children}
        for mod, targets in deps.items():
            a = mod[: len(parent) + 1]
            if a not in edges:
                continue
            for t in targets:
                b = t[: len(parent) + 1]
                if b in edges and b != a:
                    edges[a].add(b)
        for scc in strongly_connected(edges):
            if len(scc) > 1:
                found.append((parent, scc, edges))
    return found


def strongly_connected(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            out.append(sorted(scc))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def name(m):
    return "::".join(m) or "crate"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = sys.argv[1:]
    allowed = 0
    if args[:1] == ["--max"]:
        allowed, args = int(args[1]), args[2:]
    srcs = args or sorted(
        os.path.join(root, "crates", c, "src") for c in os.listdir(os.path.join(root, "crates"))
    )
    bad = 0
    for src in srcs:
        for parent, scc, edges in cycles(src):
            bad += 1
            print(f"{os.path.relpath(src, root)}: modules of {name(parent)} import each other in a cycle:")
            for a in scc:
                inside = sorted(name(b) for b in edges[a] if b in scc)
                print(f"  {name(a)} -> {', '.join(inside)}")
    if bad > allowed:
        print(f"{bad} import cycle(s), at most {allowed} allowed")
        return 1
    if bad:
        print(f"{bad} import cycle(s) left (at most {allowed} allowed)")
        return 0
    print(f"no import cycles in {len(srcs)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
