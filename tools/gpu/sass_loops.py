#!/usr/bin/env python3
"""The instruction mix of a kernel's loops, from `cuobjdump -sass` text: for each function whose
mangled or demangled name matches REGEX, its instruction count and, for every loop (a backward
branch and the instructions from its target to it), the loop's instructions by opcode. How many
instructions a streaming kernel's hot loop issues per byte it reads is what an issue-bound kernel
is fixed by; Nsight gives the rate, this gives the instructions.

Usage: sass_loops.py SASS_FILE REGEX [--top N] [--write-functions FILE]
  SASS_FILE: cuobjdump -sass output ('-' for stdin). Runs anywhere.
"""
import argparse
import collections
import re
import subprocess
import sys

FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
TARGET_ADDRESS = re.compile(r"0x([0-9a-f]+)")
TARGET_LABEL = re.compile(r"`\((\.L_x_\d+)\)")


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return names


def parse(lines):
    """{mangled name: {'instructions': [(address, opcode, full opcode, operands)], 'labels': {label: address},
    'text': [lines]}}"""
    functions = {}
    current = None
    pending_labels = []
    for line in lines:
        m = FUNCTION.match(line)
        if m:
            current = {"instructions": [], "labels": {}, "text": [line]}
            functions[m.group(1)] = current
            pending_labels = []
            continue
        if current is None:
            continue
        current["text"].append(line)
        m = LABEL.match(line)
        if m:
            pending_labels.append(m.group(1))
            continue
        m = INSTRUCTION.search(line)
        if m:
            address = int(m.group(1), 16)
            for label in pending_labels:
                current["labels"][label] = address
            pending_labels = []
            current["instructions"].append((address, m.group(2), m.group(2) + m.group(3), m.group(4)))
    return functions


def loops(function):
    """(start, end) address ranges of backward branches, innermost (shortest) first."""
    found = set()
    for address, opcode, _, operands in function["instructions"]:
        if not opcode.startswith("BRA"):
            continue
        target = None
        m = TARGET_LABEL.search(operands)
        if m and m.group(1) in function["labels"]:
            target = function["labels"][m.group(1)]
        else:
            m = TARGET_ADDRESS.search(operands)
            if m:
                target = int(m.group(1), 16)
        if target is not None and target <= address:
            found.add((target, address))
    return sorted(found, key=lambda r: (r[1] - r[0], r[0]))


def summarise(name, function, top):
    instructions = function["instructions"]
    print(f"== {name}: {len(instructions)} instructions")
    for start, end in loops(function):
        body = [i for i in instructions if start <= i[0] <= end]
        counts = collections.Counter(i[1] for i in body)
        mix = ", ".join(f"{op} {n}" for op, n in counts.most_common(top))
        print(f"  loop 0x{start:x}..0x{end:x}: {len(body)} instructions: {mix}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sass")
    parser.add_argument("regex")
    parser.add_argument("--top", type=int, default=12, help="opcodes listed a loop")
    parser.add_argument("--write-functions", help="the matching functions' SASS into this file")
    args = parser.parse_args()
    text = sys.stdin.read().splitlines() if args.sass == "-" else open(args.sass).read().splitlines()
    functions = parse(text)
    names = list(functions)
    pattern = re.compile(args.regex)
    matched = [(m, d) for m, d in zip(names, demangle(names)) if pattern.search(m) or pattern.search(d)]
    if not matched:
        print(f"sass_loops: no function matches {args.regex!r} ({len(names)} functions)")
        return 1
    out = open(args.write_functions, "w") if args.write_functions else None
    for mangled, readable in matched:
        summarise(readable, functions[mangled], args.top)
        if out:
            out.write(f"// {readable}\n" + "\n".join(functions[mangled]["text"]) + "\n")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
