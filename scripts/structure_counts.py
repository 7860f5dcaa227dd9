#!/usr/bin/env python3
"""Counts for the structural steps (issue 36): `pub` items against restricted ones, functions
returning `Result<_, String>`, and the largest files, in src/ outside tests.

    python3 scripts/structure_counts.py [ROOT]

Test code is skipped: files named tests.rs or under a tests/ directory, and any
`#[cfg(test)]` item (an inline `mod tests { ... }` up to its closing brace)."""

import pathlib
import re
import sys

PUB = re.compile(r"\bpub\b(?!\s*\()")
RESTRICTED = re.compile(r"\bpub\s*\((crate|super|in\b[^)]*)\)")
STRING_RESULT = re.compile(r"Result<[^;{=]*?,\s*String\s*>")


def production_lines(text):
    """The file's lines outside `#[cfg(test)]` items."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            i += 1
            # Skip the item: a one-line `mod x;` / `use ...;`, or a block to its closing brace.
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
    return out


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    pub = restricted = string_results = 0
    sizes = []
    for path in sorted((root / "src").rglob("*.rs")):
        rel = path.relative_to(root)
        if path.name == "tests.rs" or "tests" in rel.parts[:-1]:
            continue
        lines = production_lines(path.read_text())
        code = [l for l in lines if not l.lstrip().startswith("//")]
        pub += sum(len(PUB.findall(l)) for l in code)
        restricted += sum(len(RESTRICTED.findall(l)) for l in code)
        string_results += sum(len(STRING_RESULT.findall(l)) for l in code)
        sizes.append((len(path.read_text().splitlines()), str(rel)))
    sizes.sort(reverse=True)
    print(f"pub items: {pub}; pub(crate)/pub(super)/pub(in): {restricted}")
    print(f"Result<_, String> outside tests: {string_results}")
    print("largest files: " + ", ".join(f"{p} {n}" for n, p in sizes[:5]))


if __name__ == "__main__":
    main()
