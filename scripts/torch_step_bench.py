#!/usr/bin/env python3
"""PyTorch's figures for what `vramlab bench` measures, for a side-by-side
on the same GPU: square fp32 matmuls (GFLOP/s, TF32 off so the arithmetic
matches vramlab's f32) and the documents' SimpleConvNet training step
(batch 64, Adam lr 1e-3, cross-entropy), median of N runs timed with a
synchronize, plus the step's per-op CUDA time from torch.profiler.

    python3 scripts/torch_step_bench.py [--device cuda|cpu] [--reps 20] [--json]
"""
import argparse, json, statistics, time
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import SimpleConvNet  # noqa: E402  (the zoo's exact model)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, reps):
    fn()
    sync(dev)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "matmul": [], "step": {}}
    for n in (512, 1024, 2048):
        x = torch.rand(n, n, device=dev)
        y = torch.rand(n, n, device=dev)
        s = timed(lambda: x @ y, dev, a.reps)
        rows["matmul"].append({"n": n, "seconds": s, "gflops": 2 * n**3 / s / 1e9})
    torch.manual_seed(0)
    model = SimpleConvNet().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xb = torch.randn(a.batch, 3, 32, 32, device=dev)
    yb = torch.randint(0, 10, (a.batch,), device=dev)

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()

    rows["step"] = {"batch": a.batch, "seconds": timed(step, dev, a.reps)}
    if dev.type == "cuda":
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync(dev)
        ev = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
        rows["step"]["device_ms_total"] = sum(e.self_device_time_total for e in ev) / 1e3
        rows["step"]["top_ops"] = [(e.key, e.self_device_time_total / 1e3) for e in ev[:10]]
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"PyTorch {rows['torch']} on {rows['device']} (fp32, TF32 off)")
        for r in rows["matmul"]:
            print(f"  matmul {r['n']:>5}^3: {r['gflops']:10.1f} GFLOP/s")
        st = rows["step"]
        print(f"  SimpleConvNet Adam step, batch {a.batch}: {st['seconds']*1e3:.2f} ms")
        for k, v in st.get("top_ops", []):
            print(f"    {k:<50} {v:8.3f} ms")


if __name__ == "__main__":
    main()
