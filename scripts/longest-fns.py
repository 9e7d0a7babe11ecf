#!/usr/bin/env python3
"""Print the longest non-test Rust functions under a folder (default `src`).

Usage:
    scripts/longest-fns.py [DIR] [--top N] [--max L]

Output: one line per function, longest first, as

    LINES PATH:LINE NAME

Rules
-----
* A function is every `fn NAME` item with a body: free functions, methods,
  associated and nested functions, whatever qualifiers come before `fn`
  (`pub(crate)`, `const`, `async`, `unsafe`, `extern "C"`). Declarations
  without a body (trait methods without a default, `extern { fn f(); }`),
  function-pointer types (`fn(u32) -> u32`), closures and `macro_rules!`
  templates (`fn $name`) are not functions here.
* LINES counts from the line holding the `fn` keyword to the line of the
  body's closing brace, both included; attributes and doc comments above the
  function are not counted. A nested function is counted on its own and also
  inside its parent.
* Test code is left out: a function marked `#[test]` (or any attribute whose
  path ends in `test`, such as `#[tokio::test]`, and `#[bench]`), any item
  under `#[cfg(test)]` (a `cfg` that names `test` outside a `not(...)`), and
  everything inside such a module or `impl` block, including out-of-line
  modules (`#[cfg(test)] mod tests;` excludes `tests.rs` / `tests/mod.rs` and
  the modules below it; `#[path = "..."]` is followed). A file whose first
  inner attribute is `#![cfg(test)]` is test code as a whole.
* Braces, `fn` and attributes inside comments (`//`, nested `/* */`), string
  literals (`"..."`, `b"..."`, raw `r#"..."#`) and char literals (`'{'`,
  `'\\''`) are ignored; lifetimes (`'a`) are not mistaken for char literals.
  This is a lexer, not a parser: it is right for ordinary code, and code that
  defeats it (braces produced by macros, say) is not expected in this crate.

`--top N` prints the N longest (default 5; 0 prints all). `--max L` also
checks a limit: every function longer than L lines is printed (under a
heading, after the top list) and the exit status is 1; with none over L the
status is 0.
"""

import argparse
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TOKEN = re.compile(r"#!?\[|[A-Za-z_][A-Za-z0-9_]*|\$[A-Za-z_][A-Za-z0-9_]*|[{}()\[\];]|\S")


def blank(src):
    """Return `src` with comments and string/char literals replaced by spaces.

    Newlines are kept and every other character keeps its offset, so offsets and
    line numbers in the result are those of the source.
    """
    out = list(src)
    n = len(src)
    i = 0

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    def ident_char(c):
        return c.isalnum() or c == "_"

    while i < n:
        c = src[i]
        nxt = src[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c in "rb" and (i == 0 or not ident_char(src[i - 1])):
            # Raw strings r"..", r#".."#, br#".."#; byte strings b"..".
            m = re.compile(r'b?r(#*)"').match(src, i)
            if m:
                end = src.find('"' + m.group(1), m.end())
                end = n if end < 0 else end + 1 + len(m.group(1))
                wipe(i, end)
                i = end
            elif c == "b" and nxt in "\"'":
                wipe(i, i + 1)
                i += 1  # the literal itself is handled at the quote
            else:
                m = IDENT.match(src, i)
                i = m.end()
        elif ident_char(c):
            m = IDENT.match(src, i)
            i = m.end() if m else i + 1
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            # Char literal ('x', '\n', '\u{7f}', '\'') or lifetime/label ('a).
            if nxt == "\\":
                j = i + 2
                while j < n and src[j] != "'":
                    j += 2 if src[j] == "\\" else 1
                wipe(i, j + 1)
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":
                wipe(i, i + 3)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def is_test_attr(text):
    """Whether an attribute (text between `#[` and `]`) marks test-only code."""
    body = text.strip()
    path = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", body)
    path = path.group(0) if path else ""
    if path in ("test", "bench") or path.endswith("::test"):
        return True
    if path == "cfg":
        # `test` named outside any not(...): drop the not(...) groups first.
        rest = body[len(path):]
        prev = None
        while prev != rest:
            prev = rest
            rest = re.sub(r"\bnot\s*\([^()]*\)", "", rest)
        return re.search(r"\btest\b", rest) is not None
    return False


def path_attr(text):
    """The file named by a `#[path = "..."]` attribute, if it is one."""
    m = re.match(r'\s*path\s*=\s*"([^"]*)"', text)
    return m.group(1) if m else None


def scan(path, src):
    """Parse one file.

    Returns (fns, mods, file_is_test): fns is a list of
    (lines, line, name, is_test); mods is a list of (resolved candidate paths,
    is_test) for the out-of-line modules the file declares.
    """
    text = blank(src)
    line_starts = [0]
    for k, ch in enumerate(src):
        if ch == "\n":
            line_starts.append(k + 1)

    def line_of(off):
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_starts[mid] <= off:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    toks = [(m.group(0), m.start()) for m in TOKEN.finditer(text)]

    base = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    own_dir = base if stem in ("mod", "lib", "main") else os.path.join(base, stem)

    fns, mods = [], []
    file_test = False
    # Scope stack entries: (is_test, fn_record or None, inline mod name or None)
    stack = [(False, None, None)]
    attrs = []  # raw attribute texts pending for the next item
    pending_fn = None  # (name, line, is_test, bracket depth at `fn`)
    pending_mod = None  # (name, is_test, path attr)
    brackets = 0  # depth of ( and [ within the current brace scope
    saw_item = False
    k = 0
    while k < len(toks):
        tok, off = toks[k]
        cur_test = stack[-1][0]
        if tok in ("#[", "#!["):
            depth, j = 1, k + 1
            while j < len(toks) and depth:
                if toks[j][0] in ("[", "#[", "#!["):
                    depth += 1
                elif toks[j][0] == "]":
                    depth -= 1
                j += 1
            end = toks[j - 1][1] if j - 1 < len(toks) else len(src)
            raw = src[off + len(tok):end]
            if tok == "#![":
                if len(stack) == 1 and not saw_item and is_test_attr(raw):
                    file_test = True
            else:
                attrs.append(raw)
            k = j
            continue
        saw_item = True
        if tok == "fn" and k + 1 < len(toks) and IDENT.fullmatch(toks[k + 1][0]):
            test = cur_test or file_test or any(is_test_attr(a) for a in attrs)
            pending_fn = (toks[k + 1][0], line_of(off), test, brackets)
            k += 2
            continue
        if tok == "mod" and k + 2 < len(toks) and IDENT.fullmatch(toks[k + 1][0]):
            test = cur_test or any(is_test_attr(a) for a in attrs)
            pa = next((p for p in map(path_attr, attrs) if p), None)
            pending_mod = (toks[k + 1][0], test, pa)
            k += 2
            continue
        if tok in ("(", "["):
            brackets += 1
        elif tok in (")", "]"):
            brackets -= 1
        elif tok == "{":
            if pending_fn and pending_fn[3] == brackets:
                name, line, test, _ = pending_fn
                stack.append((test, [name, line, test], None))
                pending_fn = None
            elif pending_mod:
                stack.append((pending_mod[1], None, pending_mod[0]))
                pending_mod = None
            else:
                test = cur_test or any(is_test_attr(a) for a in attrs)
                stack.append((test, None, None))
            stack[-1] = stack[-1] + (brackets,)
            brackets = 0
            attrs = []
        elif tok == "}":
            if len(stack) > 1:
                entry = stack.pop()
                brackets = entry[3]
                if entry[1] is not None:
                    name, line, test = entry[1]
                    end = line_of(off)
                    fns.append((end - line + 1, line, name, test))
            attrs = []
        elif tok == ";":
            if pending_fn and pending_fn[3] == brackets:
                pending_fn = None
            if pending_mod:
                name, test, pa = pending_mod
                inline = [e[2] for e in stack if e[2]]
                if pa:
                    cands = [os.path.normpath(os.path.join(base, *inline, pa))]
                else:
                    d = os.path.join(own_dir, *inline)
                    cands = [os.path.join(d, name + ".rs"), os.path.join(d, name, "mod.rs")]
                mods.append(([os.path.normpath(c) for c in cands], test or file_test))
                pending_mod = None
            if brackets == 0:
                attrs = []
        k += 1
    return fns, mods, file_test


def collect(root):
    """All functions under `root` as (lines, path, line, name, is_test)."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith(".rs"):
                p = os.path.normpath(os.path.join(dirpath, f))
                with open(p, encoding="utf-8") as fh:
                    files[p] = scan(p, fh.read())
    # A file is test code if it says so or any module declaring it is test code
    # (or sits in a test file); propagate down the module tree to a fixpoint.
    test_files = {p for p, (_, _, ft) in files.items() if ft}
    changed = True
    while changed:
        changed = False
        for p, (_, mods, _) in files.items():
            for cands, test in mods:
                if test or p in test_files:
                    for c in cands:
                        if c in files and c not in test_files:
                            test_files.add(c)
                            changed = True
    out = []
    for p, (fns, _, _) in files.items():
        for lines, line, name, test in fns:
            out.append((lines, p, line, name, test or p in test_files))
    return out


def main():
    ap = argparse.ArgumentParser(description="Print the longest non-test Rust functions.")
    ap.add_argument("dir", nargs="?", default="src", help="folder to walk (default: src)")
    ap.add_argument("--top", type=int, default=5, help="how many to print (default 5, 0 = all)")
    ap.add_argument("--max", type=int, default=None, help="exit 1 if any function is longer than this")
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        ap.error(f"not a folder: {args.dir}")

    fns = [f for f in collect(args.dir) if not f[4]]
    fns.sort(key=lambda f: (-f[0], f[1], f[2]))
    shown = fns if args.top <= 0 else fns[: args.top]
    for lines, p, line, name, _ in shown:
        print(f"{lines} {p}:{line} {name}")
    if args.max is not None:
        over = [f for f in fns if f[0] > args.max]
        if over:
            print(f"\n{len(over)} function(s) longer than {args.max} lines:")
            for lines, p, line, name, _ in over:
                print(f"{lines} {p}:{line} {name}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
