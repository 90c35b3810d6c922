"""Golden fixtures for glmserve's C++ tests, made with transformers 5.17 GlmMoeDsaForCausalLM.

Run on the GPU machine from the repo root:
    PYTHONUNBUFFERED=1 python3 tools/make_golden.py --out tests/golden
Writes tests/golden/<name>/{config.json, model.safetensors, golden.safetensors} for each config
below, and verifies tools/glm5_torch.py against HF on each (rel L2 of logits < 1e-5).
See tests/golden/README.md for the format.
"""
import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm5_torch as G  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
DEV = "cuda" if torch.cuda.is_available() else "cpu"

# Thresholds for the tie checks (see README): index-score gap relative to the row's max |score|,
# router choice-score gap (absolute, scores are O(1)), greedy top1-top2 logit gap (absolute).
IDX_REL_GAP, ROUTER_GAP, LOGIT_GAP = 1e-5, 1e-4, 1e-3

CONFIGS = {
    "glm5-random": dict(
        cfg=dict(vocab_size=307, hidden_size=72, num_hidden_layers=4, first_k_dense_replace=1,
                 num_attention_heads=3, num_key_value_heads=3, q_lora_rank=40, kv_lora_rank=24,
                 qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, index_n_heads=16,
                 index_head_dim=24, index_topk=37, n_routed_experts=11, num_experts_per_tok=3,
                 n_group=1, topk_group=1, n_shared_experts=1, moe_intermediate_size=20,
                 intermediate_size=56, norm_topk_prob=True, routed_scaling_factor=2.5,
                 rms_norm_eps=1e-5, max_position_embeddings=4096, initializer_range=0.08,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                 index_topk_freq=1, index_skip_topk_offset=0, rope_interleave=True,
                 tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
                 bos_token_id=0, eos_token_id=1, pad_token_id=1),
        prompt_len=150, extra_lens=[5, 37, 91]),
    "glm52-random": dict(
        cfg=dict(vocab_size=331, hidden_size=80, num_hidden_layers=7, first_k_dense_replace=2,
                 num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
                 qk_nope_head_dim=14, qk_rope_head_dim=8, v_head_dim=12, index_n_heads=16,
                 index_head_dim=20, index_topk=45, n_routed_experts=16, num_experts_per_tok=4,
                 n_group=4, topk_group=2, n_shared_experts=1, moe_intermediate_size=28,
                 intermediate_size=60, norm_topk_prob=True, routed_scaling_factor=2.5,
                 rms_norm_eps=1e-5, max_position_embeddings=8192, initializer_range=0.08,
                 rope_parameters={"rope_type": "default", "rope_theta": 8000000.0},
                 index_topk_freq=4, index_skip_topk_offset=3, rope_interleave=True,
                 tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
                 bos_token_id=0, eos_token_id=[1, 2, 3], pad_token_id=1,
                 num_nextn_predict_layers=1),
        prompt_len=200, extra_lens=[7, 45, 120]),
}


def rel_l2(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def randomize(named, init_range, gen):
    """Randomise every tensor: norms 1+0.1*noise, k_norm bias 0.1*noise, router bias U[0,0.5]."""
    out = {}
    for n, t in named:
        shape = tuple(t.shape)
        if n.endswith("e_score_correction_bias"):
            v = torch.rand(shape, generator=gen) * 0.5
        elif "k_norm.bias" in n:
            v = torch.randn(shape, generator=gen) * 0.1
        elif "norm" in n.split(".")[-2] or n.endswith("norm.weight"):
            v = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            v = torch.randn(shape, generator=gen) * init_range
        out[n] = v.float()
    return out


def to_ckpt_dtypes(sd):
    return {k: (v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous()
            for k, v in sd.items()}


@torch.no_grad()
def tie_stats(model, ids):
    """Min gaps over one full-sequence forward of glm5_torch: index top-k boundary (relative),
    router expert choice and group choice (absolute)."""
    stats = {"idx_rel_gap": float("inf"), "router_gap": float("inf"), "group_gap": float("inf")}
    cfg = model.cfg
    hooks = []

    def idx_hook(mod, inp, out):
        s = out[0]  # [T,T]
        T = s.shape[-1]
        k = min(cfg["index_topk"], T)
        for t in range(k, T):  # rows with more than k causal candidates
            row = s[t, : t + 1]
            v = row.topk(k + 1).values
            scale = row.abs().max().clamp_min(1e-30)
            stats["idx_rel_gap"] = min(stats["idx_rel_gap"], ((v[k - 1] - v[k]) / scale).item())

    def moe_hook(mod, inp, out):
        x = inp[0].reshape(-1, inp[0].shape[-1])
        idx, w, choice, gs = mod.route(x)
        v = choice.topk(mod.k + 1, dim=-1).values
        fin = torch.isfinite(v[:, mod.k])
        gap = torch.where(fin, v[:, mod.k - 1] - v[:, mod.k], torch.full_like(v[:, 0], float("inf")))
        stats["router_gap"] = min(stats["router_gap"], gap.min().item())
        if mod.n_group > 1:
            g = gs.topk(mod.topk_group + 1, dim=-1).values
            stats["group_gap"] = min(stats["group_gap"], (g[:, mod.topk_group - 1] - g[:, mod.topk_group]).min().item())

    for m in model.modules():
        if isinstance(m, G.Indexer):
            hooks.append(m.register_forward_hook(idx_hook))
        if isinstance(m, G.MoE):
            hooks.append(m.register_forward_hook(moe_hook))
    try:
        model(ids[None])
    finally:
        for h in hooks:
            h.remove()
    return stats


def merge_stats(a, b):
    return {k: min(a.get(k, float("inf")), b.get(k, float("inf"))) for k in set(a) | set(b)}


def build_one(name, spec, seed, workdir):
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    cfgd = dict(spec["cfg"])
    torch.manual_seed(seed)
    config = GlmMoeDsaConfig(**cfgd)
    hf = GlmMoeDsaForCausalLM(config).float()
    gen = torch.Generator().manual_seed(seed)
    named = list(hf.state_dict().items())
    rnd = randomize(named, cfgd["initializer_range"], gen)
    hf.load_state_dict(rnd, strict=False)
    hf = hf.to(torch.bfloat16)
    for n, b in hf.named_buffers():
        if n.endswith("e_score_correction_bias"):
            mod = hf.get_submodule(n.rsplit(".", 1)[0])
            mod.e_score_correction_bias = rnd[n].clone()
    hfdir = os.path.join(workdir, f"{name}-hf")
    shutil.rmtree(hfdir, ignore_errors=True)
    hf.save_pretrained(hfdir)
    saved = {}
    for f in sorted(glob.glob(os.path.join(hfdir, "model*.safetensors"))):
        saved.update(load_file(f))
        os.remove(f)
    for f in glob.glob(os.path.join(hfdir, "*.index.json")):
        os.remove(f)
    dtypes = sorted({str(v.dtype) for v in saved.values()})
    # exact fp32 router bias (whatever save_pretrained did with it); everything else bf16
    for k in saved:
        if k.endswith("e_score_correction_bias"):
            saved[k] = rnd[k].float() if k in rnd else saved[k].float()
    saved = to_ckpt_dtypes(saved)
    save_file(saved, os.path.join(hfdir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(hfdir, "config.json")) as f:
        cfg_saved = json.load(f)
    return hfdir, saved, cfg_saved, dtypes


def load_hf(hfdir):
    from transformers import GlmMoeDsaForCausalLM

    ref, info = GlmMoeDsaForCausalLM.from_pretrained(hfdir, dtype=torch.float32, attn_implementation="eager",
                                                     output_loading_info=True)
    return ref.to(DEV).eval(), info


@torch.no_grad()
def hf_greedy(ref, prompt, n):
    ids = prompt.clone()
    toks, logits = [], []
    for _ in range(n):
        lg = ref(ids[None].to(DEV), use_cache=False).logits[0, -1].float().cpu()
        t = int(lg.argmax())
        toks.append(t)
        logits.append(lg)
        ids = torch.cat([ids, torch.tensor([t])])
    return torch.tensor(toks, dtype=torch.int64), torch.stack(logits)


def logit_gap(lg):
    v = lg.topk(2, dim=-1).values
    return (v[..., 0] - v[..., 1]).min().item()


def find_rope_variant(cfg, sd, ref_logits, ids):
    """Which RoPE layout reproduces HF (interleaved expected)."""
    res = {}
    for ri in (True, False):
        for ii in (True, False):
            c = dict(cfg, rope_interleave=ri, indexer_rope_interleave=ii)
            m = G.GlmMoeDsa(c, with_mtp=0)
            m.load_state_dict({k: v.float() for k, v in sd.items() if k in m.state_dict()}, strict=False)
            m = m.to(DEV).eval()
            with torch.no_grad():
                res[(ri, ii)] = rel_l2(m(ids[None].to(DEV))["logits"][0].cpu(), ref_logits)
    return res


def load_mine(cfg, weights, with_mtp):
    m = G.GlmMoeDsa(cfg, with_mtp=with_mtp)
    own = m.state_dict()
    missing = [k for k in own if k not in weights]
    m.load_state_dict({k: v.float() for k, v in weights.items() if k in own}, strict=False)
    for k, v in weights.items():
        if k.endswith("e_score_correction_bias") and k in own:
            m.get_submodule(k.rsplit(".", 1)[0]).e_score_correction_bias.data = v.float()
    return m.to(DEV).eval(), missing


def attempt(name, spec, seed, workdir):
    cfgd = spec["cfg"]
    P, V = spec["prompt_len"], cfgd["vocab_size"]
    t0 = time.time()
    hfdir, saved, cfg_saved, dtypes = build_one(name, spec, seed, workdir)
    ref, info = load_hf(hfdir)
    bias_err = 0.0
    rsd = ref.state_dict()
    for k, v in saved.items():
        if k in rsd and (k.endswith("e_score_correction_bias") or "norm" in k or "proj" in k):
            bias_err = max(bias_err, (rsd[k].float().cpu() - v.float()).abs().max().item())
    g = torch.Generator().manual_seed(seed + 7)
    prompt = torch.randint(4, V, (P,), generator=g)
    extras = [torch.randint(4, V, (n,), generator=g) for n in spec["extra_lens"]]
    greedy, greedy_logits = hf_greedy(ref, prompt, 20)
    mine, missing = load_mine(cfg_saved, saved, 0)
    st = tie_stats(mine, torch.cat([prompt, greedy]).to(DEV))
    for e in extras:
        st = merge_stats(st, tie_stats(mine, e.to(DEV)))
    st["logit_gap"] = logit_gap(greedy_logits)
    ok = (st["idx_rel_gap"] > IDX_REL_GAP and st["router_gap"] > ROUTER_GAP and
          st["group_gap"] > ROUTER_GAP and st["logit_gap"] > LOGIT_GAP)
    print(f"[{name}] seed {seed}: {st} ok={ok} ({time.time() - t0:.1f}s) saved dtypes {dtypes} "
          f"hf missing={info.get('missing_keys')} unexpected={info.get('unexpected_keys')} "
          f"mine-missing={missing} max|hf weight - file|={bias_err:.3g}")
    score = min(st["idx_rel_gap"] / IDX_REL_GAP, st["router_gap"] / ROUTER_GAP,
                st["group_gap"] / ROUTER_GAP, st["logit_gap"] / LOGIT_GAP)
    return dict(ok=ok, score=score, ref=ref, saved=saved, cfg_saved=cfg_saved, prompt=prompt, extras=extras,
                greedy=greedy, greedy_logits=greedy_logits, mine=mine, st=st, seed=seed)


def make_fixture(name, spec, outroot, workdir, max_seeds=40):
    cfgd = spec["cfg"]
    P = spec["prompt_len"]
    best = None
    for seed in range(1000, 1000 + max_seeds):
        r = attempt(name, spec, seed, workdir)
        if r["ok"]:
            break
        if best is None or r["score"] > best[0]:
            best = (r["score"], seed)
        del r
    else:
        print(f"[{name}] WARNING no seed passed all tie checks; using best seed {best[1]}")
        r = attempt(name, spec, best[1], workdir)
    ref, saved, cfg_saved, prompt, extras = r["ref"], r["saved"], r["cfg_saved"], r["prompt"], r["extras"]
    greedy, greedy_logits, mine, st, seed = r["greedy"], r["greedy_logits"], r["mine"], r["st"], r["seed"]

    # ---- reference outputs (HF fp32 eager, bf16-rounded weights)
    with torch.no_grad():
        out = ref(prompt[None].to(DEV), use_cache=False, output_hidden_states=True)
        prompt_logits = out.logits[0].float().cpu()
        hs = torch.stack([h[0].float().cpu() for h in out.hidden_states])
        extra_last = [ref(e[None].to(DEV), use_cache=False).logits[0, -1].float().cpu() for e in extras]
        my = mine(prompt[None].to(DEV))
    my_logits = my["logits"][0].cpu()
    my_hidden = torch.stack([h[0].cpu() for h in my["hidden"]])
    prenorm_last = my["h_prenorm"][0].cpu()
    normed_last = mine.model.norm(my["h_prenorm"])[0].cpu()
    e_norm = rel_l2(hs[-1], normed_last)
    e_pre = rel_l2(hs[-1], prenorm_last)
    last_conv = "final_norm_applied" if e_norm < e_pre else "pre_norm"
    report = {
        "logits_rel_l2": rel_l2(my_logits, prompt_logits),
        "hidden_rel_l2": [rel_l2(my_hidden[i], hs[i]) for i in range(hs.shape[0] - 1)],
        "last_hidden_vs_normed": e_norm, "last_hidden_vs_prenorm": e_pre,
    }
    with torch.no_grad():
        fullseq = torch.cat([prompt, greedy[:-1]])
        gl = mine(fullseq[None].to(DEV))["logits"][0, P - 1:].cpu()
        report["greedy_logits_rel_l2"] = rel_l2(gl, greedy_logits)
        report["extra_last_rel_l2"] = [rel_l2(mine(e[None].to(DEV))["logits"][0, -1].cpu(), x)
                                       for e, x in zip(extras, extra_last)]
    if report["logits_rel_l2"] > 1e-5:
        report["rope_variants"] = {str(k): v for k, v in find_rope_variant(cfg_saved, saved, prompt_logits, prompt).items()}
    print(f"[{name}] glm5_torch vs HF: {json.dumps(report)}")

    # ---- fixture files
    d = os.path.join(outroot, name)
    os.makedirs(d, exist_ok=True)
    cfg_out = dict(cfg_saved)
    if "num_nextn_predict_layers" in cfgd:
        cfg_out["num_nextn_predict_layers"] = cfgd["num_nextn_predict_layers"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_out, f, indent=2, sort_keys=True)
    weights = dict(saved)
    golden = {
        "prompt_ids": prompt.to(torch.int64), "prompt_logits": prompt_logits.contiguous(),
        "hidden_states": hs.contiguous(), "greedy_ids": greedy, "greedy_logits": greedy_logits.contiguous(),
        "last_hidden_prenorm": prenorm_last.contiguous(),
    }
    for i, (e, x) in enumerate(zip(extras, extra_last)):
        golden[f"extra_prompt_ids_{i}"] = e.to(torch.int64)
        golden[f"extra_prompt_last_logits_{i}"] = x.contiguous()
    n_mtp = cfgd.get("num_nextn_predict_layers", 0)
    if n_mtp:
        # random MTP layer at index num_hidden_layers (HF ignores it; glm5_torch is the reference)
        full_model = G.GlmMoeDsa(cfg_out, with_mtp=1)
        L = cfgd["num_hidden_layers"]
        mtp_named = [(k, v) for k, v in full_model.state_dict().items() if k.startswith(f"model.layers.{L}.")]
        mtp_w = to_ckpt_dtypes(randomize(mtp_named, cfgd["initializer_range"], torch.Generator().manual_seed(seed + 99)))
        weights.update(mtp_w)
        full_model, miss = load_mine(cfg_out, weights, 1)
        assert not miss, miss
        with torch.no_grad():
            o = full_model(prompt[None].to(DEV))
            nxt = torch.cat([prompt[1:], greedy[:1]])[None].to(DEV)
            dr = full_model.mtp(o["h_prenorm"], nxt)
        golden["mtp_draft_logits"] = dr["logits"][0].float().cpu().contiguous()
        golden["mtp_next_ids"] = nxt[0].cpu().to(torch.int64)
        print(f"[{name}] MTP layer: {len(mtp_w)} tensors; main logits of the with-MTP model vs HF "
              f"rel {rel_l2(o['logits'][0].cpu(), prompt_logits):.3g}")
    save_file(weights, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    meta = {
        "source": "transformers GlmMoeDsaForCausalLM fp32 eager, bf16-rounded weights, no cache",
        "transformers": __import__("transformers").__version__, "torch": torch.__version__,
        "device": DEV, "seed": str(seed),
        "hidden_states_last": last_conv,
        "hidden_states_layout": "[L+1, P, H]: index 0 = embeddings, i = output of decoder layer i-1; "
                                f"last entry: {last_conv}",
        "greedy": "20 tokens, each argmax of a full no-cache fp32 forward over prompt+previous",
        "tie_checks": json.dumps(st),
        "glm5_torch_vs_hf": json.dumps(report),
        "mtp": "mtp_draft_logits[t] = MTP(h_prenorm[t], next_ids[t]); next_ids = prompt[1:]+greedy[0]" if n_mtp else "none",
    }
    save_file(golden, os.path.join(d, "golden.safetensors"), metadata=meta)
    sz = {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)}
    print(f"[{name}] wrote {d}: {sz}")
    return report, st


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/golden")
    ap.add_argument("--only", default="")
    ap.add_argument("--max-seeds", type=int, default=40)
    args = ap.parse_args()
    import transformers
    print("transformers", transformers.__version__, "torch", torch.__version__, "device", DEV)
    try:
        import transformers.models.glm_moe_dsa.modeling_glm_moe_dsa as mm
        src = open(mm.__file__).read()
        for key in ("def apply_rotary_pos_emb", "rope_interleave", "self.indexer =", "skip_topk ="):
            i = src.find(key)
            print(f"--- source around {key!r}:\n{src[i:i + 600] if i >= 0 else 'NOT FOUND'}")
    except Exception as e:  # pragma: no cover
        print("could not read source", e)
    work = tempfile.mkdtemp()
    summary = {}
    for name, spec in CONFIGS.items():
        if args.only and name not in args.only.split(","):
            continue
        summary[name] = make_fixture(name, spec, args.out, work, args.max_seeds)
    print("SUMMARY", json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
