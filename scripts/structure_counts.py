#!/usr/bin/env python3
"""The structure's counts (issues 36 and 53), printed by the test command so drift shows in every
CI run:

- `pub` items outside tests, counted as the review hook counts them (a line that starts with
  `pub fn|struct|enum|trait|type|const|static|mod|use`, `pub(crate)` and the like not counted);
- `Result<_, String>` outside tests, per top-level module (`src/cluster` and `src/api`: none);
- files over 1,000 lines (tests included) and the largest files;
- import cycles between sibling modules at every depth of the tree. Unlike a check that reads
  only `crate::` paths, this one resolves `super::` by depth and the relative paths a `use` in a
  `mod.rs` (or in `x.rs` beside a folder `x/`) names its children by;
- children naming an item their parent module declares private (no `pub`): a child may, and
  STYLE.md asks that it not (a parent hands its children what they need).

    python3 scripts/structure_counts.py [ROOT] [--strict]

With --strict it exits 1 on an import cycle or a Result<_, String> in src/cluster or src/api.
Test code is skipped: files named tests.rs or under a tests/ directory, and `#[cfg(test)]` items.
"""

import pathlib
import re
import sys

HOOK_PUB = re.compile(r"^\s*pub (async )?(fn|struct|enum|trait|type|const|static|mod|use) ")
STRING_RESULT = re.compile(r"Result<[^;{]*, *String>")
USE_STMT = re.compile(r"\buse\s+([^;]+);", re.S)
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
PRIVATE_ITEM = re.compile(
    r"^(?:async\s+)?(?:fn|struct|enum|trait|type|const|static)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M
)


def production(text):
    """The text outside `#[cfg(test)]` items (an item up to its closing brace or semicolon)."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            i += 1
            depth, opened = 0, False
            while i < len(lines):
                depth += lines[i].count("{") - lines[i].count("}")
                opened |= "{" in lines[i]
                i += 1
                if (opened and depth <= 0) or (not opened and lines[i - 1].rstrip().endswith(";")):
                    break
            continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def module_path(rel):
    """src/cluster/route/mod.rs -> (cluster, route); src/cluster/owner.rs -> (cluster, owner)."""
    parts = list(rel.with_suffix("").parts[1:])
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def children(root, module):
    """The child modules a module's file may name relatively: the files and folders beside it."""
    folder = root.joinpath("src", *module)
    if not folder.is_dir():
        return set()
    return {p.stem for p in folder.iterdir() if p.suffix == ".rs" and p.stem != "mod"} | {
        p.name for p in folder.iterdir() if p.is_dir()
    }


def references(root, module, code):
    """Absolute module paths (tuples) that `code`, in `module`, names."""
    out = []
    # Comments are not references.
    code = re.sub(r"//[^\n]*", "", code)
    for m in PATH.finditer(code):
        head, rest = m.group(1), [s for s in m.group(2).split("::") if s]
        if head == "crate":
            out.append(tuple(rest))
        else:
            # `self` is the module itself, `super` its parent, whatever file it is in.
            base = list(module) if head == "self" else list(module[:-1])
            while rest and rest[0] == "super":
                rest, base = rest[1:], base[:-1]
            out.append(tuple(base + rest))
    kids = children(root, module)
    for m in USE_STMT.finditer(code):
        first = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?([A-Za-z_][A-Za-z0-9_]*)", m.group(1))
        if first and first.group(1) in kids:
            tail = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(1))
            out.append(tuple(module) + tuple(tail[:2]))
    return out


def tarjan(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
            out.append(scc)

    for v in sorted(set(graph) | {b for e in graph.values() for b in e}):
        if v not in index:
            visit(v)
    return [sorted(c) for c in out if len(c) > 1]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    strict = "--strict" in sys.argv
    root = pathlib.Path(args[0] if args else ".")
    files = {}
    for path in sorted((root / "src").rglob("*.rs")):
        rel = path.relative_to(root)
        if path.name == "tests.rs" or "tests" in rel.parts[1:-1]:
            continue
        files[rel] = path.read_text()
    pub, string_results, sizes = 0, {}, []
    modules = {module_path(rel): rel for rel in files}
    private = {m: set(PRIVATE_ITEM.findall(production(files[rel]))) for m, rel in modules.items()}
    graph, parent_private = {}, []
    for rel, text in files.items():
        code = production(text)
        pub += sum(1 for line in code.splitlines() if HOOK_PUB.match(line))
        n = len(STRING_RESULT.findall(code))
        if n:
            top = rel.parts[1] if len(rel.parts) > 2 else rel.stem
            string_results[top] = string_results.get(top, 0) + n
        sizes.append((len(text.splitlines()), str(rel)))
        me = module_path(rel)
        for target in references(root, me, code):
            # The longest known module the path starts with, and the item after it.
            for k in range(len(target), 0, -1):
                if target[:k] in modules:
                    mod, item = target[:k], target[k] if k < len(target) else None
                    break
            else:
                continue
            if item and mod == me[:-1] and item in private.get(mod, ()):
                parent_private.append(f"{rel}: {'::'.join(mod)}::{item}")
            # Siblings: the first components where the two paths part, below a common parent.
            common = 0
            while common < min(len(me), len(mod)) and me[common] == mod[common]:
                common += 1
            if common < len(me) and common < len(mod):
                a, b = me[: common + 1], mod[: common + 1]
                graph.setdefault("::".join(a), set()).add("::".join(b))
    cycles = tarjan(graph)
    sizes.sort(reverse=True)
    over = [f"{p} {n}" for n, p in sizes if n > 1000]
    typed = {k: v for k, v in string_results.items() if k in ("cluster", "api")}
    print(f"pub items outside tests: {pub}")
    print(
        f"Result<_, String> outside tests: {sum(string_results.values())} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(string_results.items(), key=lambda kv: -kv[1]))
        + "); in src/cluster and src/api: "
        + str(sum(typed.values()))
    )
    print(f"files over 1,000 lines: {len(over)}" + (f" ({', '.join(over)})" if over else ""))
    print("largest files: " + ", ".join(f"{p} {n}" for n, p in sizes[:5]))
    print(f"import cycles between sibling modules (relative use included): {len(cycles)}")
    for c in cycles:
        print("  cycle: " + " <-> ".join(c))
    print(f"children naming a private item of their parent: {len(parent_private)}")
    for p in parent_private[:20]:
        print("  " + p)
    if strict and (cycles or typed):
        sys.exit(1)


if __name__ == "__main__":
    main()
