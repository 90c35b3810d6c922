"""golden.safetensors for the trained tiny model (called by train_tiny.py after export).

Same format as tests/golden/*/golden.safetensors (see tests/golden/README.md), from HF
GlmMoeDsaForCausalLM fp32 eager on the exported bf16 checkpoint (HF ignores the MTP layer),
plus mtp_draft_logits from tools/glm5_torch.py.
"""
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file

import glm5_torch as G
import make_golden as MG  # sets TF32 off


def make(outdir, tok, held_f, held_s, eos_ids, log, P=192, n_cand=10):
    cfg = G.load_config(outdir)
    L = cfg["num_hidden_layers"]
    sd = load_file(os.path.join(outdir, "model.safetensors"))
    hfdir = tempfile.mkdtemp()
    shutil.copy(os.path.join(outdir, "config.json"), hfdir)
    save_file({k: v for k, v in sd.items() if not k.startswith(f"model.layers.{L}.")},
              os.path.join(hfdir, "model.safetensors"), metadata={"format": "pt"})
    ref, info = MG.load_hf(hfdir)
    log(f"HF load: missing {info.get('missing_keys')} unexpected {info.get('unexpected_keys')}")
    mine, missing = MG.load_mine(cfg, sd, 1)
    log(f"glm5_torch load missing {missing}")
    main_only, _ = MG.load_mine(cfg, sd, 0)

    # candidate prompts: the start of held-out files with >= P tokens
    cands = []
    for path, txt in held_f:
        ids = tok.encode(txt, add_special_tokens=False).ids
        if len(ids) >= P + 20:
            cands.append((path, ids[:P]))
    if not cands:  # (smoke runs: few held-out files) use the held-out token stream
        cands = [("held-out stream", held_s[i * (P + 20):i * (P + 20) + P].tolist()) for i in range(3)
                 if (i + 1) * (P + 20) <= len(held_s)]
    best = None
    for path, ids in cands[:n_cand]:
        prompt = torch.tensor(ids, dtype=torch.int64)
        greedy, gl = MG.hf_greedy(ref, prompt, 20)
        st = MG.tie_stats(main_only, torch.cat([prompt, greedy]).to(MG.DEV))
        st["logit_gap"] = MG.logit_gap(gl)
        score = min(st["idx_rel_gap"] / MG.IDX_REL_GAP, st["router_gap"] / MG.ROUTER_GAP,
                    st["group_gap"] / MG.ROUTER_GAP, st["logit_gap"] / MG.LOGIT_GAP)
        log(f"golden candidate {path}: {st} score {score:.2f}")
        if best is None or score > best[0]:
            best = (score, path, prompt, greedy, gl, st)
        if score > 1:
            break
    score, path, prompt, greedy, greedy_logits, st = best
    # extra prompts (other held-out files), different lengths
    extras = []
    lens = [17, 64, 130]
    for p2, txt in held_f:
        if p2 == path or len(extras) == len(lens):
            continue
        ids = tok.encode(txt, add_special_tokens=False).ids
        if len(ids) >= lens[len(extras)]:
            extras.append(torch.tensor(ids[: lens[len(extras)]], dtype=torch.int64))
    k = 0
    while len(extras) < len(lens):  # fallback: slices of the held-out stream
        extras.append(torch.tensor(held_s[k:k + lens[len(extras)]].tolist(), dtype=torch.int64))
        k += 200
    with torch.no_grad():
        out = ref(prompt[None].to(MG.DEV), use_cache=False, output_hidden_states=True)
        prompt_logits = out.logits[0].float().cpu()
        hs = torch.stack([h[0].float().cpu() for h in out.hidden_states])
        extra_last = [ref(e[None].to(MG.DEV), use_cache=False).logits[0, -1].float().cpu() for e in extras]
        o = mine(prompt[None].to(MG.DEV))
        nxt = torch.cat([prompt[1:], greedy[:1]])[None].to(MG.DEV)
        d = mine.mtp(o["h_prenorm"], nxt)
    rep = {"logits_rel_l2": MG.rel_l2(o["logits"][0].cpu(), prompt_logits),
           "hidden_rel_l2": [MG.rel_l2(o["hidden"][i][0].cpu(), hs[i]) for i in range(L)]}
    normed = mine.model.norm(o["h_prenorm"])[0].cpu()
    last_conv = "final_norm_applied" if MG.rel_l2(normed, hs[-1]) < MG.rel_l2(o["h_prenorm"][0].cpu(), hs[-1]) else "pre_norm"
    mtp_acc = (d["logits"][0].argmax(-1)[:-2].cpu() == prompt[2:]).float().mean().item()
    log(f"tiny golden: prompt {path} ({P} tokens) tie checks {st}; glm5_torch vs HF {rep}; "
        f"MTP teacher-forced top-1 accuracy on prompt {mtp_acc:.3f}")
    golden = {"prompt_ids": prompt, "prompt_logits": prompt_logits.contiguous(), "hidden_states": hs.contiguous(),
              "greedy_ids": greedy, "greedy_logits": greedy_logits.contiguous(),
              "last_hidden_prenorm": o["h_prenorm"][0].float().cpu().contiguous(),
              "mtp_draft_logits": d["logits"][0].float().cpu().contiguous(), "mtp_next_ids": nxt[0].cpu()}
    for i, (e, x) in enumerate(zip(extras, extra_last)):
        golden[f"extra_prompt_ids_{i}"] = e
        golden[f"extra_prompt_last_logits_{i}"] = x.contiguous()
    meta = {"source": "transformers GlmMoeDsaForCausalLM fp32 eager, bf16 checkpoint, no cache",
            "transformers": __import__("transformers").__version__, "torch": torch.__version__,
            "hidden_states_last": last_conv, "prompt_file": path,
            "prompt_text": tok.decode(prompt.tolist(), skip_special_tokens=False),
            "greedy_text": tok.decode(greedy.tolist(), skip_special_tokens=False),
            "tie_checks": json.dumps(st), "glm5_torch_vs_hf": json.dumps(rep),
            "mtp": "mtp_draft_logits[t] = MTP(h_prenorm[t], next_ids[t]) from tools/glm5_torch.py; "
                   "next_ids = prompt[1:] + greedy[0]"}
    save_file(golden, os.path.join(outdir, "golden.safetensors"), metadata=meta)
    log(f"greedy continuation of golden prompt: {meta['greedy_text']!r}")

    # tokenizer + chat template through transformers
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(outdir)
        txt = meta["prompt_text"]
        same = at.encode(txt, add_special_tokens=False) == tok.encode(txt, add_special_tokens=False).ids
        msgs = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list."},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "run", "arguments": {"code": "print(sorted([3, 1]))", "timeout": 5}}}]},
                {"role": "tool", "content": "[1, 3]"}]
        tools = [{"type": "function", "function": {"name": "run", "description": "Run code",
                                                   "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]
        r = at.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
        log(f"AutoTokenizer: same ids as tokenizers: {same}; class {type(at).__name__}; chat template:\n{r}")
    except Exception as e:  # report, do not fail the run
        log(f"AutoTokenizer check failed: {e!r}")
