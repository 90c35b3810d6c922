#!/usr/bin/env python3
"""Sums an Nsight Compute CSV (--metrics gpu__time_duration.sum[,dram__bytes_read.sum,...]) by
kernel name: launches, device microseconds, MB read and written, and the achieved TB/s; prints
the table by time and optionally writes it as JSON. Usage: ncu_kernels.py FILE.csv [--json OUT]
[--label NAME] [--top N]"""
import argparse
import csv
import json
import sys

UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6,
        "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "B": 1e-6, "KB": 1e-3, "MB": 1.0, "GB": 1e3}
METRICS = {"gpu__time_duration.sum": "us", "dram__bytes_read.sum": "MB_read", "dram__bytes_write.sum": "MB_written"}


def read_rows(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not quoted
    return list(csv.DictReader(lines))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv_file")
    parser.add_argument("--json")
    parser.add_argument("--label", default="")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    kernels = {}
    total = {"launches": 0, "us": 0.0, "MB_read": 0.0, "MB_written": 0.0}
    launches = set()
    for row in read_rows(args.csv_file):
        field = METRICS.get(row.get("Metric Name", ""))
        if not field:
            continue
        name = row["Kernel Name"]
        value = float(row["Metric Value"].replace(",", "")) * UNIT.get(row.get("Metric Unit", ""), 1.0)
        entry = kernels.setdefault(name, {"kernel": name, "launches": 0, "us": 0.0, "MB_read": 0.0, "MB_written": 0.0})
        entry[field] += value
        total[field] += value
        if field == "us":
            entry["launches"] += 1
            total["launches"] += 1
        launches.add(row["ID"])
    table = sorted(kernels.values(), key=lambda k: -k["us"])
    for k in table:
        moved = k["MB_read"] + k["MB_written"]
        k["TB_per_s"] = moved / k["us"] if k["us"] > 0 else 0.0  # MB/us = TB/s
        k["us_per_launch"] = k["us"] / max(1, k["launches"])
    print(f"== {args.label}: {total['launches']} kernels, {total['us']:.1f} us, "
          f"{total['MB_read']:.1f} MB read, {total['MB_written']:.1f} MB written")
    print(f"{'us':>9} {'n':>5} {'us/n':>7} {'MB':>9} {'TB/s':>5}  kernel")
    for k in table[: args.top]:
        print(f"{k['us']:9.1f} {k['launches']:5d} {k['us_per_launch']:7.2f} {k['MB_read'] + k['MB_written']:9.1f} "
              f"{k['TB_per_s']:5.2f}  {k['kernel'][:110]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "total": total, "kernels": table}, f, indent=1)
    return 0 if table else 1


if __name__ == "__main__":
    sys.exit(main())
