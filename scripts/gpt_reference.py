#!/usr/bin/env python3
"""PyTorch reference values for vramlab's `gpt` (CPU, float32).

The tests read what this writes and never need PyTorch themselves.
Install once: `pip install torch safetensors`.

Commands:
  fixtures [--out tests/fixtures/torch]
      gpt-{sgd,adam,adamw}/: two training steps of a small GPT (weights,
        batch, expected logits/loss/gradients/parameters), as
        torch_reference.py writes for the other zoo models;
      gpt_ops.safetensors: LayerNorm, GELU (tanh), embedding and the causal
        softmax, forward and backward, on small random inputs;
      gpt_saved.json: what autograd saves for backward, per block, in
        bytes, for a few GPT configurations (see `saved`).
  saved --layers L --heads H --dim D --seq-len S --vocab V --batch B
      prints what torch.autograd.graph.saved_tensors_hooks sees in one
      forward of nanoGPT's GPT-2 (as written there: masked_fill with a
      freshly compared mask, `att * scale`, dropout 0), each storage counted
      once and parameters left out, attributed to the block (or the
      embedding / head) whose forward saved it first.

Gpt mirrors vramlab's zoo model: GPT-2's architecture with the query, key
and value projections as three linears (the same parameters as GPT-2's
fused c_attn, split three ways), GELU's tanh form, dropout (p = 0 unless
given) through native_dropout as CUDA runs it, a tied head.
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import OPTIMIZERS, optimizer, save_case, step_meta, train_steps  # noqa: E402

torch.set_default_dtype(torch.float32)


def dropout(x, p, training):
    # CUDA's dropout (native_dropout: a bool mask saved for backward), on
    # any device; the CPU's F.dropout keeps a float noise tensor instead.
    if p == 0.0 or not training:
        return x
    return torch.native_dropout(x, p, True)[0]


class Block(nn.Module):
    def __init__(self, dim, heads, p=0.0):
        super().__init__()
        self.heads = heads
        self.p = p
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.Module()
        for n in ("q_proj", "k_proj", "v_proj", "c_proj"):
            setattr(self.attn, n, nn.Linear(dim, dim))
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp.c_proj = nn.Linear(4 * dim, dim)

    def attention(self, x, n, s, mask):
        d = x.shape[-1]
        h, hd = self.heads, d // self.heads
        q = self.attn.q_proj(x).view(n, s, h, hd).transpose(1, 2)
        k = self.attn.k_proj(x).view(n, s, h, hd).transpose(1, 2)
        v = self.attn.v_proj(x).view(n, s, h, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask[:, :, :s, :s] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = dropout(att, self.p, self.training)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(n * s, d)
        return dropout(self.attn.c_proj(y), self.p, self.training)

    def forward(self, x, n, s, mask):
        x = x + self.attention(self.ln_1(x), n, s, mask)
        m = self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + dropout(m, self.p, self.training)


class Gpt(nn.Module):
    def __init__(self, layers, heads, dim, seq_len, vocab, p=0.0):
        super().__init__()
        self.p = p
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq_len, dim)
        self.h = nn.ModuleList([Block(dim, heads, p) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.register_buffer("mask", torch.tril(torch.ones(seq_len, seq_len)).view(1, 1, seq_len, seq_len))
        self.on_block = None  # called with a name before each part's forward
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("bias"):
                    p.zero_()
                elif ".ln_" in name or name.startswith("ln_"):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)

    def mark(self, name):
        if self.on_block:
            self.on_block(name)

    def forward(self, x):
        return F.linear(self.features(x), self.wte.weight)

    def features(self, x):
        """The tied head's input: ln_f's output [N*S, D]."""
        idx = x.long()
        n, s = idx.shape
        self.mark("embedding")
        pos = torch.arange(0, s, dtype=torch.long)
        h = dropout((self.wte(idx) + self.wpe(pos)).view(n * s, -1), self.p, self.training)
        for i, blk in enumerate(self.h):
            self.mark(f"h.{i}")
            h = blk(h, n, s, self.mask)
        self.mark("head")
        return self.ln_f(h)


SMALL = dict(layers=2, heads=3, dim=12, seq_len=7, vocab=11, batch=3)


def step_case(opt_name, seed=7, steps=2, cfg=SMALL):
    torch.manual_seed(seed)
    net = Gpt(cfg["layers"], cfg["heads"], cfg["dim"], cfg["seq_len"], cfg["vocab"])
    x = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"])).float()
    y = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq_len"]), dtype=torch.int64)
    weights = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items() if k != "mask"}
    opt = optimizer(opt_name, net.parameters(), cfg)
    # Labels [B, S] flattened as the logits [B·S, V] are (the file keeps [B, S]).
    expected = train_steps(net, opt, x, y.reshape(-1), steps)
    meta = step_meta("gpt", opt_name, cfg, steps, heads=str(cfg["heads"]))
    return weights, {"x": x, "y": y}, expected, meta


def ops_fixture(path):
    torch.manual_seed(99)
    out = {}
    x = (torch.randn(5, 13) * 2 + 0.3).requires_grad_()
    w = torch.randn(13, requires_grad=True)
    b = torch.randn(13, requires_grad=True)
    y = F.layer_norm(x, (13,), w, b, 1e-5)
    g = torch.randn(5, 13)
    (y * g).sum().backward()
    out.update({"ln.x": x.detach(), "ln.w": w.detach(), "ln.b": b.detach(), "ln.g": g, "ln.y": y.detach(),
                "ln.dx": x.grad, "ln.dw": w.grad, "ln.db": b.grad})
    x = (torch.randn(301) * 4).requires_grad_()
    y = F.gelu(x, approximate="tanh")
    g = torch.randn(301)
    (y * g).sum().backward()
    out.update({"gelu.x": x.detach(), "gelu.g": g, "gelu.y": y.detach(), "gelu.dx": x.grad})
    table = torch.randn(9, 6, requires_grad=True)
    idx = torch.randint(0, 9, (17,))
    y = F.embedding(idx, table)
    g = torch.randn(17, 6)
    (y * g).sum().backward()
    out.update({"emb.table": table.detach(), "emb.idx": idx.float(), "emb.g": g, "emb.y": y.detach(),
                "emb.dtable": table.grad})
    s = 6
    x = (torch.randn(2, 3, s, s) * 3).requires_grad_()
    mask = torch.tril(torch.ones(s, s))
    y = F.softmax((x * 0.4).masked_fill(mask == 0, float("-inf")), dim=-1)
    g = torch.randn(2, 3, s, s)
    (y * g).sum().backward()
    out.update({"causal.x": x.detach(), "causal.g": g, "causal.y": y.detach(), "causal.dx": x.grad})
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata={"causal.scale": "0.4", "ln.eps": "1e-5"})


def lce_fixture(path):
    """PyTorch 2.15's chunked F.linear_cross_entropy (batch_chunk_size rows at
    a time; the last chunk partial), loss and both gradients, for a head wider
    than its input (V > D) and one narrower (V < D)."""
    torch.manual_seed(5)
    out, meta = {}, {}
    for name, (n, d, v, rows) in {"wide": (19, 12, 29, 4), "narrow": (11, 24, 7, 3)}.items():
        h = (torch.randn(n, d) * 2).requires_grad_()
        w = torch.randn(v, d, requires_grad=True)
        y = torch.randint(0, v, (n,))
        opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=rows)
        loss = F.linear_cross_entropy(h, w, y, options=opts)
        loss.backward()
        out.update({f"{name}.h": h.detach(), f"{name}.w": w.detach(), f"{name}.y": y.float(),
                    f"{name}.loss": loss.detach().reshape(1), f"{name}.dh": h.grad, f"{name}.dw": w.grad})
        meta[f"{name}.rows"] = str(rows)
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)


def saved_bytes(layers, heads, dim, seq_len, vocab, batch, dropout=0.0):
    """Per part: bytes of every storage autograd saves (first saver wins),
    split by kind, parameters left out."""
    torch.manual_seed(0)
    net = Gpt(layers, heads, dim, seq_len, vocab, dropout)
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    params |= {b.untyped_storage().data_ptr() for b in net.buffers()}
    seen = set()
    parts = {}
    state = {"part": None}
    net.on_block = lambda name: state.update(part=name)

    def pack(t):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in params or key in seen:
            return t
        seen.add(key)
        kind = "bool" if t.dtype == torch.bool else ("int64" if t.dtype == torch.int64 else
                                                     ("scalar" if t.dim() == 0 else "float"))
        part = parts.setdefault(state["part"], {"float": 0, "bool": 0, "int64": 0, "scalar": 0, "tensors": []})
        part[kind] += st.nbytes()
        part["tensors"].append([kind, list(t.shape), str(t.dtype).replace("torch.", ""), st.nbytes()])
        return t

    x = torch.randint(0, vocab, (batch, seq_len)).float()
    y = torch.randint(0, vocab, (batch * seq_len,))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = net(x)
        net.on_block = lambda name: state.update(part=name)
        state["part"] = "loss"
        loss = F.cross_entropy(logits, y)
    loss.backward()
    return {"config": dict(layers=layers, heads=heads, dim=dim, seq_len=seq_len, vocab=vocab, batch=batch,
                           dropout=dropout),
            "torch": torch.__version__, "parts": parts}


SAVED_CONFIGS = [
    dict(layers=2, heads=4, dim=64, seq_len=64, vocab=96, batch=8),
    dict(layers=3, heads=3, dim=12, seq_len=7, vocab=11, batch=3),
    dict(layers=1, heads=2, dim=32, seq_len=33, vocab=50, batch=5),
    dict(layers=2, heads=4, dim=64, seq_len=64, vocab=96, batch=8, dropout=0.1),
    dict(layers=3, heads=2, dim=16, seq_len=12, vocab=20, batch=4, dropout=0.2),
]


def cmd_fixtures(a):
    for opt_name in OPTIMIZERS:
        w, b, e, meta = step_case(opt_name)
        d = f"{a.out}/gpt-{opt_name}"
        save_case(d, w, b, e, meta)
        # The head count is not in any shape: the weights carry it.
        save_file(w, f"{d}/weights.safetensors", metadata={"heads": meta["heads"]})
        print(f"wrote {d}")
    ops_fixture(f"{a.out}/gpt_ops.safetensors")
    print(f"wrote {a.out}/gpt_ops.safetensors")
    lce_fixture(f"{a.out}/gpt_lce.safetensors")
    print(f"wrote {a.out}/gpt_lce.safetensors")
    with open(f"{a.out}/gpt_saved.json", "w") as f:
        json.dump([saved_bytes(**c) for c in SAVED_CONFIGS], f, indent=1)
    print(f"wrote {a.out}/gpt_saved.json")


def cmd_saved(a):
    r = saved_bytes(a.layers, a.heads, a.dim, a.seq_len, a.vocab, a.batch, a.dropout)
    for name, p in r["parts"].items():
        print(f"{name:10} float {p['float']:>14,}  bool {p['bool']:>10,}  int64 {p['int64']:>8,}  scalar {p['scalar']:>4}")
        if a.verbose:
            for t in p["tensors"]:
                print("            ", t)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures")
    f.add_argument("--out", default="tests/fixtures/torch")
    s = sub.add_parser("saved")
    for k, v in dict(layers=2, heads=4, dim=64, seq_len=64, vocab=96, batch=8).items():
        s.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    s.add_argument("--dropout", type=float, default=0.0)
    s.add_argument("--verbose", action="store_true")
    a = p.parse_args()
    {"fixtures": cmd_fixtures, "saved": cmd_saved}[a.cmd](a)


if __name__ == "__main__":
    main()
