#!/usr/bin/env python3
"""Two glmserve bench-step JSON files side by side: each decode step and prefill of the first
against the second, with the three phases that differ most.
Usage: side_by_side.py FIRST.json SECOND.json TITLE"""
import json
import sys


def phases_line(pa, pb):
    diffs = sorted(((abs(pa[k] - pb.get(k, 0)), k) for k in pa), reverse=True)[:3]
    return ", ".join(f"{k} {pa[k]:.3f} / {pb.get(k, 0):.3f}" for _, k in diffs)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    first, second = (json.load(open(p)) for p in sys.argv[1:3])
    print(sys.argv[3])
    for x, y in zip(first["decode"], second["decode"]):
        print(f"  decode batch {x['batch']:>4} context {x['context']:>6}: {x['step_ms']:8.3f} / {y['step_ms']:8.3f} ms"
              f"   ({phases_line(x['eager_phases_ms'], y['eager_phases_ms'])})")
    for x, y in zip(first["prefill"], second["prefill"]):
        print(f"  prefill {x['tokens']:>6} tokens: {x['seconds'] * 1e3:8.1f} / {y['seconds'] * 1e3:8.1f} ms"
              f"   ({phases_line(x['phases_ms'], y['phases_ms'])})")


if __name__ == "__main__":
    main()
