#!/usr/bin/env python3
"""How far PyTorch's own f32 result and vramlab's are from the float64
truth, for a fixture case: reruns the case's steps in float64 from the same
weights and batch, then reports, per gradient and parameter, the normwise and
the elementwise relative error (|x - t| / max(|t|, 1e-2·max|t|), the metric of
tests/torch_fixtures.rs) of each side.

    python3 scripts/f64_truth.py tests/fixtures/torch/simple-cnn-adam VRAMLAB_DUMP.safetensors
"""
import sys
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
sys.path.insert(0, "scripts")
import torch_reference as ref

d, dump = sys.argv[1], sys.argv[2]
w = load_file(f"{d}/weights.safetensors")
b = load_file(f"{d}/batch.safetensors")
from safetensors import safe_open
with safe_open(f"{d}/expected.safetensors", "pt") as f:
    meta = f.metadata()
exp = load_file(f"{d}/expected.safetensors")
mine = load_file(dump)
net, _, _ = ref.build(meta["model"], ref.SMALL[meta["model"]])
net.load_state_dict(w)
net = net.double()
opt = ref.optimizer(meta["optimizer"], net.parameters(), ref.SMALL[meta["model"]])
x, y = b["x"].double(), b["y"]
for _ in range(int(meta["steps"])):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in net.named_parameters()}
    opt.step()


def errs(got, t):
    got, t = got.double().flatten(), t.flatten()
    scale = t.abs().max().clamp_min(1e-30)
    elem = ((got - t).abs() / torch.maximum(t.abs(), 1e-2 * scale)).max().item()
    norm = ((got - t).norm() / t.norm().clamp_min(1e-30)).item()
    return elem, norm


print(f"{'tensor':<22} {'torch f32 elem':>15} {'vramlab elem':>13} {'torch norm':>11} {'vramlab norm':>13}")
for n, p in net.named_parameters():
    for kind, truth in (("grad", grads[n]), ("param", p.detach())):
        k = f"{kind}.{n}"
        stride = int(meta.get(f"stride.{k}", "1"))
        t = truth.flatten()[::stride]
        te, tn = errs(exp[k].flatten(), t)
        ve, vn = errs(mine[k].flatten()[::stride], t)
        print(f"{k:<22} {te:15.3e} {ve:13.3e} {tn:11.3e} {vn:13.3e}")
