"""Compact PyTorch reference of the GLM-5 / GLM-5.2 (glm_moe_dsa) forward, plus the MTP layer.

Parameter names are the Hugging Face checkpoint names (per-expert tensors), so
`load_checkpoint(dir)` reads a real/our checkpoint folder and `model.state_dict()` writes one.
The MTP layer lives at `model.layers.{num_hidden_layers}` (enorm, hnorm, eh_proj, a full decoder
block with indexer + MoE, shared_head.norm, shared_head.head), as GLM-5/DeepSeek-V3 checkpoints
store it; the HF model ignores it.

Numerics follow transformers 5.17 GlmMoeDsaForCausalLM (checked by tools/make_golden.py):
  * RoPE on the rope slices with interleaved pairs (2i, 2i+1) rotated by inv_freq[i]
    (config `rope_interleave`, default True; the indexer uses `indexer_rope_interleave`, default
    = rope_interleave).  Dot products are what matters: HF's permuted layout gives the same scores.
  * main attention: q = [nope | rope], k = [k_nope | rope(k_pe)], scale qk_head_dim^-0.5,
    restricted to (indexer top-k) AND causal.  Indexer: q = [rope | nope] from wq_b(q_resid),
    k = LayerNorm(wk(x)) = [rope | nope]; score = sum_h relu(q_h.k * d^-0.5) * w_h * H^-0.5,
    top-min(index_topk, T) over causal positions.  "shared" layers reuse the previous top-k.
  * MoE router: sigmoid(fp32 logits); choice on score + e_score_correction_bias, group-limited
    (sum of top-2 per group); weights = sigmoid scores of the chosen, normalised, * scaling.

Usage (fp32):  model = load_checkpoint("models/glm5-tiny-code"); logits = model(ids)["logits"]
MTP draft:     out = model(ids); d = model.mtp(out["h_prenorm"], next_ids)  -> d["logits"], d["h"]
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def indexer_types(cfg):
    """'full'/'shared' per decoder layer, like GlmMoeDsaConfig."""
    L = cfg["num_hidden_layers"]
    if cfg.get("indexer_types"):
        return list(cfg["indexer_types"])[:L]
    pat = cfg.get("index_topk_pattern")
    if pat:
        return ["full" if c == "F" else "shared" for c in pat][:L]
    freq = max(int(cfg.get("index_topk_freq") or 1), 1)
    off = cfg.get("index_skip_topk_offset")
    off = 2 if off is None else int(off)
    return ["full" if max(i - off + 1, 0) % freq == 0 else "shared" for i in range(L)]


def mlp_types(cfg):
    if cfg.get("mlp_layer_types"):
        return list(cfg["mlp_layer_types"])
    k = cfg.get("first_k_dense_replace", 0)
    return ["dense" if i < k else "sparse" for i in range(cfg["num_hidden_layers"])]


def rope_theta(cfg):
    rp = cfg.get("rope_parameters") or {}
    return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(positions, dim, theta, device):
    """positions [T] -> cos, sin [T, dim/2] (fp32, same arithmetic as HF)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    freqs = positions.to(device).float()[:, None] * inv[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope(x, cos, sin, interleave):
    """x [B, T, h, d]; cos/sin [T, d/2]."""
    c = cos[None, :, None, :].to(x.dtype)
    s = sin[None, :, None, :].to(x.dtype)
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Indexer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.nh, self.hd = cfg["index_n_heads"], cfg["index_head_dim"]
        self.rope = cfg["qk_rope_head_dim"]
        self.wq_b = nn.Linear(cfg["q_lora_rank"], self.nh * self.hd, bias=False)
        self.wk = nn.Linear(cfg["hidden_size"], self.hd, bias=False)
        self.k_norm = nn.LayerNorm(self.hd, eps=1e-6)
        self.weights_proj = nn.Linear(cfg["hidden_size"], self.nh, bias=False)
        self.interleave = cfg.get("indexer_rope_interleave", cfg.get("rope_interleave", True))

    def forward(self, x, q_resid, cos, sin):
        """Index scores [B, S, T] (fp32, unmasked)."""
        B, T, _ = x.shape
        q = self.wq_b(q_resid).view(B, T, self.nh, self.hd)
        q = torch.cat([apply_rope(q[..., : self.rope], cos, sin, self.interleave), q[..., self.rope:]], -1)
        k = self.k_norm(self.wk(x)).view(B, T, 1, self.hd)
        k = torch.cat([apply_rope(k[..., : self.rope], cos, sin, self.interleave), k[..., self.rope:]], -1)[:, :, 0]
        w = self.weights_proj(x).float() * self.nh ** -0.5
        s = torch.einsum("bshd,btd->bsht", q.float(), k.float()) * self.hd ** -0.5
        return torch.einsum("bsht,bsh->bst", F.relu(s), w)


class Attention(nn.Module):
    def __init__(self, cfg, has_indexer):
        super().__init__()
        self.H = cfg["num_attention_heads"]
        self.nope, self.rope, self.vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.kv_lora = cfg["kv_lora_rank"]
        hs, ql = cfg["hidden_size"], cfg["q_lora_rank"]
        self.q_a_proj = nn.Linear(hs, ql, bias=False)
        self.q_a_layernorm = RMSNorm(ql)
        self.q_b_proj = nn.Linear(ql, self.H * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hs, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.H * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(self.H * self.vd, hs, bias=False)
        self.indexer = Indexer(cfg) if has_indexer else None
        self.topk = cfg["index_topk"]
        self.interleave = cfg.get("rope_interleave", True)

    def forward(self, x, cos, sin, causal, prev_topk=None, sparse=True, train_indexer=False):
        """x [B,T,hs]; causal [T,T] bool. Returns out, selected-mask [B,T,T] (or None), aux dict."""
        B, T, _ = x.shape
        aux = {}
        q_resid = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_resid).view(B, T, self.H, self.nope + self.rope)
        q = torch.cat([q[..., : self.nope], apply_rope(q[..., self.nope:], cos, sin, self.interleave)], -1)
        kv = self.kv_a_proj_with_mqa(x)
        c, k_pe = kv[..., : self.kv_lora], kv[..., self.kv_lora:]
        kvb = self.kv_b_proj(self.kv_a_layernorm(c)).view(B, T, self.H, self.nope + self.vd)
        k_nope, v = kvb[..., : self.nope], kvb[..., self.nope:]
        k_pe = apply_rope(k_pe.reshape(B, T, 1, self.rope), cos, sin, self.interleave).expand(B, T, self.H, self.rope)
        k = torch.cat([k_nope, k_pe], -1)

        sel = prev_topk
        if self.indexer is not None:
            if train_indexer:
                idx = self.indexer(x.detach(), q_resid.detach(), cos, sin)
                aux["index_scores"] = idx
                idx_sel = idx.detach()
            else:
                with torch.no_grad():
                    idx_sel = self.indexer(x, q_resid, cos, sin)
            with torch.no_grad():
                kk = min(self.topk, T)
                top = idx_sel.masked_fill(~causal, float("-inf")).topk(kk, dim=-1).indices
                sel = torch.zeros(B, T, T, dtype=torch.bool, device=x.device).scatter_(-1, top, True)
        allowed = causal[None] & sel if (sparse and sel is not None) else causal[None].expand(B, T, T)

        scores = torch.einsum("bshd,bthd->bhst", q, k) * (self.nope + self.rope) ** -0.5
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        if train_indexer:
            aux["attn_target"] = probs.detach().float().sum(1) / self.H  # [B,S,T]
        out = torch.einsum("bhst,bthd->bshd", probs, v).reshape(B, T, self.H * self.vd)
        return self.o_proj(out), sel, aux


class MLP(nn.Module):
    def __init__(self, hs, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hs, inter, bias=False)
        self.up_proj = nn.Linear(hs, inter, bias=False)
        self.down_proj = nn.Linear(inter, hs, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, E, hs):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(E, hs))
        self.register_buffer("e_score_correction_bias", torch.zeros(E, dtype=torch.float32))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hs, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
        self.E, self.k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
        self.n_group, self.topk_group = cfg.get("n_group", 1) or 1, cfg.get("topk_group", 1) or 1
        self.norm = cfg.get("norm_topk_prob", True)
        self.scale = cfg.get("routed_scaling_factor", 1.0)
        self.experts = nn.ModuleList([MLP(hs, inter) for _ in range(self.E)])
        self.gate = Gate(self.E, hs)
        self.shared_experts = MLP(hs, inter * cfg.get("n_shared_experts", 1))
        self.dense_compute = False  # training: run every expert batched (weights zero if unrouted)
        self.last_counts = None

    def route(self, x):
        """x [N, hs] -> (indices [N,k], weights [N,k] fp32, scores_for_choice [N,E], group_scores)."""
        s = F.linear(x.float(), self.gate.weight.float()).sigmoid()
        choice = s + self.gate.e_score_correction_bias.float()
        N = x.shape[0]
        gs = choice.view(N, self.n_group, -1).topk(2, dim=-1)[0].sum(-1)
        gidx = gs.topk(self.topk_group, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1).bool()
        smask = gmask[:, :, None].expand(N, self.n_group, self.E // self.n_group).reshape(N, self.E)
        choice_m = choice.masked_fill(~smask, float("-inf"))
        idx = choice_m.topk(self.k, dim=-1, sorted=False)[1]
        w = s.gather(1, idx)
        if self.norm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.scale, choice_m, gs

    def forward(self, x):
        shp = x.shape
        xf = x.reshape(-1, shp[-1])
        idx, w, _, _ = self.route(xf)
        with torch.no_grad():
            self.last_counts = torch.bincount(idx.flatten(), minlength=self.E)
        if self.dense_compute:
            cw = torch.zeros(xf.shape[0], self.E, device=x.device, dtype=torch.float32).scatter(1, idx, w).to(xf.dtype)
            wg = torch.stack([e.gate_proj.weight for e in self.experts])
            wu = torch.stack([e.up_proj.weight for e in self.experts])
            wd = torch.stack([e.down_proj.weight for e in self.experts])
            h = F.silu(torch.einsum("nh,eih->nei", xf, wg)) * torch.einsum("nh,eih->nei", xf, wu)
            out = torch.einsum("nei,ehi->nh", h * cw[:, :, None], wd)
        else:
            out = torch.zeros_like(xf)
            for e in range(self.E):
                tok, slot = torch.where(idx == e)
                if tok.numel():
                    y = self.experts[e](xf[tok]) * w[tok, slot, None].to(xf.dtype)
                    out.index_add_(0, tok, y)
        return (out + self.shared_experts(xf)).view(shp)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, has_indexer, sparse_mlp):
        super().__init__()
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = Attention(cfg, has_indexer)
        self.mlp = MoE(cfg) if sparse_mlp else MLP(cfg["hidden_size"], cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(cfg["hidden_size"], eps)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], eps)

    def forward(self, x, cos, sin, causal, prev_topk=None, sparse=True, train_indexer=False):
        a, sel, aux = self.self_attn(self.input_layernorm(x), cos, sin, causal, prev_topk, sparse, train_indexer)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, sel, aux


class SharedHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6))
        self.head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)


class MTPLayer(DecoderLayer):
    """DeepSeek-V3 / GLM-5 style next-token-prediction layer (always a full indexer, MoE)."""

    def __init__(self, cfg):
        super().__init__(cfg, True, True)
        hs, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.enorm = RMSNorm(hs, eps)
        self.hnorm = RMSNorm(hs, eps)
        self.eh_proj = nn.Linear(2 * hs, hs, bias=False)
        self.shared_head = SharedHead(cfg)


class GlmMoeDsa(nn.Module):
    def __init__(self, cfg, with_mtp=None):
        super().__init__()
        self.cfg = cfg
        L = cfg["num_hidden_layers"]
        self.itypes, self.mtypes = indexer_types(cfg), mlp_types(cfg)
        self.n_mtp = cfg.get("num_nextn_predict_layers", 0) if with_mtp is None else int(with_mtp)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        layers = [DecoderLayer(cfg, self.itypes[i] == "full", self.mtypes[i] == "sparse") for i in range(L)]
        layers += [MTPLayer(cfg) for _ in range(self.n_mtp)]
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6))
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def _rope(self, T, start, device):
        pos = torch.arange(start, start + T, device=device)
        return rope_cos_sin(pos, self.cfg["qk_rope_head_dim"], rope_theta(self.cfg), device)

    def forward(self, ids, sparse=True, train_indexer=False, start_pos=0):
        """ids [B,T] -> dict(logits, h_prenorm, hidden (list: embeddings + each layer, pre-norm), aux)."""
        B, T = ids.shape
        cos, sin = self._rope(T, start_pos, ids.device)
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        x = self.model.embed_tokens(ids)
        hidden, auxs, sel = [x], [], None
        for i in range(self.cfg["num_hidden_layers"]):
            x, sel, aux = self.model.layers[i](x, cos, sin, causal, sel, sparse, train_indexer)
            hidden.append(x)
            auxs.append(aux)
        logits = self.lm_head(self.model.norm(x))
        return {"logits": logits, "h_prenorm": x, "hidden": hidden, "aux": auxs}

    def mtp(self, h_prev, next_ids, sparse=True, train_indexer=False, start_pos=0, depth=0):
        """h_prev [B,T,hs] = main (or previous draft) hidden BEFORE the final norm at positions t;
        next_ids [B,T] = token t+1. Returns logits (predicting t+2) and the block output h (pre-norm)."""
        lay = self.model.layers[self.cfg["num_hidden_layers"] + depth]
        B, T = next_ids.shape
        cos, sin = self._rope(T, start_pos, next_ids.device)
        causal = torch.ones(T, T, dtype=torch.bool, device=next_ids.device).tril()
        e = self.model.embed_tokens(next_ids)
        x = lay.eh_proj(torch.cat([lay.enorm(e), lay.hnorm(h_prev)], -1))
        x, _, aux = lay(x, cos, sin, causal, None, sparse, train_indexer)
        logits = lay.shared_head.head(lay.shared_head.norm(x))
        return {"logits": logits, "h": x, "aux": [aux]}


def load_config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def load_checkpoint(path, dtype=torch.float32, device="cpu", with_mtp=None, cfg_overrides=None):
    """Load a checkpoint folder (model*.safetensors) into GlmMoeDsa. Returns the model; the
    attribute `load_report` lists missing / unexpected keys."""
    from safetensors.torch import load_file
    import glob

    cfg = load_config(path)
    cfg.update(cfg_overrides or {})
    model = GlmMoeDsa(cfg, with_mtp)
    sd = {}
    for f in sorted(glob.glob(os.path.join(path, "model*.safetensors"))):
        sd.update(load_file(f))
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    for k, v in sd.items():
        if k in own:
            own[k].copy_(v.to(own[k].dtype))
    model.load_report = {"missing": missing, "unexpected": unexpected}
    model = model.to(device=device, dtype=dtype)
    for k, v in sd.items():  # router bias stays fp32, exactly as stored
        if k.endswith("e_score_correction_bias") and k in own:
            model.get_submodule(k.rsplit(".", 1)[0]).e_score_correction_bias.data = v.float().to(device)
    return model


def param_count(model):
    return sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
