#!/usr/bin/env python3
"""PyTorch reference values for vramlab (CPU, float32).

vramlab's tests compare against what this script writes; the tests never
need PyTorch themselves. Install once: `pip install torch safetensors`
(the CPU wheel is enough: `pip install torch --index-url
https://download.pytorch.org/whl/cpu`).

Commands:
  fixtures [--out tests/fixtures/torch]
      the small committed fixtures: every zoo model x every optimizer, plus
      softmax / MSE op values.
  truth [--out tests/fixtures/torch]
      beside each committed case, truth.safetensors: the same steps in
      float64 (stored as f32). PyTorch's own f32 results carry rounding error
      too (simple-cnn-adam's conv1 weight gradient: 9.6e-5 from the truth);
      the tests judge vramlab against the truth and against PyTorch allowing
      PyTorch's own error.
  case --model M --optimizer O [--seed S] [--steps N] [--batch B] --dir D
      fresh random weights and batch for one model: writes D/weights.safetensors,
      D/batch.safetensors, D/expected.safetensors and prints the matching
      `vramlab train` command.
  amp [--out tests/fixtures/torch-amp]
      mixed precision: every zoo model, two Adam steps under
      torch.autocast("cpu", dtype) for bfloat16 and float16 (float16 with
      torch.amp.GradScaler("cpu"), PyTorch's defaults). Softmax is taken in
      float32, as CUDA's autocast policy (which vramlab follows) does.
  snapshot-check FILE
      loads a PyTorch memory snapshot that vramlab wrote (`profile --out DIR`
      writes DIR/snapshot.pickle) with Python's pickle and renders it with
      torch.cuda._memory_viz's segment_plot and trace_plot; checks that every
      segment is tiled by its blocks.
  compare EXPECTED DUMP [--tol 1e-4]
      the largest relative error per tensor between PyTorch's values and a
      `vramlab train --dump` file; exit status 1 if any exceeds the tolerance.

The models mirror vramlab's zoo exactly (names, layouts, op order):
mlp, simple-cnn, resnet-mini, attention.
"""

import argparse
import glob
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

torch.set_default_dtype(torch.float32)


class Mlp(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class SimpleConvNet(nn.Module):
    """The documents' SimpleConvNet (seed 002)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3)
        self.conv2 = nn.Conv2d(64, 128, 3)
        self.fc = nn.Linear(128 * 28 * 28, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride) if stride != 1 else None

    def forward(self, x):
        r = self.conv2(F.relu(self.conv1(x)))
        s = self.shortcut(x) if self.shortcut is not None else x
        return F.relu(r + s)


class ResnetMini(nn.Module):
    def __init__(self, width, depth, classes):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        blocks, ch = [], width
        for i in range(depth):
            out, stride = (ch, 1) if i == 0 else (ch * 2, 2)
            blocks.append(Block(ch, out, stride))
            ch = out
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(ch, classes)

    def forward(self, x):
        x = F.relu(self.stem(x))
        for b in self.blocks:
            x = b(x)
        return self.fc(x.mean(dim=(2, 3)))



class Attention(nn.Module):
    def __init__(self, dim, hidden, classes):
        super().__init__()
        self.attn = nn.Module()
        # No key bias: its gradient is zero in exact arithmetic (softmax
        # ignores a per-row constant), so Adam would update it by noise.
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self.attn, n, nn.Linear(dim, dim, bias=n != "k_proj"))
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(dim, hidden)
        self.mlp.fc2 = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        d = x.shape[-1]
        q, k, v = self.attn.q_proj(x), self.attn.k_proj(x), self.attn.v_proj(x)
        # .float(): softmax in float32, as CUDA's autocast runs it (a no-op
        # outside autocast; CPU autocast would keep it 16-bit).
        a = torch.softmax((q @ k.transpose(1, 2) / math.sqrt(d)).float(), dim=-1)
        h = x + self.attn.out_proj(a @ v)
        h = h + self.mlp.fc2(F.relu(self.mlp.fc1(h)))
        return self.head(h.mean(dim=1))


# Small sizes for the committed fixtures; `case` can take larger ones.
SMALL = {
    "mlp": dict(widths=[13, 17, 9, 5], batch=6),
    # fc has 25,088 inputs: at the others' learning rates two steps fit a
    # batch of 2 to a loss of ~0, whose relative error says nothing.
    "simple-cnn": dict(batch=2, lr_scale=0.01),
    "resnet-mini": dict(width=4, depth=3, resolution=9, classes=7, batch=3),
    "attention": dict(seq_len=7, dim=12, hidden=20, classes=5, batch=3),
}

OPTIMIZERS = {
    # name: (constructor, flags for `vramlab train`)
    "sgd": dict(lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": dict(lr=1e-3, weight_decay=0.0),
    "adamw": dict(lr=1e-3, weight_decay=0.01),
}


def build(model, cfg):
    if model == "mlp":
        return Mlp(cfg["widths"]), [cfg["widths"][0]], cfg["widths"][-1]
    if model == "simple-cnn":
        return SimpleConvNet(), [3, 32, 32], 10
    if model == "resnet-mini":
        r = cfg["resolution"]
        return ResnetMini(cfg["width"], cfg["depth"], cfg["classes"]), [3, r, r], cfg["classes"]
    if model == "attention":
        return Attention(cfg["dim"], cfg["hidden"], cfg["classes"]), [cfg["seq_len"], cfg["dim"]], cfg["classes"]
    raise SystemExit(f"unknown model {model!r}")


def hyper(name, cfg):
    h = dict(OPTIMIZERS[name])
    h["lr"] *= cfg.get("lr_scale", 1.0)
    return h


def optimizer(name, params, cfg):
    h = hyper(name, cfg)
    if name == "sgd":
        return torch.optim.SGD(params, lr=h["lr"], momentum=h["momentum"], weight_decay=h["weight_decay"])
    if name == "adam":
        return torch.optim.Adam(params, lr=h["lr"], weight_decay=h["weight_decay"])
    return torch.optim.AdamW(params, lr=h["lr"], weight_decay=h["weight_decay"])


def f16_exact(t):
    """Rounds to values f16 represents exactly, so weights can be stored in
    half the bytes and still be the very values PyTorch computed with."""
    return t.half().float()


def train_steps(net, opt, x, y, steps):
    """`steps` training steps; the last step's logits, loss and gradients
    and the parameters after it, as the fixtures name them."""
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        logits = net(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
        opt.step()
    out = {"logits": logits.detach().clone(), "loss": loss.detach().reshape(())}
    for n, p in net.named_parameters():
        out[f"grad.{n}"] = grads[n]
        out[f"param.{n}"] = p.detach().clone()
    return out


def train_steps_amp(net, opt, x, y, steps, dtype):
    """`train_steps` under autocast to `dtype` (float16: with GradScaler,
    whose gradients are reported unscaled, as the optimizer sees them)."""
    scaler = torch.amp.GradScaler("cpu") if dtype == torch.float16 else None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype):
            logits = net(x)
            loss = F.cross_entropy(logits, y)
        if scaler is None:
            loss.backward()
            grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
            scaler.step(opt)
            scaler.update()
    out = {"logits": logits.detach().float().clone(), "loss": loss.detach().float().reshape(())}
    for n, p in net.named_parameters():
        out[f"grad.{n}"] = grads[n]
        out[f"param.{n}"] = p.detach().clone()
    if scaler is not None:
        out["grad_scale"] = torch.tensor(scaler.get_scale(), dtype=torch.float32).reshape(())
    return out


def grad_scaler_sequence(path):
    """torch.amp.GradScaler's scale after each step of a fixed overflow
    pattern (growth_interval 3, so growth shows within a few steps)."""
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=3)
    pattern = [True] + [False] * 6 + [True, True] + [False] * 4
    scales = []
    for bad in pattern:
        scaler.scale(torch.tensor(1.0))
        p.grad = torch.tensor([1.0, float("inf") if bad else 2.0, 3.0])
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    with open(path, "w") as f:
        json.dump({"growth_interval": 3, "init_scale": 65536.0, "overflow": pattern,
                   "scales": scales, "torch": torch.__version__}, f, indent=1)
        f.write("\n")


def grad_scaler_fused(path):
    """Optimizers under torch.amp.GradScaler through a fixed overflow pattern
    (the first step overflows): the parameters, the state and the scale
    after each step. Fused Adam and AdamW take `found_inf` on the device
    (`_step_supports_amp_scaling`): their state is made on the skipped first
    step, step counts back at 0; unfused ones are skipped by the host and make
    none. Fused SGD with momentum is left out: its `empty_like` buffers from a
    skipped first step are read as they are at the next (garbage), so the
    unfused SGD's values are what vramlab's fused SGD is held to."""
    pattern = [True, False, False, True, False]
    grads = [[0.25, -1.5, 3.0], [0.5, 0.125, -2.0], [-1.0, 2.5, 0.75], [1.0, 1.0, 1.0],
             [0.375, -0.25, 1.5]]
    runs = {}
    for name, make in (
        ("adam-fused", lambda ps: torch.optim.Adam(ps, lr=0.1, fused=True)),
        ("adamw-fused", lambda ps: torch.optim.AdamW(ps, lr=0.1, fused=True)),
        ("adam", lambda ps: torch.optim.Adam(ps, lr=0.1, foreach=False)),
        ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False)),
    ):
        p = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
        opt = make([p])
        scaler = torch.amp.GradScaler("cpu")
        steps = []
        for bad, g in zip(pattern, grads):
            scale = scaler.get_scale()
            scaler.scale(torch.tensor(1.0))
            scaled = [v * scale for v in g]
            if bad:
                scaled[1] = float("inf")
            p.grad = torch.tensor(scaled)
            scaler.step(opt)
            scaler.update()
            st = opt.state.get(p, {})
            steps.append({
                "param": p.detach().tolist(),
                "state": sorted(st.keys()),
                "step": float(st["step"]) if "step" in st else None,
                "scale": scaler.get_scale(),
            })
        runs[name] = steps
    with open(path, "w") as f:
        json.dump({"overflow": pattern, "grads": grads, "lr": 0.1, "momentum": 0.9,
                   "runs": runs, "torch": torch.__version__}, f, indent=1)
        f.write("\n")


def step_meta(model, opt_name, cfg, steps, **extra):
    """A fixture's metadata: the model, the optimizer and its hyper-parameters
    as `vramlab train` takes them, the steps, torch's version; then `extra`."""
    h = hyper(opt_name, cfg)
    return {
        "model": model,
        "optimizer": opt_name,
        "steps": str(steps),
        "lr": repr(h["lr"]),
        "momentum": repr(h.get("momentum", 0.0)),
        "weight_decay": repr(h["weight_decay"]),
        "torch": torch.__version__,
        **extra,
    }


def cmd_amp(a):
    os.makedirs(a.out, exist_ok=True)
    grad_scaler_sequence(f"{a.out}/grad_scaler.json")
    print(f"wrote {a.out}/grad_scaler.json")
    grad_scaler_fused(f"{a.out}/grad_scaler_fused.json")
    print(f"wrote {a.out}/grad_scaler_fused.json")
    for model, cfg in SMALL.items():
        for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16)):
            half = model == "simple-cnn"
            torch.manual_seed(7)
            net, input_shape, classes = build(model, cfg)
            x = torch.randn(cfg["batch"], *input_shape)
            y = torch.randint(0, classes, (cfg["batch"],), dtype=torch.int64)
            if half:
                with torch.no_grad():
                    for p in net.parameters():
                        p.copy_(f16_exact(p))
                x = f16_exact(x)
            weights = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
            opt = optimizer("adam", net.parameters(), cfg)
            expected = train_steps_amp(net, opt, x, y, 2, dtype)
            meta = step_meta(model, "adam", cfg, 2, amp=name)
            d = f"{a.out}/{model}-{name}"
            save_case(d, weights, {"x": x, "y": y}, expected, meta, half=half,
                      stride_above=20000 if half else None)
            print(f"wrote {d}")


def case(model, opt_name, seed, steps, cfg, half=False):
    """Returns (weights, batch, expected, metadata) tensors dicts."""
    torch.manual_seed(seed)
    net, input_shape, classes = build(model, cfg)
    batch = cfg["batch"]
    x = torch.randn(batch, *input_shape)
    y = torch.randint(0, classes, (batch,), dtype=torch.int64)
    if half:
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(f16_exact(p))
        x = f16_exact(x)
    weights = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    opt = optimizer(opt_name, net.parameters(), cfg)
    expected = train_steps(net, opt, x, y, steps)
    return weights, {"x": x, "y": y}, expected, step_meta(model, opt_name, cfg, steps)


def train_command(meta, d):
    flags = f"--lr {meta['lr']} --weight-decay {meta['weight_decay']}"
    if meta["optimizer"] == "sgd":
        flags += f" --momentum {meta['momentum']}"
    return (
        f"vramlab train --model {meta['model']} --optimizer {meta['optimizer']} {flags} "
        f"--steps {meta['steps']} --load {d}/weights.safetensors --data {d}/batch.safetensors "
        f"--dump {d}/dump.safetensors"
    )


def save_case(d, weights, batch, expected, meta, half=False, stride_above=None):
    os.makedirs(d, exist_ok=True)
    if half:
        weights = {k: v.half() for k, v in weights.items()}
        batch = {"x": batch["x"].half(), "y": batch["y"]}
    save_file(weights, f"{d}/weights.safetensors")
    save_file(batch, f"{d}/batch.safetensors")
    if stride_above is not None:
        # Large tensors keep every k-th element (flattened) to keep the
        # repository small; the test takes the same elements of its own.
        for k, v in list(expected.items()):
            if v.numel() > stride_above:
                expected[k] = v.flatten()[::97].contiguous()
                meta[f"stride.{k}"] = "97"
    save_file({k: v.contiguous() for k, v in expected.items()}, f"{d}/expected.safetensors", metadata=meta)


def ops_fixture(path):
    torch.manual_seed(1234)
    out = {}
    x = torch.randn(5, 11, requires_grad=True)
    y = torch.softmax(x * 0.3, dim=-1)
    g = torch.randn(5, 11)
    (y * g).sum().backward()
    out.update({"softmax.x": x.detach(), "softmax.y": y.detach(), "softmax.g": g, "softmax.dx": x.grad})
    p = torch.randn(4, 9, requires_grad=True)
    t = torch.randn(4, 9)
    loss = F.mse_loss(p, t)
    loss.backward()
    out.update({"mse.pred": p.detach(), "mse.target": t, "mse.loss": loss.detach().reshape(()), "mse.dpred": p.grad})
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata={"softmax.scale": "0.3"})


def cmd_fixtures(a):
    for model, cfg in SMALL.items():
        for opt_name in OPTIMIZERS:
            half = model == "simple-cnn"
            steps = 2  # two steps: momentum buffers and Adam's bias correction at step 2
            w, b, e, meta = case(model, opt_name, seed=7, steps=steps, cfg=cfg, half=half)
            d = f"{a.out}/{model}-{opt_name}"
            save_case(d, w, b, e, meta, half=half, stride_above=20000 if half else None)
            print(f"wrote {d}")
    ops_fixture(f"{a.out}/ops.safetensors")
    print(f"wrote {a.out}/ops.safetensors")


def truth_of(d):
    """The float64 truth of a committed case: the same weights, batch and
    steps in float64; results rounded to f32 (2^-24 relative, far below any
    tolerance) and thinned like expected.safetensors."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(f"{d}/expected.safetensors", "pt") as f:
        meta = f.metadata()
    cfg = SMALL[meta["model"]]
    w = {k: v.double() for k, v in load_file(f"{d}/weights.safetensors").items()}
    b = load_file(f"{d}/batch.safetensors")
    net, _, _ = build(meta["model"], cfg)
    net = net.double()
    net.load_state_dict(w)
    opt = optimizer(meta["optimizer"], net.parameters(), cfg)
    out = train_steps(net, opt, b["x"].double(), b["y"], int(meta["steps"]))
    for k in list(out):
        stride = int(meta.get(f"stride.{k}", "1"))
        out[k] = out[k].flatten()[::stride].reshape(-1 if stride > 1 else out[k].shape).float().contiguous()
    return out, {"float64_truth_of": "expected.safetensors", "torch": torch.__version__}


def cmd_truth(a):
    from safetensors.torch import save_file
    for d in sorted(glob.glob(f"{a.out}/*-*/")):
        if not any(os.path.basename(d.rstrip("/")).startswith(m + "-") for m in SMALL):
            continue  # gpt-*, resnet50-*: their own scripts write their truth
        out, meta = truth_of(d.rstrip("/"))
        save_file(out, f"{d}truth.safetensors", metadata=meta)
        print(f"wrote {d}truth.safetensors")


def cmd_case(a):
    cfg = dict(SMALL[a.model])
    if a.batch:
        cfg["batch"] = a.batch
    w, b, e, meta = case(a.model, a.optimizer, a.seed, a.steps, cfg)
    save_case(a.dir, w, b, e, meta)
    print(train_command(meta, a.dir))


# Below this, a whole expected tensor is float noise around an exact zero.
ZERO = 1e-7


# Adam's update lr·g/(|g|+eps) turns rounding noise in a gradient near eps
# into visible parameter changes: for |g| below 10·eps, PyTorch's own f32 result
# differs from its f64 result by ~1e-3 relative (measured: simple-cnn, 10 of
# 1,003,520 fc weights). Such elements are judged norm-wise with their tensor.
ADAM_ILL_CONDITIONED = 1e-7


def rel_err(g, w, mask=None):
    """Max over elements of |g - w| / max(|w|, 1e-2·max|w|), and the
    norm-wise ||g - w|| / ||w||."""
    scale = w.abs().max().item()
    if scale < ZERO:
        # Zero in exact arithmetic: both sides are float noise; compare absolutely.
        ok = (g - w).abs().max().item() < ZERO
        return (0.0 if ok else math.inf), (0.0 if ok else math.inf)
    e = (g - w).abs() / w.abs().clamp(min=1e-2 * scale)
    if mask is not None:
        e = e[~mask]
    elem = e.max().item() if e.numel() else 0.0
    return elem, ((g - w).norm() / w.norm()).item()


def cmd_snapshot_check(a):
    import pickle
    from torch.cuda import _memory_viz
    with open(a.file, "rb") as f:
        snap = pickle.load(f)
    for seg in snap["segments"]:
        tiled = sum(b["size"] for b in seg["blocks"])
        if tiled != seg["total_size"]:
            raise SystemExit(f"segment 0x{seg['address']:x}: blocks cover {tiled} of {seg['total_size']} bytes")
    seg_html = _memory_viz.segment_plot(snap)
    trace_html = _memory_viz.trace_plot(snap)
    print(f"{a.file}: {len(snap['segments'])} segments, {len(snap['device_traces'][0])} trace entries; "
          f"segment_plot {len(seg_html)} chars, trace_plot {len(trace_html)} chars: ok")


def cmd_compare(a):
    want = load_file(a.expected)
    got = load_file(a.dump)
    with open(a.expected, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        meta = json.loads(fh.read(n)).get("__metadata__", {})
    adam = meta.get("optimizer") in ("adam", "adamw")
    worst = 0.0
    for k, w in sorted(want.items()):
        if k not in got:
            print(f"{k}: missing from {a.dump}")
            worst = math.inf
            continue
        g = got[k].reshape(w.shape).double()
        w = w.double()
        mask, note = None, ""
        if adam and k.startswith("param.") and "grad." + k[6:] in want:
            gw = want["grad." + k[6:]]
            mask = (gw.abs() < ADAM_ILL_CONDITIONED) & (gw != 0)
            if mask.any():
                note = f"  ({mask.sum().item()} elements with 0 < |grad| < 1e-7 judged norm-wise)"
        elem, normwise = rel_err(g, w, mask)
        err = max(elem, normwise)
        worst = max(worst, err)
        flag = "" if err <= a.tol else "  <-- over tolerance"
        print(f"{k:<40} max rel err {elem:.2e}  norm-wise {normwise:.2e}{note}{flag}")
    print(f"worst: {worst:.2e} (tolerance {a.tol:g})")
    sys.exit(0 if worst <= a.tol else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures")
    f.add_argument("--out", default="tests/fixtures/torch")
    c = sub.add_parser("case")
    c.add_argument("--model", required=True, choices=list(SMALL))
    c.add_argument("--optimizer", required=True, choices=list(OPTIMIZERS))
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--steps", type=int, default=1)
    c.add_argument("--batch", type=int)
    c.add_argument("--dir", required=True)
    t = sub.add_parser("truth", help="float64 truth beside each committed case (truth.safetensors)")
    t.add_argument("--out", default="tests/fixtures/torch")
    am = sub.add_parser("amp", help="autocast (bf16, f16 + GradScaler) fixtures")
    am.add_argument("--out", default="tests/fixtures/torch-amp")
    sc = sub.add_parser("snapshot-check", help="load a vramlab-written snapshot.pickle in pickle and torch.cuda._memory_viz")
    sc.add_argument("file")
    m = sub.add_parser("compare")
    m.add_argument("expected")
    m.add_argument("dump")
    m.add_argument("--tol", type=float, default=1e-4)
    a = p.parse_args()
    {"fixtures": cmd_fixtures, "case": cmd_case, "truth": cmd_truth, "amp": cmd_amp,
     "snapshot-check": cmd_snapshot_check, "compare": cmd_compare}[a.cmd](a)


if __name__ == "__main__":
    main()
