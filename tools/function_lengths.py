#!/usr/bin/env python3
"""Lists the C++ and CUDA functions longer than a limit (the house standard: about 100 lines).

Usage: tools/function_lengths.py [--limit N] [PATH ...]
  PATH: files or folders (default: the tracked src/, tests/ and benchmarks/); prints
  "LINES path:line name" for each function body over N lines (default 100), longest first, and
  exits 1 when there is any.

A function is a brace block outside any other function whose text since the previous ';', '{'
or '}' has a parameter list: "name(...) {", "name(...) const {", "name(...) : member(x) {" and
a kernel's "__launch_bounds__(...) name(...) {" count; namespaces, classes, enums and brace
initialisers do not. Lambdas and local classes count towards the function that holds them.
Comments, string literals (raw ones too) and character literals are blanked before braces are
counted, so a '{' in "{%" or '\\'' does not open anything.
"""
import argparse
import pathlib
import re
import subprocess
import sys

SUFFIXES = (".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh")
NOT_FUNCTIONS = re.compile(r"\b(namespace|struct|class|enum|union)\b")


def blank_literals(text: str) -> str:
    """The text with comments, string and character literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            delimiter = text[i + 2:text.find("(", i + 2)]
            end = text.find(")" + delimiter + '"', i)
            end = n if end < 0 else end + len(delimiter) + 2
        elif c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
            end = i + 1
        elif c in "\"'":
            end = i + 1
            while end < n and text[end] != c and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            out.append(c)
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:end]))
        i = end
    return "".join(out)


def function_name(head: str) -> str:
    """The qualified name before a function head's parameter list (after any __launch_bounds__)."""
    flat = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", " ".join(head.split()))
    match = re.search(r"((?:[A-Za-z_~][\w]*::)*(?:operator\s*[^\s(]+|~?[A-Za-z_]\w*))\s*\(", flat)
    return match.group(1) if match else flat[-60:]


def without_template_heads(flat: str) -> str:
    """`flat` without its "template <...>" parts (whose "class T" would read as a class head)."""
    while (start := flat.find("template")) >= 0 and "<" in flat[start:]:
        i, depth = flat.index("<", start), 0
        for j in range(i, len(flat)):
            depth += {"<": 1, ">": -1}.get(flat[j], 0)
            if depth == 0:
                break
        flat = flat[:start] + flat[j + 1:]
    return flat


def long_functions(path: pathlib.Path, limit: int):
    """(lines, first line, name) of each function in `path` whose body spans more than `limit` lines."""
    code = blank_literals(path.read_text(errors="replace"))
    found = []
    stack = []  # (a function or inside one, opening line, name, a function's own body)
    since = 0  # where the text before the next '{' starts
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            inside = any(entry[0] for entry in stack)
            head = code[since:i]
            is_function = False
            if not inside:
                flat = without_template_heads(" ".join(head.split()))
                # Not "= {", "return {" or "f({": brace initialisers.
                is_function = (")" in flat and not NOT_FUNCTIONS.search(flat) and
                               not re.search(r"=\s*$|\breturn\b|\(\s*$", flat))
            name = function_name(head) if is_function else ""
            stack.append((inside or is_function, line, name, is_function))
            since = i + 1
        elif c == "}":
            if stack:
                _, opened, name, is_function = stack.pop()
                if is_function and line - opened > limit:
                    found.append((line - opened, opened, name))
            since = i + 1
        elif c == ";":
            since = i + 1
    return found


def tracked_sources() -> list:
    """The sources git tracks under src/, tests/ and benchmarks/ (outside a git checkout: every one there)."""
    listed = subprocess.run(["git", "ls-files", "src", "tests", "benchmarks"], capture_output=True, text=True)
    if listed.returncode == 0:
        return [pathlib.Path(p) for p in listed.stdout.split() if p.endswith(SUFFIXES)]
    return sorted(f for d in ("src", "tests", "benchmarks") for f in pathlib.Path(d).rglob("*") if f.suffix in SUFFIXES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("paths", nargs="*")
    options = parser.parse_args()
    files = []
    for p in map(pathlib.Path, options.paths):
        files += sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES) if p.is_dir() else [p]
    rows = []
    for f in files or tracked_sources():
        rows += [(lines, f"{f}:{first}", name) for lines, first, name in long_functions(f, options.limit)]
    for lines, where, name in sorted(rows, reverse=True):
        print(f"{lines:5d} {where} {name}")
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
