#!/usr/bin/env python3
"""Lists the panic sites (`unwrap()`, `expect(`, `panic!`, `unreachable!`,
`unimplemented!`, `todo!`, `assert!`/`assert_eq!`/`assert_ne!`, not
`debug_assert!`) outside test code in a Rust source folder (default `src`).

Test code is every item marked `#[cfg(test)]` or `#[test]` (a module, a
function, a `use`) and every file named `tests.rs` (declared
`#[cfg(test)] mod tests;`). Comment lines are skipped. Prints the total of
sites, how many lie outside test code, then each of those as `path:line: code`.

Usage: python3 scripts/panic-sites.py [folder]
"""
import os
import re
import sys

PAT = re.compile(r"\.unwrap\(\)|\.expect\(|panic!|unreachable!|unimplemented!|todo!|(?<!debug_)\bassert(_eq|_ne)?!")


def test_spans(lines):
    """(first, last) line index of every item marked #[cfg(test)] or #[test]."""
    spans, i = [], 0
    while i < len(lines):
        if re.match(r"\s*#\[(cfg\(test\)|test)\]", lines[i]):
            j = i + 1
            while j < len(lines) and re.match(r"\s*#\[", lines[j]):
                j += 1
            depth, started, k = 0, False, j
            while k < len(lines):
                depth += lines[k].count("{") - lines[k].count("}")
                started |= "{" in lines[k]
                if (started and depth <= 0) or (not started and lines[k].rstrip().endswith(";")):
                    break
                k += 1
            spans.append((i, k))
            i = k + 1
            continue
        i += 1
    return spans


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    total, outside = 0, []
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            lines = open(path, encoding="utf-8").read().split("\n")
            hits = [n for n, l in enumerate(lines) if PAT.search(l) and not l.strip().startswith("//")]
            total += len(hits)
            if f == "tests.rs":
                continue
            spans = test_spans(lines)
            outside += [f"{path}:{n + 1}: {lines[n].strip()[:100]}" for n in hits if not any(a <= n <= b for a, b in spans)]
    print(f"{total} sites, {len(outside)} outside test code")
    print("\n".join(outside))


if __name__ == "__main__":
    main()
