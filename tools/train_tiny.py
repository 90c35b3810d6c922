"""Train the bundled tiny GLM-5.2-layout code model (models/glm5-tiny-code) on the GPU machine.

    PYTHONUNBUFFERED=1 python3 tools/train_tiny.py --out /tmp/glm5-tiny-code --minutes 4
    (--smoke: a 20-step run on little data, to test the whole pipeline)

Data: the Python source files of the machine's site-packages (deduplicated, 1-300 KB files),
split by file (sha1 % 50 == 0 -> held out). Tokenizer: byte-level BPE (HF tokenizers) trained
on the same data, GLM special tokens appended at the end of the vocabulary.
Model: tools/glm5_torch.py (checkpoint names), IndexShare indexer, MoE with shared expert and
group-limited routing, one MTP layer. Training: AdamW, bf16 autocast, dense attention warm-up,
then sparse top-k attention; indexer trained by KL towards the detached head-summed attention;
MTP trained jointly (predict t+2 from h_t and token t+1); router bias by aux-loss-free balancing.
Writes the model folder (see models/glm5-tiny-code/README.md) and golden.safetensors.
"""
import argparse
import glob
import hashlib
import json
import math
import os
import random
import re
import shutil
import site
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm5_torch as G  # noqa: E402

SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<think>", "</think>",
            "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
            "<arg_value>", "</arg_value>"]
SPLIT_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 8192

CFG = dict(
    architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa",
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=6, first_k_dense_replace=1,
    num_attention_heads=8, num_key_value_heads=8, q_lora_rank=128, kv_lora_rank=64,
    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, index_n_heads=16, index_head_dim=32,
    index_topk=96, index_topk_freq=3, index_skip_topk_offset=2,
    n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
    moe_intermediate_size=64, intermediate_size=512, norm_topk_prob=True, routed_scaling_factor=2.5,
    scoring_func="sigmoid", topk_method="noaux_tc", hidden_act="silu", rms_norm_eps=1e-5,
    max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 8000000.0},
    rope_interleave=True, attention_bias=False, tie_word_embeddings=False, initializer_range=0.02,
    num_nextn_predict_layers=1, moe_router_dtype="float32",
)

TEMPLATE = r"""{#- glmserve tiny-code chat template (GLM-4.5/5 conventions) -#}
{%- macro render_content(c) -%}
{%- if c is string -%}{{ c }}
{%- elif c is iterable and c is not mapping -%}{%- for part in c -%}{%- if part is mapping and part.type == 'text' -%}{{ part.text }}{%- elif part is string -%}{{ part }}{%- endif -%}{%- endfor -%}
{%- elif c is not none -%}{{ c }}
{%- endif -%}
{%- endmacro -%}
{{- '[gMASK]<sop>' -}}
{%- set ns = namespace(sys='', first=0, prev='') -%}
{%- if messages and messages[0].role == 'system' -%}{%- set ns.sys = render_content(messages[0].content) -%}{%- set ns.first = 1 -%}{%- endif -%}
{%- if tools -%}
{{- '<|system|>\n' -}}
{%- if ns.sys -%}{{- ns.sys + '\n\n' -}}{%- endif -%}
{{- '# Available tools\nCall a tool by writing <tool_call>NAME<arg_key>ARGUMENT</arg_key><arg_value>VALUE</arg_value></tool_call> (one arg_key/arg_value pair per argument). The tools, as JSON schemas:' -}}
{%- for t in tools -%}
{{- '\n' + ((t.function if t.function is defined else t) | tojson(ensure_ascii=False)) -}}
{%- endfor -%}
{%- elif ns.sys -%}
{{- '<|system|>\n' + ns.sys -}}
{%- endif -%}
{%- for m in messages[ns.first:] -%}
{%- if m.role == 'system' or m.role == 'user' -%}
{{- '<|' + m.role + '|>\n' + render_content(m.content) -}}
{%- elif m.role == 'assistant' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is defined and m.reasoning_content else '' -%}
{{- '<|assistant|>\n<think>' + reasoning + '</think>' -}}
{%- set text = render_content(m.content) -%}
{%- if text -%}{{- '\n' + text -}}{%- endif -%}
{%- if m.tool_calls is defined and m.tool_calls -%}
{%- for call in m.tool_calls -%}
{%- set f = call.function if call.function is defined else call -%}
{{- '\n<tool_call>' + f.name -}}
{%- if f.arguments is mapping -%}
{%- for k, v in f.arguments.items() -%}
{{- '<arg_key>' + k + '</arg_key><arg_value>' + (v if v is string else v | tojson(ensure_ascii=False)) + '</arg_value>' -}}
{%- endfor -%}
{%- endif -%}
{{- '</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{%- elif m.role == 'tool' or m.role == 'observation' -%}
{%- if ns.prev != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
{{- '\n<tool_response>' + render_content(m.content) + '</tool_response>' -}}
{%- endif -%}
{%- set ns.prev = 'tool' if m.role in ['tool', 'observation'] else m.role -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|assistant|>\n' -}}
{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think></think>' -}}{%- endif -%}
{%- endif -%}
"""


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ----------------------------------------------------------------------------- data
SKIP_DIRS = {"_vendor", "vendor", "vendored", "_vendored", "extern", "_extern", "third_party", "thirdparty",
             "_bundled", "node_modules", "__pycache__", "site-packages", "dist-packages", ".git"}
SKIP_NAME = re.compile(r"_pb2(_grpc)?\.py$|generated|_gen\.py$|autogen|_ops_gen|_tables?\.py$|unicodedata", re.I)
GEN_HEAD = re.compile(r"generated (by|from|with|using)|do not edit|auto-?generated|@generated|"
                      r"this file was generated|automatically generated", re.I)


def source_roots():
    """site-packages / dist-packages on sys.path (+ site's own list) and the stdlib folder."""
    roots = set()
    for p in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
        if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p):
            roots.add(os.path.realpath(p))
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    return sorted(roots), stdlib


def list_py(root):
    out = []
    for dp, dn, fn in os.walk(root):
        dn[:] = [d for d in dn if d not in SKIP_DIRS]  # vendored trees; site-packages nested in the stdlib
        for f in fn:
            if f.endswith(".py") and not SKIP_NAME.search(f):
                out.append(os.path.join(dp, f))
    return out


def read_ok(p, min_bytes=500, max_bytes_file=200_000):
    """Returns the text of a usable source file, or None (why: size, undecodable, data-like, generated)."""
    try:
        sz = os.path.getsize(p)
        if sz < min_bytes or sz > max_bytes_file:
            return None
        with open(p, "rb") as f:
            raw = f.read()
        txt = raw.decode("utf-8")
    except Exception:
        return None
    if "\x00" in txt:
        return None
    lines = txt.split("\n")
    if len(txt) / len(lines) > 120 or max(map(len, lines)) > 1000:  # minified / data-like
        return None
    if GEN_HEAD.search(txt[:3000]):
        return None
    head = txt[:20000]
    if sum(map(head.count, "0123456789")) > 0.25 * len(head):  # numeric tables
        return None
    return txt


def collect_files(max_bytes, seed=0, threads=32):
    """All usable .py files of site-packages + stdlib, deduplicated by content, shuffled, split by
    file: sha1(content) % 50 == 0 -> held out."""
    from concurrent.futures import ThreadPoolExecutor

    roots, stdlib = source_roots()
    paths = []
    for r in roots + [stdlib]:
        paths += list_py(r)
    paths = sorted(set(paths))
    random.Random(seed).shuffle(paths)
    seen, train, held, total = set(), [], [], 0
    n_dup = n_rej = 0
    with ThreadPoolExecutor(threads) as ex:
        for p, txt in zip(paths, ex.map(read_ok, paths, chunksize=64)):
            if txt is None:
                n_rej += 1
                continue
            h = hashlib.sha1(txt.encode()).hexdigest()
            if h in seen:
                n_dup += 1
                continue
            seen.add(h)
            (held if int(h, 16) % 50 == 0 else train).append((p, txt))
            total += len(txt)
            if total >= max_bytes:
                break
    return train, held, roots + [stdlib], dict(listed=len(paths), rejected=n_rej, duplicates=n_dup)


def train_tokenizer(texts, sample_bytes):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    sample, n = [], 0
    for t in texts:
        sample.append(t)
        n += len(t)
        if n > sample_bytes:
            break
    tok.train_from_iterator(sample, trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def encode_stream(tok, texts, eos, chunk=4096):
    """Concatenated ids of all texts, each followed by eos (encode_batch runs on all cores)."""
    parts = []
    eos_a = np.array([eos], dtype=np.int32)
    for i in range(0, len(texts), chunk):
        for e in tok.encode_batch(texts[i:i + chunk], add_special_tokens=False):
            parts.append(np.asarray(e.ids, dtype=np.int32))
            parts.append(eos_a)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


# ----------------------------------------------------------------------------- model
def init_model(model, std):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or "norm.weight" in n or "layernorm" in n:
                p.fill_(1.0)
            elif n.endswith("k_norm.bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
                if n.endswith("o_proj.weight") or n.endswith("down_proj.weight"):
                    p.mul_(1 / math.sqrt(2 * CFG["num_hidden_layers"]))


def set_dense_compute(model, on):
    for m in model.modules():
        if isinstance(m, G.MoE):
            m.dense_compute = on


def indexer_kl(auxs, causal):
    """Sum over full layers of CE(target attention distribution, softmax(index scores))."""
    tot, n = 0.0, 0
    for a in auxs:
        if "index_scores" in a:
            s = a["index_scores"].masked_fill(~causal, float("-inf"))
            lp = torch.log_softmax(s.float(), -1).masked_fill(~causal, 0.0)
            tgt = a["attn_target"]
            tot = tot + (-(tgt * lp).sum(-1)).mean() + (tgt * torch.log(tgt.clamp_min(1e-12))).sum(-1).mean()
            n += 1
    return tot / max(n, 1)


def update_router_bias(model, gamma):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, G.MoE) and m.last_counts is not None:
                c = m.last_counts.float()
                m.gate.e_score_correction_bias += gamma * torch.sign(c.mean() - c)


def batches(stream, bs, seq, gen):
    n = len(stream) - seq - 2
    while True:
        ix = torch.randint(0, n, (bs,), generator=gen)
        yield torch.stack([torch.from_numpy(stream[i:i + seq + 2].astype(np.int64)) for i in ix.tolist()])


def losses(model, x, sparse, train_indexer, mtp_w=0.3, idx_w=1.0):
    inp, y1, y2 = x[:, :-2], x[:, 1:-1], x[:, 2:]
    T = inp.shape[1]
    out = model(inp, sparse=sparse, train_indexer=train_indexer)
    V = out["logits"].shape[-1]
    l_main = F.cross_entropy(out["logits"].float().reshape(-1, V), y1.reshape(-1))
    d = model.mtp(out["h_prenorm"], y1, sparse=sparse, train_indexer=train_indexer)
    l_mtp = F.cross_entropy(d["logits"].float().reshape(-1, V), y2.reshape(-1))
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    l_idx = indexer_kl(out["aux"] + d["aux"], causal) if train_indexer else torch.zeros((), device=x.device)
    return l_main, l_mtp, l_idx, l_main + mtp_w * l_mtp + idx_w * l_idx


@torch.no_grad()
def evaluate(model, stream, seq, nseq):
    model.eval()
    tot_m, tot_d, n = 0.0, 0.0, 0
    starts = np.linspace(0, len(stream) - seq - 3, nseq).astype(int)
    for i in range(0, nseq, 16):
        x = torch.stack([torch.from_numpy(stream[s:s + seq + 2].astype(np.int64)) for s in starts[i:i + 16]]).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lm, ld, _, _ = losses(model, x, True, False)
        tot_m += lm.item() * x.shape[0]
        tot_d += ld.item() * x.shape[0]
        n += x.shape[0]
    model.train()
    return tot_m / n, tot_d / n


@torch.no_grad()
def greedy(model, ids, n, eos=None):
    ids = list(ids)
    for _ in range(n):
        t = int(model(torch.tensor([ids], device="cuda"))["logits"][0, -1].argmax())
        ids.append(t)
        if eos is not None and t == eos:
            break
    return ids


@torch.no_grad()
def mtp_acceptance(model, prompts, gen_len, K=3):
    """Greedy speculative simulation without cache: main greedy continuation g; at each step t the
    MTP chain (depth k uses the previous draft's pre-norm hidden and token) drafts K tokens; count
    how many leading drafts equal the main model's greedy tokens. Returns P(first k drafts all
    accepted) for k=1..K and the mean accepted length with K drafts."""
    hits = np.zeros(K)
    cnt = 0
    for p in prompts:
        seq = greedy(model, p, gen_len + K)
        P = len(p)
        ids = torch.tensor([seq], device="cuda")
        out = model(ids)
        h = out["h_prenorm"]
        for t in range(P - 1, P - 1 + gen_len):
            # draft 1 at position t: input (h_t, seq[t+1]) predicts seq[t+2]
            hs, toks = h[:, : t + 1], ids[:, 1: t + 2]
            ok = True
            for k in range(K):
                d = model.mtp(hs, toks)
                tok = int(d["logits"][0, -1].argmax())
                good = ok and tok == seq[t + 2 + k]
                if good:
                    hits[k] += 1
                ok = good
                # chain: next draft position t+1+k uses the MTP output hidden and the drafted token
                hs = torch.cat([hs, d["h"][:, -1:]], 1)
                toks = torch.cat([toks, torch.tensor([[tok]], device="cuda")], 1)
            cnt += 1
    p = hits / max(cnt, 1)
    return p.tolist(), float(p.sum())


# ----------------------------------------------------------------------------- export
def export(model, tok, out, cfg):
    os.makedirs(out, exist_ok=True)
    sd = {}
    for k, v in model.state_dict().items():
        sd[k] = (v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)).contiguous().cpu()
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    from transformers import GlmMoeDsaConfig
    eos = [tok.token_to_id(s) for s in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    hc = GlmMoeDsaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")},
                         eos_token_id=eos, pad_token_id=eos[0], bos_token_id=None)
    d = hc.to_dict()
    d["architectures"] = ["GlmMoeDsaForCausalLM"]
    d["num_nextn_predict_layers"] = 1
    d["eos_token_id"], d["pad_token_id"] = eos, eos[0]
    d["dtype"] = "bfloat16"
    it = G.indexer_types(d)
    assert it == G.indexer_types(cfg), (it, G.indexer_types(cfg))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    added = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for s in SPECIALS}
    tc = {"added_tokens_decoder": added, "additional_special_tokens": SPECIALS[1:],
          "bos_token": None, "clean_up_tokenization_spaces": False, "do_lower_case": False,
          "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "padding_side": "left",
          "model_max_length": 4096, "remove_space": False, "tokenizer_class": "PreTrainedTokenizerFast",
          "chat_template": TEMPLATE}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(TEMPLATE)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"_from_model_config": False, "do_sample": True, "temperature": 0.7, "top_p": 0.95,
                   "eos_token_id": eos, "pad_token_id": eos[0], "max_new_tokens": 256}, f, indent=2)
    return eos


SAMPLE_PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n\ndef main():\n", "class Stack:\n"]


def post_training(model, tok, cfg, args, out, held_f, train_f, held_s, train_s, quick=False):
    """Evaluation, export, samples + MTP acceptance on the exported (bf16) weights, golden. quick=True
    is the preflight: the same code on tiny sizes, to fail within seconds of the start, not minutes."""
    res = {}
    t = time.time()
    nseq = 16 if (quick or args.smoke) else 96
    hl, hd = evaluate(model, held_s, args.seq, nseq)
    tl, td = evaluate(model, train_s, args.seq, nseq)
    res.update(heldout_loss=hl, heldout_mtp_loss=hd, train_eval_loss=tl, train_eval_mtp_loss=td)
    log(f"held-out loss {hl:.4f} (mtp {hd:.4f}); train loss (eval) {tl:.4f} (mtp {td:.4f})")
    with torch.no_grad():  # dense-attention loss for comparison (is the sparse selection hurting?)
        x = torch.stack([torch.from_numpy(held_s[s:s + args.seq + 2].astype(np.int64))
                         for s in np.linspace(0, len(held_s) - args.seq - 3, 16).astype(int)]).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            dl = losses(model, x, False, False)[0].item()
            sl = losses(model, x, True, False)[0].item()
    res.update(heldout_sparse_16=sl, heldout_dense_16=dl)
    log(f"held-out 16 seqs: sparse {sl:.4f} vs dense attention {dl:.4f}")

    eos_ids = export(model, tok, out, cfg)
    res["eos"] = eos_ids
    log(f"exported to {out}; eos {eos_ids}")
    # samples and MTP acceptance from the exported bf16 checkpoint, run in fp32 (what the engine loads)
    m2 = G.load_checkpoint(out, device="cuda", with_mtp=1).eval()
    assert not m2.load_report["missing"] and not m2.load_report["unexpected"], m2.load_report
    set_dense_compute(m2, True)  # all experts batched, unrouted weights 0: same numbers, no per-expert syncs
    eos = eos_ids[0]

    def complete(text, n):
        ids = tok.encode(text, add_special_tokens=False).ids
        outi = greedy(m2, ids, n, eos)
        return tok.decode(outi[len(ids):], skip_special_tokens=False)

    res["samples"] = {}
    for ptxt in SAMPLE_PROMPTS:
        c = complete(ptxt, 4 if quick else 100)
        res["samples"][ptxt] = c
        log(f"SAMPLE {ptxt!r}:\n{ptxt}{c}\n<<<END>>>")
    held_text = held_f[0][1] if held_f else train_f[0][1]
    snippet = held_text[:400]
    c = complete(snippet, 4 if quick else 80)
    log(f"SAMPLE held-out ({held_f[0][0] if held_f else '?'}):\n{snippet}<<<COMPLETION>>>{c}\n<<<END>>>")
    prompts = []
    for i in range(1 if quick else (4 if args.smoke else 12)):
        s = int(len(held_s) * (i + 0.5) / 12)
        prompts.append(held_s[s:s + 128].tolist())
    acc, alen = mtp_acceptance(m2, prompts, 2 if quick else (8 if args.smoke else 48))
    res.update(mtp_acceptance=acc, mtp_mean_accepted_of_3=alen)
    log(f"MTP acceptance (greedy, exported weights, P(first k drafts accepted)) k=1..3: {acc}; "
        f"mean accepted of 3 drafts {alen:.3f}")
    del m2
    torch.cuda.empty_cache()
    log(f"post-training stages: {time.time() - t:.0f}s")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/glm5-tiny-code")
    ap.add_argument("--minutes", type=float, default=6.5, help="training time (upper bound)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="if > 0: seconds from start by which everything must be done; training shrinks to fit")
    ap.add_argument("--reserve", type=float, default=110, help="seconds kept for the stages after training")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-preflight", action="store_true")
    ap.add_argument("--preflight-step", type=int, default=20)
    ap.add_argument("--bs", type=int, default=48)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--max-bytes", type=int, default=2_000_000_000)
    ap.add_argument("--golden-only", action="store_true",
                    help="only remake OUT/golden.safetensors from the exported model in OUT (same data split)")
    args = ap.parse_args()
    t_start = time.time()
    if args.golden_only:
        from tokenizers import Tokenizer
        import tiny_golden
        tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
        train_f, held_f, roots, cst = collect_files(args.max_bytes)
        eos = [tok.token_to_id(s) for s in ("<|endoftext|>", "<|user|>", "<|observation|>")]
        held_s = encode_stream(tok, [t for _, t in held_f], eos[0])
        tiny_golden.make(args.out, tok, held_f, held_s, eos, log)
        return
    torch.manual_seed(0)
    if args.smoke:
        args.max_bytes, args.minutes = 3_000_000, 0.25
    train_f, held_f, roots, cst = collect_files(args.max_bytes)
    tb = sum(len(t) for _, t in train_f)
    hb = sum(len(t) for _, t in held_f)
    log(f"data: {len(train_f)} train files ({tb / 1e6:.1f} MB), {len(held_f)} held-out ({hb / 1e6:.2f} MB) "
        f"from {roots}; {cst}")
    tok = train_tokenizer([t for _, t in train_f], 25_000_000 if not args.smoke else 2_000_000)
    eos = tok.token_to_id("<|endoftext|>")
    log(f"tokenizer trained: vocab {tok.get_vocab_size()}")
    train_s = encode_stream(tok, [t for _, t in train_f], eos)
    held_s = encode_stream(tok, [t for _, t in held_f], eos)
    if len(held_s) < 8 * args.seq:  # smoke runs: too little held-out text
        held_s = np.concatenate([held_s, train_s[-8 * args.seq:]])
    log(f"tokens: train {len(train_s)}, held-out {len(held_s)} ({tb / len(train_s):.2f} bytes/token)")

    cfg = dict(CFG)
    model = G.GlmMoeDsa(cfg, with_mtp=1).cuda()
    init_model(model, cfg["initializer_range"])
    n_params = G.param_count(model)
    n_emb = 3 * cfg["vocab_size"] * cfg["hidden_size"]
    log(f"params {n_params} ({n_params * 2 / 2**20:.1f} MiB bf16); embeddings+heads {n_emb}; "
        f"indexer types {G.indexer_types(cfg)}")
    assert n_params * 2 < 32 * 2**20
    set_dense_compute(model, True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    gen = torch.Generator().manual_seed(1)
    it = batches(train_s, args.bs, args.seq, gen)
    budget = args.minutes * 60
    if args.deadline > 0:
        budget = min(budget, args.deadline - (time.time() - t_start) - args.reserve)
    log(f"training budget {budget:.0f}s (bs {args.bs} x {args.seq}, lr {args.lr}, warm-up {args.warmup})")
    t0 = time.time()
    step, ema, tokens, hist = 0, None, 0, []
    dense_frac = 0.15
    preflight = not args.no_preflight
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        for gp in opt.param_groups:
            gp["lr"] = lr
        sparse = frac >= dense_frac
        x = next(it).cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lm, ld, li, loss = losses(model, x, sparse, True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        update_router_bias(model, 1e-3)
        tokens += x.shape[0] * (x.shape[1] - 2)
        step += 1
        if step % 25 == 0 or step == 1:
            v = (lm.item(), ld.item(), li.item())
            ema = v if ema is None else tuple(0.8 * a + 0.2 * b for a, b in zip(ema, v))
            hist.append((step, *v))
        if step % 100 == 0 or step == 1:
            el = time.time() - t0
            log(f"step {step} frac {frac:.2f} {'sparse' if sparse else 'dense'} lr {lr:.2e} loss {lm.item():.3f} "
                f"mtp {ld.item():.3f} idxKL {li.item():.3f} tok/s {tokens / el:.0f}")
        if preflight and step == args.preflight_step:
            # run every later stage once on tiny sizes now; its time is not taken from training
            tp = time.time()
            log("preflight: post-training stages + golden on tiny sizes")
            post_training(model, tok, cfg, args, "/tmp/preflight-model", held_f, train_f, held_s, train_s, quick=True)
            import tiny_golden
            tiny_golden.make("/tmp/preflight-model", tok, held_f, held_s, [eos], log, n_cand=2)
            set_dense_compute(model, True)
            model.train()
            preflight = False
            dt = time.time() - tp
            t0 += dt
            if args.deadline > 0:
                budget = min(budget, args.deadline - (time.time() - t_start) - args.reserve + (time.time() - t0))
            log(f"preflight passed in {dt:.1f}s; training budget {budget:.0f}s")
    train_time = time.time() - t0
    log(f"trained {step} steps, {tokens} tokens, {train_time:.0f}s; ema losses main/mtp/idx {ema}")
    set_dense_compute(model, False)
    model.eval()
    stats = dict(params=n_params, embeddings=n_emb, steps=step, tokens_seen=tokens, train_seconds=round(train_time),
                 train_loss_ema=ema[0], mtp_train_loss_ema=ema[1], idx_kl_ema=ema[2], train_files=len(train_f),
                 heldout_files=len(held_f), train_tokens=int(len(train_s)), heldout_tokens=int(len(held_s)),
                 train_mb=tb / 1e6, heldout_mb=hb / 1e6, collect=cst, bs=args.bs, seq=args.seq, lr=args.lr,
                 warmup=args.warmup, minutes=round(train_time / 60, 2), loss_history=hist, roots=roots)
    res = post_training(model, tok, cfg, args, args.out, held_f, train_f, held_s, train_s)
    stats.update(res)
    with open(os.path.join(args.out, "train_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)

    # golden from HF + glm5_torch MTP
    import tiny_golden
    try:
        stats["golden"] = tiny_golden.make(args.out, tok, held_f, held_s, res["eos"], log)
    except Exception:  # keep the trained model; the golden can be remade with --golden-only
        import traceback
        log("GOLDEN FAILED:\n" + traceback.format_exc())
    with open(os.path.join(args.out, "train_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    log(f"total wall {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
