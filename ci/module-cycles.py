#!/usr/bin/env python3
"""Fails when the modules of a Rust crate import each other in a cycle.

Usage: ci/module-cycles.py [--depth N] CRATE_SRC_DIR...

For each `src/` directory given, every `.rs` file is mapped to its module
path (`src/steps/load.rs` and `src/steps/load/mod.rs` are `steps::load`;
`main.rs` and `lib.rs` are the crate root), and every `crate::a::b::...`
path in it (in `use` declarations, `use crate::{a, b::c}` groups included,
and in expressions) becomes an edge from the file's module to the module it
names. Both ends are cut to their first N components (`--depth`, default 1:
top-level modules), edges inside one module are dropped, and the resulting
graph is searched for cycles. `super::` and `self::` paths are resolved
against the file's own module first.

This reads source text, not the compiler's name resolution: a path inside a
string counts too (comments and a trailing `#[cfg(test)] mod` are dropped
first, strings are not),
and a glob or re-export is taken at the module it names. The crate root is a
node too (`(crate root)`): its items used as `crate::item` are edges to it,
and its `module::` paths edges from it. That is enough for a
layering check: it errs on the side of seeing an edge.

Exit status: 0 if no crate has a cycle, 1 if one has, 2 on usage errors.
"""

import argparse
import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# The node of the crate root (main.rs / lib.rs and its inline modules).
ROOT = "(crate root)"


def module_of(src: Path, file: Path) -> list[str]:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("main", "lib")):
        parts = parts[:-1]
    return parts


def strip_comments_and_tests(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    # An inline test module (`#[cfg(test)] mod tests {`, by convention the
    # file's last item) runs `use super::*` on the file's own module.
    return re.split(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text, maxsplit=1)[0]


def expand_use_tree(tree: str) -> list[list[str]]:
    """`a::{b, c::{d, e}}` → [[a, b], [a, c, d], [a, c, e]] (`as` and `*` dropped)."""
    tree = re.sub(r"\s+", "", tree)
    out: list[list[str]] = []

    def walk(prefix: list[str], s: str) -> None:
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for item in filter(None, items):
            if "{" in item:
                head, _, rest = item.partition("{")
                walk(prefix + [p for p in head.split("::") if p], rest[: rest.rindex("}")])
            else:
                name = item.split("as", 1)[0] if re.search(r"\bas\b", item) else item
                out.append(prefix + [p for p in name.split("::") if p and p != "*"])

    walk([], tree)
    return out


def paths_in(text: str) -> list[list[str]]:
    """Every path a file names that starts with `crate`, `super` or `self`."""
    paths = []
    for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text, flags=re.M):
        if m.group(1).count("{") == m.group(1).count("}"):
            paths.extend(expand_use_tree(m.group(1)))
    # Paths in expressions and types: `crate::x::y(...)`, `super::x::T`.
    for m in re.finditer(rf"\b((?:crate|super|self)(?:::{IDENT})+)", text):
        paths.append(m.group(1).split("::"))
    return [p for p in paths if p and p[0] in ("crate", "super", "self")]


def resolve(module: list[str], path: list[str]) -> list[str]:
    """An absolute module path (without `crate`) for `path` as written in `module`."""
    if path[0] == "crate":
        return path[1:]
    # In `a/b.rs` (module a::b) and in `a/b/mod.rs` alike, `self` is a::b and
    # `super` is a.
    base = list(module)
    rest = list(path)
    while rest and rest[0] in ("self", "super"):
        if rest.pop(0) == "super":
            base = base[:-1]
    return base + rest


def graph(src: Path, depth: int) -> tuple[dict[str, set[str]], set[str]]:
    files = sorted(src.rglob("*.rs"))
    modules = {tuple(module_of(src, f)) for f in files}
    edges: dict[str, set[str]] = {}
    nodes: set[str] = set()
    for f in files:
        module = module_of(src, f)
        here = "::".join(module[:depth]) or ROOT
        nodes.add(here)
        text = strip_comments_and_tests(f.read_text())
        if not module:
            # The crate root names its own modules without `crate::`.
            for top in sorted({m[0] for m in modules if m}):
                if re.search(rf"(?<![:\w]){top}::", text):
                    edges.setdefault(ROOT, set()).add(top)
                    nodes.add(top)
        for path in paths_in(text):
            target = resolve(module, path)
            # Keep the longest prefix that is a module: `crate::sys::Errno` →
            # sys; an item of the crate root (or of an inline module in it)
            # is the root.
            while target and tuple(target) not in modules:
                target = target[:-1]
            there = "::".join(target[:depth]) or ROOT
            if there != here:
                edges.setdefault(here, set()).add(there)
                nodes.add(there)
    return edges, nodes


def find_cycles(edges: dict[str, set[str]], nodes: set[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sccs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--depth", type=int, default=1, help="module path components per node")
    parser.add_argument("src", nargs="+", type=Path, help="a crate's src/ directory")
    args = parser.parse_args()
    if args.depth < 1:
        parser.error("--depth must be at least 1")
    failed = False
    for src in args.src:
        if not src.is_dir():
            parser.error(f"{src} is not a directory")
        edges, nodes = graph(src, args.depth)
        cycles = find_cycles(edges, nodes)
        n_edges = sum(len(v) for v in edges.values())
        if cycles:
            failed = True
            print(f"{src}: {len(nodes)} modules, {n_edges} edges, {len(cycles)} cycle(s):")
            for scc in cycles:
                members = set(scc)
                print(f"  cycle among {', '.join(scc)}:")
                for v in scc:
                    inside = sorted(edges.get(v, set()) & members)
                    print(f"    {v} -> {', '.join(inside)}")
        else:
            print(f"{src}: {len(nodes)} modules, {n_edges} edges, no cycle (depth {args.depth})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
