"""golden.safetensors for the trained tiny model (called by train_tiny.py after export).

Same format as tests/golden/*/golden.safetensors (see tests/golden/README.md), from HF
GlmMoeDsaForCausalLM fp32 eager on the exported bf16 checkpoint (HF ignores the MTP layer),
plus mtp_draft_logits from tools/glm5_torch.py. To keep the file small, prompt_logits and
mtp_draft_logits hold only some prompt positions: `prompt_logits_rows` / `mtp_draft_rows` (I64 [R])
list them (the first few, a few in the middle, then positions from index_topk on, always the last).
"""
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file

import glm5_torch as G
import make_golden as MG  # sets TF32 off


def pick_rows(P, topk, R, n_first, n_mid):
    """R sorted positions of [0, P): the first n_first, n_mid spread over [n_first, topk), the rest spread
    over [topk, P) (where the top-k selection is active), always including P-1."""
    first = list(range(min(n_first, P)))
    mid = [int(round(x)) for x in torch.linspace(n_first, min(topk, P) - 1, n_mid + 2).tolist()[1:-1]]
    rows = set(first) | set(mid)
    n_tail = max(R - len(rows), 1)
    lo = min(topk, P - 1)
    rows |= {int(round(x)) for x in torch.linspace(lo, P - 1, n_tail).tolist()} | {P - 1}
    return torch.tensor(sorted(r for r in rows if 0 <= r < P), dtype=torch.int64)


class _MTPOnly(torch.nn.Module):
    """For MG.tie_stats: its hooks see only the MTP block's indexer and MoE; forward runs the main
    model (unhooked) and then the MTP layer on (h_prenorm[t], next_ids[t])."""

    def __init__(self, full, nxt):
        super().__init__()
        self.lay = full.model.layers[full.cfg["num_hidden_layers"]]
        self.cfg = full.cfg
        self._full = [full]
        self._nxt = nxt

    def forward(self, ids):
        full = self._full[0]
        return full.mtp(full(ids)["h_prenorm"], self._nxt)


def _score(st):
    return min(st["idx_rel_gap"] / MG.IDX_REL_GAP, st["router_gap"] / MG.ROUTER_GAP,
               st["group_gap"] / MG.ROUTER_GAP, st.get("logit_gap", float("inf")) / MG.LOGIT_GAP)


def make(outdir, tok, held_f, held_s, eos_ids, log, P=160, n_cand=24, prompt_rows=36, mtp_rows=16):
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

    # candidate prompts: the start of held-out files with >= P + 20 tokens
    cands = []
    for path, txt in held_f:
        if len(cands) >= n_cand:
            break
        if len(txt) < 2 * P:
            continue
        ids = tok.encode(txt, add_special_tokens=False).ids
        if len(ids) >= P + 20:
            cands.append((path, ids[:P]))
    if not cands:  # (smoke runs: few held-out files) use the held-out token stream
        cands = [("held-out stream", held_s[i * (P + 20):i * (P + 20) + P].tolist()) for i in range(3)
                 if (i + 1) * (P + 20) <= len(held_s)]
    # keep the candidate with the best worst-case margin (main model over prompt + greedy, and the
    # MTP block over the prompt), relative to the targets of make_golden
    best = None
    for path, ids in cands[:n_cand]:
        prompt = torch.tensor(ids, dtype=torch.int64)
        greedy, gl = MG.hf_greedy(ref, prompt, 20)
        st = MG.tie_stats(main_only, torch.cat([prompt, greedy]).to(MG.DEV))
        st["logit_gap"] = MG.logit_gap(gl)
        nxt = torch.cat([prompt[1:], greedy[:1]])[None].to(MG.DEV)
        st_mtp = MG.tie_stats(_MTPOnly(mine, nxt), prompt.to(MG.DEV))
        score = min(_score(st), _score(st_mtp))
        log(f"golden candidate {path}: main {st} mtp {st_mtp} score {score:.3f}")
        if best is None or score > best[0]:
            best = (score, path, prompt, greedy, gl, st, st_mtp)
    score, path, prompt, greedy, greedy_logits, st, st_mtp = best
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
    st_extra = {}
    for e in extras:
        st_extra = MG.merge_stats(st_extra, MG.tie_stats(main_only, e.to(MG.DEV)))
    log(f"tiny golden: prompt {path} ({P} tokens) score {score:.3f} tie checks main {st} mtp {st_mtp} "
        f"extras {st_extra}; glm5_torch vs HF {rep}; MTP teacher-forced top-1 accuracy on prompt {mtp_acc:.3f}")
    topk = cfg["index_topk"]
    prow = pick_rows(P, topk, prompt_rows, 4, 4)
    mrow = pick_rows(P, topk, mtp_rows, 2, 2)
    golden = {"prompt_ids": prompt, "prompt_logits_rows": prow,
              "prompt_logits": prompt_logits[prow].contiguous(), "hidden_states": hs.contiguous(),
              "greedy_ids": greedy, "greedy_logits": greedy_logits.contiguous(),
              "last_hidden_prenorm": o["h_prenorm"][0].float().cpu().contiguous(),
              "mtp_draft_rows": mrow, "mtp_draft_logits": d["logits"][0].float().cpu()[mrow].contiguous(),
              "mtp_next_ids": nxt[0].cpu()}
    for i, (e, x) in enumerate(zip(extras, extra_last)):
        golden[f"extra_prompt_ids_{i}"] = e
        golden[f"extra_prompt_last_logits_{i}"] = x.contiguous()
    meta = {"source": "transformers GlmMoeDsaForCausalLM fp32 eager, bf16 checkpoint, no cache",
            "transformers": __import__("transformers").__version__, "torch": torch.__version__,
            "hidden_states_last": last_conv, "prompt_file": path,
            "prompt_text": tok.decode(prompt.tolist(), skip_special_tokens=False),
            "greedy_text": tok.decode(greedy.tolist(), skip_special_tokens=False),
            "tie_checks": json.dumps(st), "tie_checks_mtp": json.dumps(st_mtp),
            "tie_checks_extras": json.dumps(st_extra), "glm5_torch_vs_hf": json.dumps(rep),
            "rows": "prompt_logits[i] = logits at prompt position prompt_logits_rows[i]; "
                    "mtp_draft_logits[i] = MTP draft at position mtp_draft_rows[i]",
            "mtp": "mtp_draft_logits[i] = MTP(h_prenorm[t], next_ids[t]) at t = mtp_draft_rows[i], from "
                   "tools/glm5_torch.py; next_ids = prompt[1:] + greedy[0]"}
    gpath = os.path.join(outdir, "golden.safetensors")
    save_file(golden, gpath, metadata=meta)
    log(f"golden.safetensors: {os.path.getsize(gpath)} bytes; prompt_logits_rows {prow.tolist()}; "
        f"mtp_draft_rows {mrow.tolist()}")
    log(f"greedy continuation of golden prompt: {meta['greedy_text']!r}")
    # tokenizer + chat template through transformers
    same = None
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
    return dict(prompt_file=path, score=score, tie_checks=st, tie_checks_mtp=st_mtp, tie_checks_extras=st_extra,
                glm5_torch_vs_hf=rep, golden_bytes=os.path.getsize(gpath), mtp_teacher_forced_acc=mtp_acc,
                greedy_text=meta["greedy_text"], autotokenizer_same_ids=same)
