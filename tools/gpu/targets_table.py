#!/usr/bin/env python3
"""Run anywhere on what tools/gpu/targets left: every speed target of issues 17 and 19 with its
measured figure, its ratio to the target and met or not, as a markdown table (for
docs/performance.md) and, with --record, a bench/results record holding the runs.
Usage: tools/gpu/targets_table.py DIR [--record RESULT.json --revision REV]
DIR holds bf16.json, mxfp4.json and fp8.json (bench-step at GLM-5.2 width, 5 layers; the
repeated rounds as bf16-2.json, ...), rank.json (the EP8 rank at 78 layers) and rank-fp8.json
(the same rank with FP8 linear layers, which fits an H100); a missing file leaves its targets
unmeasured."""
import argparse
import datetime
import glob
import json
import os
import re

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "configs", "glm-5.2.json")


def attention_flops(tokens, layers, config):
    """FLOPs of a prefill's sparse attention from position 0: each token scores and sums its
    selected rows (min(position + 1, index_topk)) over every head, latent + rope then latent."""
    topk = config["index_topk"]
    rows = sum(min(i + 1, topk) for i in range(tokens))
    per_row = config["num_attention_heads"] * (2 * config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 2
    return rows * per_row * layers


def runs(directory, name):
    """Every round of one configuration: NAME.json, NAME-2.json, ... (not rank-fp8.json for rank)"""
    rounds = [p for p in glob.glob(os.path.join(directory, f"{name}-*.json"))
              if re.fullmatch(re.escape(name) + r"-\d+\.json", os.path.basename(p))]
    paths = [os.path.join(directory, f"{name}.json")] + sorted(rounds, key=lambda p: int(p[:-5].rsplit("-", 1)[1]))
    return [json.load(open(p)) for p in paths if os.path.exists(p)]


def prefill(run, tokens):
    return next((p for p in run["prefill"] if p["tokens"] == tokens), None)


def decode(run, batch, context=2048):
    return next((d for d in run["decode"] if d["batch"] == batch and d["context"] == context), None)


def rows_for(directory, config):
    """(target, measured, ratio to the target, met) for each target, from the runs found."""
    bf16, mxfp4, fp8, rank, rank_fp8 = (runs(directory, n) for n in ("bf16", "mxfp4", "fp8", "rank", "rank-fp8"))
    rows = []

    def at_most(target, limit, values, unit=" ms", digits=1):
        if not values:
            rows.append((target, "not measured", "", "-"))
            return
        worst = max(values)
        shown = " / ".join(f"{v:.{digits}f}" for v in values)
        rows.append((target, f"{shown}{unit}", f"{worst / limit:.2f}x", "yes" if worst <= limit else "no"))

    ms = lambda p: p["seconds"] * 1e3
    at_most("prefill 8192 <= 100 ms with bf16 weights", 100,
            [ms(prefill(r, 8192)) for r in bf16 if prefill(r, 8192)])
    at_most("prefill 8192 <= 80 ms with FP8 linear layers", 80,
            [ms(prefill(r, 8192)) for r in fp8 if prefill(r, 8192)])
    for label, group in (("bf16 experts", bf16), ("MXFP4 experts", mxfp4), ("FP8", fp8)):
        rates = []
        for r in group:
            p = prefill(r, 8192)
            if p:
                seconds = p["phases_ms"]["attention.core"] / 1e3
                rates.append(attention_flops(8192, r["num_layers"], config) / seconds / r["bf16_gemm_flops_per_s"])
        if rates:
            shown = " / ".join(f"{v:.1%}" for v in rates)
            rows.append((f"sparse prefill attention >= 50% of the bf16 GEMM rate ({label}, 8192)", shown,
                         f"{min(rates) / 0.5:.2f}x", "yes" if min(rates) >= 0.5 else "no"))
        else:
            rows.append((f"sparse prefill attention >= 50% of the bf16 GEMM rate ({label}, 8192)", "not measured", "",
                         "-"))
    pairs = [(ms(prefill(m, 2048)), ms(prefill(b, 2048))) for m, b in zip(mxfp4, bf16)
             if prefill(m, 2048) and prefill(b, 2048)]
    if pairs:
        ratios = [m / b for m, b in pairs]
        shown = " / ".join(f"{m:.1f} against {b:.1f}" for m, b in pairs) + " ms"
        rows.append(("MXFP4 prefill 2048 no slower than bf16", shown, f"{max(ratios):.2f}x",
                     "yes" if max(ratios) <= 1.0 else "no"))
    else:
        rows.append(("MXFP4 prefill 2048 no slower than bf16", "not measured", "", "-"))
    for batch, record in ((1, 1.43), (64, 1.23)):
        ratios = [decode(r, batch)["ratio_to_bound"] for r in bf16 if decode(r, batch)]
        at_most(f"bf16 decode batch {batch} no worse than the record ({record}x its bound)", record, ratios,
                "x the bound", 2)
    for batch in (1, 64):
        ratios = [decode(r, batch)["ratio_to_bound"] for r in rank if decode(r, batch)]
        at_most(f"EP8 rank at 78 layers, decode batch {batch} within 1.3x of its bound", 1.3, ratios,
                "x the bound", 2)
    ratios = [decode(r, 1)["ratio_to_bound"] for r in rank_fp8 if decode(r, 1)]
    at_most("EP8 rank at 78 layers with FP8 linear layers, decode batch 1 within 1.3x of its bound", 1.3, ratios,
            "x the bound", 2)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--record")
    parser.add_argument("--revision", default="unknown")
    args = parser.parse_args()
    config = json.load(open(CONFIG))
    rows = rows_for(args.directory, config)
    print("| target | measured | worst against the target | met |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.record:
        record = {
            "benchmark": "targets",
            "command": "tools/gpu/targets (device run), then tools/gpu/targets_table.py",
            "git_revision": args.revision,
            "date": datetime.date.today().isoformat(),
            "targets": [dict(zip(("target", "measured", "worst_against_target", "met"), r)) for r in rows],
            "runs": {os.path.basename(p)[:-5]: json.load(open(p))
                     for p in sorted(glob.glob(os.path.join(args.directory, "*.json")))},
        }
        json.dump(record, open(args.record, "w"), indent=1)
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
