#!/usr/bin/env python3
"""Per kernel launch in an Nsight Compute text report (tools/gpu/profile-kernel's
ncu-kernel-NAME.txt): its duration, the DRAM bytes it read, the warp instructions it issued and
their ratio, warp instructions per KB read. A streaming kernel that must reach the memory bound
with about 2 instructions a cycle per SM can afford some 130 a KB on the H200 (132 SMs at
1.98 GHz against 4 TB/s), so the ratio says whether the issue rate or the loads hold it back.
Usage: ncu_instructions_per_byte.py REPORT.txt"""
import re
import sys

UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "us": 1e-6, "ms": 1e-3, "ns": 1e-9, "s": 1.0}


def value(line):
    """The number at the end of an ncu metric line, with its unit applied when it has one."""
    fields = line.split()
    number = float(fields[-1].replace(",", ""))
    return number * UNITS.get(fields[-2], 1.0)


def launches(lines):
    current = None
    for line in lines:
        header = re.match(r"\s+(?:void )?(\S.*?)\(.*\) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Context", line)
        if header:
            if current:
                yield current
            current = {"kernel": header.group(1)}
            continue
        if current is None:
            continue
        if "smsp__inst_executed.sum" in line:
            current["instructions"] = value(line)
        elif "dram__bytes_read.sum" in line:
            current["dram_read_bytes"] = value(line)
        elif re.match(r"\s+Duration\s", line):
            current["seconds"] = value(line)
    if current:
        yield current


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], errors="replace") as f:
        lines = f.read().splitlines()
    print(f"{'kernel':60} {'us':>9} {'MB read':>9} {'TB/s':>6} {'warp inst':>12} {'inst/KB':>8}")
    for k in launches(lines):
        seconds, read, inst = k.get("seconds"), k.get("dram_read_bytes"), k.get("instructions")
        us = f"{seconds * 1e6:9.2f}" if seconds else f"{'-':>9}"
        mb = f"{read / 1e6:9.2f}" if read else f"{'-':>9}"
        rate = f"{read / seconds / 1e12:6.2f}" if read and seconds else f"{'-':>6}"
        count = f"{inst:12,.0f}" if inst else f"{'-':>12}"
        per_kb = f"{inst / (read / 1e3):8.1f}" if inst and read else f"{'-':>8}"
        print(f"{k['kernel'][:60]:60} {us} {mb} {rate} {count} {per_kb}")


if __name__ == "__main__":
    main()
