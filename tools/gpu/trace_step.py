#!/usr/bin/env python3
"""One replayed CUDA graph step from a kernel trace (tools/gpu/kernel-trace's CSV: start_ns,
end_ns, stream, graph, graph_node, grid, block, name): the step's kernels in start order with
their device time, the gap before each (negative: it overlapped the kernels before it) and the
time it adds to the step ("own": past the end of every kernel before it), and that time summed
by kernel name against the step's span. The step is the replay of median span among the
replays of the graph with the most kernel records (bench-step replays one graph a point;
--graph picks another), or, where no kernel was graph-launched, among the eager steps (from
one --first-kernel launch to the next, of the most common length). With --containing NAME, the
eager steps that launch a kernel NAME, graphs or not (a prefill step among graphed decode steps:
--containing mla_wgmma_paired_kernel).
With --against BASE.csv, the own time by kernel name of both traces' median steps side by side
(an A/B of a change, each side traced in the same call). Both list the stretches with no kernel
running (a plain graph edge, such as a join of two streams or a memcpy node, which the trace does
not list, waits out a launch there) with the kernels either side, and the waits between two
kernels of one stream while another stream's kernels ran (where the GPU was not idle, so the
first list misses them: a memset or memcpy node, or an edge from the other stream, sat there).
Usage: trace_step.py TRACE.csv [--against BASE.csv] [--graph ID] [--first-kernel NAME] [--containing NAME]
                     [--json OUT] [--rows N]"""
import argparse
import csv
import json
import re
from collections import Counter


def short(name):
    name = re.sub(r'^void ', '', name.replace('(anonymous namespace)::', ''))
    name = re.sub(r'[<(].*', '', name)  # template arguments, the parameter list
    return re.sub(r'.*::', '', name)


def load_kernels(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [(int(r['start_ns']), int(r['end_ns']), int(r['stream']), int(r['graph']), int(r['graph_node']),
             short(r['name'])) for r in rows]


def eager_segments(kernels, first_kernel, through_end):
    """The eager (not graph-launched) kernels cut at each first_kernel launch, from one to the
    next; with through_end, the last one's segment runs to the end of the trace."""
    mine = sorted(k for k in kernels if k[3] == 0)
    firsts = [i for i, k in enumerate(mine) if k[5] == first_kernel]
    return [mine[a:b] for a, b in zip(firsts, firsts[1:] + ([len(mine)] if through_end else []))]


def replays_of(kernels, graph_id, first_kernel, containing=None):
    """(graph, replays): a graph's replays, or the eager steps where none was graph-launched (or
    those launching a kernel `containing`)."""
    if containing:
        steps = [seg for seg in eager_segments(kernels, first_kernel, True) if any(k[5] == containing for k in seg)]
        if not steps:
            raise SystemExit(f'trace_step: no eager step from {first_kernel} launches {containing}')
        return 0, steps
    graphs = Counter(k[3] for k in kernels if k[3] != 0)
    if graphs:
        graph = graph_id if graph_id is not None else graphs.most_common(1)[0][0]
        mine = sorted(k for k in kernels if k[3] == graph)
        nodes = len({k[4] for k in mine})
        return graph, [mine[i:i + nodes] for i in range(0, len(mine) - nodes + 1, nodes)]
    segments = eager_segments(kernels, first_kernel, False)  # a batch that is not graph-captured
    if not segments:
        raise SystemExit(f'trace_step: no graph-launched kernels and fewer than two {first_kernel}s')
    nodes = Counter(len(seg) for seg in segments).most_common(1)[0][0]
    return 0, [seg for seg in segments if len(seg) == nodes]


def attribute(step):
    """The step's kernels with the time each adds, and that time by kernel name.

    A chained kernel starts (its blocks resident, waiting) before the one ahead of it ends, so
    its own time is what it adds to the step: from the later of its start and the end of every
    kernel before it, to its end (0 where it ends inside another's time)."""
    t0 = step[0][0]
    table, by_name, busy_until = [], {}, t0
    for start, end, stream, _, _, name in step:
        own = max(0, end - max(start, busy_until)) / 1e3
        table.append({'name': name, 'stream': stream, 'start_us': (start - t0) / 1e3, 'us': (end - start) / 1e3,
                      'gap_us': (start - busy_until) / 1e3, 'own_us': own})
        busy_until = max(busy_until, end)
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += own
    return table, by_name


def idle_stretches(table, least_us=0.3):
    """The stretches of the step with no kernel running: (us, kernel before, kernel after)."""
    return [(t['gap_us'], table[i - 1]['name'], t['name']) for i, t in enumerate(table)
            if i > 0 and t['gap_us'] > least_us]


def stream_waits(table, least_us=1.0, most_us=50.0):
    """Waits of least_us to most_us between consecutive kernels of one stream while another
    stream's kernels ran: (us, stream, kernel before, kernel after, start of the later one). A
    replayed graph's branches may share a stream, so a wait may also be a side branch idling
    between its kernels (the shared expert's stream idles a layer's length, past most_us)."""
    last_on, waits = {}, []
    for t in table:
        before = last_on.get(t['stream'])
        if before is not None:
            wait = t['start_us'] - (before['start_us'] + before['us'])
            if least_us < wait <= most_us and t['gap_us'] <= 0.3:  # a stretch the idle list does not already show
                waits.append((wait, t['stream'], before['name'], t['name'], t['start_us']))
        last_on[t['stream']] = t
    return waits


def print_idle(label, table):
    idle = idle_stretches(table)
    print(f'\n{label}: no kernel running {sum(u for u, _, _ in idle):.1f} us in {len(idle)} stretches over 0.3 us')
    for us, before, after in idle:
        print(f'  {us:7.2f}  {before} -> {after}')
    waits = stream_waits(table)
    if waits:
        print(f'{label}: waits within a stream while another ran, {sum(w[0] for w in waits):.1f} us in '
              f'{len(waits)} of 1 to 50 us')
        for us, stream, before, after, at in waits:
            print(f'  {us:7.2f}  stream {stream} at {at:8.1f}: {before} -> {after}')


def median_step(path, graph_id, first_kernel, containing=None):
    graph, replays = replays_of(load_kernels(path), graph_id, first_kernel, containing)
    spans = [max(k[1] for k in r) - r[0][0] for r in replays]  # ns, first start to last end
    median = sorted(range(len(replays)), key=lambda i: spans[i])[len(replays) // 2]
    what = f'graph {graph}' if graph else f'eager steps from {first_kernel}' + (f' with {containing}' if containing else '')
    print(f'{path}: {what}: {len(replays)} replays of {len(replays[median])} kernels; spans '
          f'{min(spans)/1e3:.1f} .. {max(spans)/1e3:.1f} us; the median one ({spans[median]/1e3:.1f} us)')
    return graph, len(replays), replays[median], spans[median] / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('csv')
    ap.add_argument('--graph', type=int)
    ap.add_argument('--first-kernel', default='embed_kernel', help='where an eager step starts')
    ap.add_argument('--containing', help='the eager steps that launch this kernel (a prefill among graphed decodes)')
    ap.add_argument('--against', help='a second trace (the base of an A/B): own time by name side by side')
    ap.add_argument('--json')
    ap.add_argument('--rows', type=int, default=500)
    args = ap.parse_args()
    graph, replays, step, span = median_step(args.csv, args.graph, args.first_kernel, args.containing)
    table, by_name = attribute(step)
    if args.against:
        _, _, base_step, base_span = median_step(args.against, args.graph, args.first_kernel, args.containing)
        base_table, base_by_name = attribute(base_step)
        print(f'\nown time by kernel, us: {args.against} | {args.csv} | difference')
        names = set(by_name) | set(base_by_name)
        rows = [(base_by_name.get(n, [0, 0.0])[1], by_name.get(n, [0, 0.0])[1], n) for n in names]
        for base_us, us, name in sorted(rows, key=lambda r: -abs(r[1] - r[0])):
            print(f'  {base_us:9.1f} {us:9.1f} {us - base_us:+8.1f}  {name}')
        print(f'  {base_span:9.1f} {span:9.1f} {span - base_span:+8.1f}  the step')
        print_idle(args.against, base_table)
        print_idle(args.csv, table)
        return
    print('   start      us     gap     own  stream  kernel')
    for t in table[:args.rows]:
        print(f"{t['start_us']:8.1f} {t['us']:7.2f} {t['gap_us']:+7.2f} {t['own_us']:7.2f} {t['stream']:5d}  {t['name']}")
    print(f'\nspan {span:.1f} us; the time each kernel adds to it, by name (launches, us, share):')
    for name, (count, us) in sorted(by_name.items(), key=lambda x: -x[1][1]):
        print(f'  {us:9.1f} {count:5d} {100 * us / span:6.1f}%  {name}')
    print_idle(args.csv, table)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'graph': graph, 'replays': replays, 'span_us': round(span, 2), 'kernels': table,
                       'by_name': {n: {'launches': c, 'us': round(u, 2)} for n, (c, u) in by_name.items()}}, f,
                      indent=1)


if __name__ == '__main__':
    main()
