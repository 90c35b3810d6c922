#!/usr/bin/env python3
"""Each eager phase of a `glmserve bench-step` decode point against the bytes that phase must
read: where a step's distance from its bound lies. Reads the bench-step JSON (its config path,
layer count, expert format, cache dtype and simulated rank) and prints, per decode point, a table
of phase, eager ms, bound ms, their ratio and their difference.

The bytes follow the planner's rules (src/plan: model/inventory.cpp's parameter counts,
plan/parallel.cpp's tensor-parallel split, plan/roofline.cpp's cache rows): bf16 linear layers
(the fp32 router at 4 bytes a value); q_a and kv_a whole on every rank, q_b, kv_b, o_proj, the
dense MLP and the shared expert split over tensor-parallel ranks; the indexer's weights on its
full layers, whole; the routed experts the step's batch x dp tokens touch, over the world; the
cache rows each sequence attends (latent + rope) and the indexer keys it scores; lm_head whole.
Norms, gather, scatter and combine move activations only (bound 0). Eager phases include each
phase's launch gaps, so small phases show large ratios; the graphed step is faster in all.
The bounds' sum is checked against the JSON's own bound (bytes_moved): a step with FP8 linear
layers is refused, as the phase of each FP8 matrix is not known here.
A bench/results record that keeps a bench-step run under a key (with the fields above) is read
with --key NAME.
Usage: phase_bounds.py BENCH_STEP.json [--config CONFIG.json] [--key NAME]"""
import argparse
import json
import os
import re
import sys

BF16 = 2.0


def expert_value_bytes(fmt):
    return {"bf16": 2.0, "fp8": 1.0 + 4.0 / (128.0 * 128.0), "mxfp4": 4.25 / 8.0, "mxfp6": 6.25 / 8.0}[fmt]


def full_indexer_layers(c, layers):
    """Layers whose indexer scores (io/model_config.cpp's rules for the keys GLM-5.2 uses)."""
    if "indexer_types" in c:
        return [t == "full" for t in c["indexer_types"][:layers]]
    if "index_topk_pattern" in c:
        p = c["index_topk_pattern"]
        return [(p[i] == "F") if isinstance(p, str) else (p[i] == "full") for i in range(layers)]
    freq, offset = c.get("index_topk_freq", 1), c.get("index_skip_topk_offset", 0)
    return [max(i - offset + 1, 0) % freq == 0 for i in range(layers)]


def moe_layers(c, layers):
    if "mlp_layer_types" in c:
        return [t == "sparse" for t in c["mlp_layer_types"][:layers]]
    return [i >= c.get("first_k_dense_replace", 0) for i in range(layers)]


def rank_shape(bench):
    """(tp, dp) of the simulated rank, (1, 1) without one."""
    sim = bench.get("simulated_rank")
    if not sim:
        return 1, 1
    shard = sim.get("shard", "")
    tp = re.search(r"tp \d+/(\d+)", shard)
    dp = re.search(r"dp \d+/(\d+)", shard)
    return (int(tp.group(1)) if tp else 1), (int(dp.group(1)) if dp else 1)


def phase_bytes(c, bench, batch, context):
    layers = bench["num_layers"]
    tp, dp = rank_shape(bench)
    world = tp * dp
    h, heads, E, k = c["hidden_size"], c["num_attention_heads"], c["n_routed_experts"], c["num_experts_per_tok"]
    q_lora, L, rd = c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"]
    nope, v = c["qk_nope_head_dim"], c["v_head_dim"]
    IH, ID = c["index_n_heads"], c["index_head_dim"]
    full, moe = full_indexer_layers(c, layers), moe_layers(c, layers)
    n_full, n_moe = sum(full), sum(moe)
    kv_fp8 = bench.get("kv_cache_dtype", "auto") in ("fp8", "fp8_e4m3")
    row = (L + rd + 4 * ((L + 127) // 128) + 2 * rd) if kv_fp8 else (L + rd) * BF16  # approximate fp8 row
    key = (ID + 4.0) if kv_fp8 else ID * BF16
    attended = min(context, c["index_topk"]) if c.get("index_topk", 0) > 0 else context
    touched = E * (1.0 - (1.0 - k / E) ** (batch * dp))
    b = {}
    b["attention.projections"] = layers * BF16 * (h * q_lora + h * (L + rd) + q_lora * heads * (nope + rd) / tp) + \
        n_full * BF16 * (q_lora * IH * ID + h * ID + h * IH)
    b["attention.absorb"] = layers * BF16 * L * heads * nope / tp
    b["attention.core"] = layers * batch * attended * row
    b["attention.indexer"] = n_full * batch * context * key
    b["attention.output"] = layers * BF16 * (L * heads * v + heads * v * h) / tp
    b["dense_mlp"] = (layers - n_moe) * BF16 * 3 * h * c["intermediate_size"] / tp
    b["moe.shared"] = n_moe * BF16 * 3 * h * c["moe_intermediate_size"] * c.get("n_shared_experts", 1) / tp
    b["moe.routing"] = n_moe * 4.0 * (E * h + E)
    b["moe.experts"] = n_moe * touched / world * 3 * h * c["moe_intermediate_size"] * \
        expert_value_bytes(bench["expert_format"])
    b["head"] = BF16 * c["vocab_size"] * h
    b["embed"] = BF16 * batch * h
    return b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench_json")
    ap.add_argument("--config", help="the model config (default: the JSON's, from the repository root)")
    ap.add_argument("--key", help="the bench-step run under this key of a bench/results record")
    args = ap.parse_args()
    bench = json.load(open(args.bench_json))
    if args.key:
        if args.key not in bench:
            sys.exit(f"phase_bounds: no key {args.key!r} in {args.bench_json} (keys: {', '.join(bench)})")
        bench = bench[args.key]
    missing = [k for k in ("num_layers", "copy_bandwidth_bytes_per_s", "expert_format") if k not in bench]
    if missing:
        sys.exit(f"phase_bounds: {args.bench_json} is not a bench-step run (no {', '.join(missing)}); "
                 "a record that keeps one under a key takes --key")
    if bench.get("fp8_linear_matrices", 0):
        sys.exit("phase_bounds: this step has FP8 linear layers; their phases' bytes are not known here")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config_path = args.config or os.path.join(root, bench["config"])
    c = json.load(open(config_path))
    bandwidth = bench["copy_bandwidth_bytes_per_s"]
    for point in bench.get("decode", []):
        eager = point.get("eager_phases_ms", {})
        bounds = {name: b / bandwidth * 1e3 for name, b in
                  phase_bytes(c, bench, point["batch"], point["context"]).items()}
        total = sum(bounds.values())
        print(f"decode batch {point['batch']} context {point['context']}: step {point['step_ms']:.3f} ms, "
              f"bound {point['bound_ms']:.3f} ms (the phases' bounds sum to {total:.3f} ms, "
              f"{total / point['bound_ms'] - 1:+.1%}); eager phases sum to {sum(eager.values()):.3f} ms")
        print(f"  {'phase':24} {'eager ms':>9} {'bound ms':>9} {'x':>7} {'over ms':>8}")
        for name in sorted(set(eager) | set(bounds), key=lambda n: -(eager.get(n, 0) - bounds.get(n, 0))):
            e, bd = eager.get(name, 0.0), bounds.get(name, 0.0)
            ratio = f"{e / bd:7.2f}" if bd >= 1e-3 else f"{'-':>7}"  # under a microsecond: activations only
            print(f"  {name:24} {e:9.3f} {bd:9.3f} {ratio} {e - bd:8.3f}")


if __name__ == "__main__":
    main()
