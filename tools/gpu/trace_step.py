#!/usr/bin/env python3
"""One replayed CUDA graph step from a kernel trace (tools/gpu/kernel-trace's CSV: start_ns,
end_ns, stream, graph, graph_node, grid, block, name): the step's kernels in start order with
their device time, the gap before each (negative: it overlapped the kernels before it) and the
time it adds to the step ("own": past the end of every kernel before it), and that time summed
by kernel name against the step's span. The step is the replay of median span among the
replays of the graph with the most kernel records (bench-step replays one graph a point;
--graph picks another), or, where no kernel was graph-launched, among the eager steps (from
one --first-kernel launch to the next, of the most common length).
Usage: trace_step.py TRACE.csv [--graph ID] [--first-kernel NAME] [--json OUT] [--rows N]"""
import argparse
import csv
import json
import re
from collections import Counter


def short(name):
    name = re.sub(r'^void ', '', name.replace('(anonymous namespace)::', ''))
    name = re.sub(r'[<(].*', '', name)  # template arguments, the parameter list
    return re.sub(r'.*::', '', name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('csv')
    ap.add_argument('--graph', type=int)
    ap.add_argument('--first-kernel', default='embed_kernel', help='where an eager step starts')
    ap.add_argument('--json')
    ap.add_argument('--rows', type=int, default=500)
    args = ap.parse_args()
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    kernels = [(int(r['start_ns']), int(r['end_ns']), int(r['stream']), int(r['graph']), int(r['graph_node']),
                short(r['name'])) for r in rows]
    graphs = Counter(k[3] for k in kernels if k[3] != 0)
    if graphs:
        graph = args.graph if args.graph is not None else graphs.most_common(1)[0][0]
        mine = sorted(k for k in kernels if k[3] == graph)
        nodes = len({k[4] for k in mine})
        replays = [mine[i:i + nodes] for i in range(0, len(mine) - nodes + 1, nodes)]
    else:  # eager steps (a batch that is not graph-captured): from one first kernel to the next
        graph = 0
        mine = sorted(kernels)
        firsts = [i for i, k in enumerate(mine) if k[5] == args.first_kernel]
        segments = [mine[a:b] for a, b in zip(firsts, firsts[1:])]
        if not segments:
            raise SystemExit(f'trace_step: no graph-launched kernels and fewer than two {args.first_kernel}s')
        nodes = Counter(len(seg) for seg in segments).most_common(1)[0][0]
        replays = [seg for seg in segments if len(seg) == nodes]
    spans = [max(k[1] for k in r) - r[0][0] for r in replays]  # ns, first start to last end
    median = sorted(range(len(replays)), key=lambda i: spans[i])[len(replays) // 2]
    step = replays[median]
    t0 = step[0][0]
    span = spans[median] / 1e3  # us
    what = f'graph {graph}' if graph else f'eager steps from {args.first_kernel}'
    print(f'{what}: {len(replays)} replays of {nodes} kernels; spans {min(spans)/1e3:.1f} .. '
          f'{max(spans)/1e3:.1f} us; the median one below ({span:.1f} us)')
    # A chained kernel starts (its blocks resident, waiting) before the one ahead of it ends, so
    # its own time is what it adds to the step: from the later of its start and the end of every
    # kernel before it, to its end (0 where it ends inside another's time).
    table, by_name, busy_until = [], {}, t0
    for start, end, stream, _, _, name in step:
        own = max(0, end - max(start, busy_until)) / 1e3
        table.append({'name': name, 'stream': stream, 'start_us': (start - t0) / 1e3, 'us': (end - start) / 1e3,
                      'gap_us': (start - busy_until) / 1e3, 'own_us': own})
        busy_until = max(busy_until, end)
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += own
    print('   start      us     gap     own  stream  kernel')
    for t in table[:args.rows]:
        print(f"{t['start_us']:8.1f} {t['us']:7.2f} {t['gap_us']:+7.2f} {t['own_us']:7.2f} {t['stream']:5d}  {t['name']}")
    print(f'\nspan {span:.1f} us; the time each kernel adds to it, by name (launches, us, share):')
    for name, (count, us) in sorted(by_name.items(), key=lambda x: -x[1][1]):
        print(f'  {us:9.1f} {count:5d} {100 * us / span:6.1f}%  {name}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'graph': graph, 'replays': len(replays), 'span_us': round(span, 2), 'kernels': table,
                       'by_name': {n: {'launches': c, 'us': round(u, 2)} for n, (c, u) in by_name.items()}}, f,
                      indent=1)


if __name__ == '__main__':
    main()
