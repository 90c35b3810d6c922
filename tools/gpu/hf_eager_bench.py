"""transformers 5.17 GlmMoeDsaForCausalLM, eager, bf16, random weights, on the GPU machine:
decode step time at the given batch sizes after a prompt of --context tokens, and prefill
tokens/s, for the same config glmserve bench-step runs (the peer in tools/gpu/bench-cuda).
Usage: python3 tools/gpu/hf_eager_bench.py CONFIG.json OUT.json [--batch 1,8] [--context 2048]
       [--prefill 2048,8192] [--steps 5]"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--prefill", default="2048,8192")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()

    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    with open(args.config) as f:
        cfgd = json.load(f)
    for key in ("architectures", "model_type"):
        cfgd.pop(key, None)
    config = GlmMoeDsaConfig(**cfgd)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = GlmMoeDsaForCausalLM(config).eval()
    torch.cuda.synchronize()
    print(f"model made in {time.time() - t0:.1f} s, "
          f"{sum(p.numel() for p in model.parameters()) * 2 / 1e9:.1f} GB", flush=True)
    vocab = config.vocab_size
    result = {"benchmark": "transformers-eager", "config": args.config, "layers": config.num_hidden_layers,
              "decode": [], "prefill": []}

    def timed(fn, reps):
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.time()
            out = fn()
            torch.cuda.synchronize()
            times.append(time.time() - start)
        return out, times

    with torch.no_grad():
        for tokens in [int(v) for v in args.prefill.split(",") if v]:
            ids = torch.randint(0, vocab, (1, tokens), device="cuda")
            try:
                model(ids, use_cache=False)
                _, times = timed(lambda: model(ids, use_cache=False), 2)
                best = min(times)
                result["prefill"].append({"tokens": tokens, "seconds": best, "tokens_per_s": tokens / best})
                print(f"prefill {tokens}: {best * 1e3:.1f} ms, {tokens / best:.0f} tok/s", flush=True)
            except torch.OutOfMemoryError as error:
                result["prefill"].append({"tokens": tokens, "error": "out of memory"})
                print(f"prefill {tokens}: out of memory ({error})", flush=True)
            torch.cuda.empty_cache()
        for batch in [int(v) for v in args.batch.split(",") if v]:
            ids = torch.randint(0, vocab, (batch, args.context), device="cuda")
            try:
                out = model(ids, use_cache=True)
                cache = out.past_key_values
                step_ids = torch.randint(0, vocab, (batch, 1), device="cuda")
                times = []
                for step in range(args.steps + 1):
                    torch.cuda.synchronize()
                    start = time.time()
                    out = model(step_ids, past_key_values=cache, use_cache=True)
                    torch.cuda.synchronize()
                    if step > 0:  # the first step warms up
                        times.append(time.time() - start)
                    cache = out.past_key_values
                times.sort()
                median = times[len(times) // 2]
                result["decode"].append({"batch": batch, "context": args.context, "step_ms": median * 1e3,
                                         "tokens_per_s": batch / median})
                print(f"decode batch {batch} context {args.context}: {median * 1e3:.1f} ms/step", flush=True)
            except torch.OutOfMemoryError:
                result["decode"].append({"batch": batch, "context": args.context, "error": "out of memory"})
                print(f"decode batch {batch}: out of memory", flush=True)
            del out
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
