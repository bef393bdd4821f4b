#!/usr/bin/env python3
"""vramlab's recorder + replay against torchinfo and PyTorch's MemTracker.

For three training steps (the builders of python/vramlab_torch/models.py):

  1. ResNet-50, batch 32, 224x224, SGD (momentum 0.9)
  2. GPT-2 small, batch 8 x 1,024 tokens, AdamW, bf16 autocast
  3. a 1.26 B-parameter decoder (llama_1b), batch 1 x 2,048, AdamW, bf16,
     activation checkpointing

it prints one markdown table (GiB = 2**30 bytes, 2 decimals) of

  * the recorder (`python -m vramlab_torch record ... --json`, run as its own
    process): the recording's time, "steps" (the recorded steps alone, from
    its JSON) and "wall" (the whole process, PyTorch's import included), and
    its peak of live tensor bytes;
  * `vramlab replay FILE.pickle --json` (no capacity):
    devices[0].replayed.peak_allocated_bytes / peak_reserved_bytes;
  * torchinfo.summary(model, input_size=..., device="meta", mode="train"):
    its "Forward/backward pass size" and "Estimated Total Size" (input +
    pass + parameters), as bytes (torchinfo prints them in MB = 1e6 bytes);
  * PyTorch's MemTracker (torch.distributed._tools.mem_tracker) on the same
    steps, on meta as its docstring shows, peak "Total" over the whole run:
    (a) plainly: torch.autocast("cuda") disables itself without a GPU (so
    the step runs in float32) and meta's scaled_dot_product_attention takes
    the math path; (b) inside vramlab_torch.record() (cuBLAS and cuDNN
    workspaces off, PyTorch's own gradient accumulation), whose CUDA
    emulation supplies the bf16 autocast and the flash-attention choice, so
    MemTracker sees the step the recorder records.

Both the recorder and MemTracker run --steps steps (default 2: the second
starts with the optimizer state alive); MemTracker needs reset_mod_stats()
between iterations. No GPU is used or needed; nothing is measured on one.

    PYTHONPATH=python python scripts/compare_estimators.py [--quick] [--vramlab PATH]

--quick: small stand-ins (seconds) to check the script itself.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

GIB = 2 ** 30

CASES = [
    dict(label="ResNet-50, batch 32, 224², SGD (momentum 0.9)",
         build="resnet50", kwargs={}, input=(32, 3, 224, 224), dtype="float32",
         target="classes:1000", optimizer="sgd", lr=0.1, amp=None, checkpoint=False),
    dict(label="GPT-2 small, batch 8 × 1,024, AdamW, bf16 autocast",
         build="gpt2", kwargs={}, input=(8, 1024), dtype="int64",
         target="tokens", optimizer="adamw", lr=1e-3, amp="bf16", checkpoint=False),
    dict(label="1.26 B decoder (`llama_1b`), batch 1 × 2,048, AdamW, bf16, checkpointing",
         build="llama_1b", kwargs={}, input=(1, 2048), dtype="int64",
         target="tokens", optimizer="adamw", lr=1e-3, amp="bf16", checkpoint=True),
]

QUICK = [
    dict(CASES[0], label="ResNet-50, batch 2, 64², SGD (momentum 0.9)", input=(2, 3, 64, 64)),
    dict(CASES[1], label="GPT-2 (2 layers, 256 wide), batch 2 × 128, AdamW, bf16 autocast",
         kwargs=dict(layers=2, heads=4, dim=256, positions=128, vocab=1000), input=(2, 128)),
    dict(CASES[2], label="decoder (2 layers, 256 wide), batch 1 × 256, AdamW, bf16, checkpointing",
         kwargs=dict(layers=2, heads=4, dim=256, hidden=704, vocab=1000, positions=256),
         input=(1, 256)),
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def default_vramlab():
    if os.environ.get("VRAMLAB_BIN"):
        return os.environ["VRAMLAB_BIN"]
    for p in ("/tmp/vramlab-bin", os.path.join(ROOT, "target/release/vramlab"),
              os.path.join(ROOT, "target/debug/vramlab")):
        if os.path.exists(p):
            return p
    return "vramlab"


def recorder_command(case, out, steps):
    cmd = [sys.executable, "-m", "vramlab_torch", "record", f"vramlab_torch.models:{case['build']}",
           "--input", ",".join(map(str, case["input"])), "--input-dtype", case["dtype"],
           "--target", case["target"], "--optimizer", case["optimizer"], "--lr", str(case["lr"]),
           "--steps", str(steps), "--out", out, "--json"]
    for k, v in case["kwargs"].items():
        cmd += ["--arg", f"{k}={json.dumps(v)}"]
    if case["optimizer"] == "sgd":
        cmd += ["--momentum", "0.9"]
    if case["amp"]:
        cmd += ["--amp", case["amp"]]
    if case["checkpoint"]:
        cmd += ["--checkpoint"]
    return cmd


def record_and_replay(case, tmp, steps, vramlab):
    out = os.path.join(tmp, case["build"] + ".pickle")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = recorder_command(case, out, steps)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"recorder failed ({p.returncode}): {p.stderr[-2000:]}")
    rec = json.loads(p.stdout)
    r = subprocess.run([vramlab, "replay", out, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"vramlab replay failed ({r.returncode}): {r.stderr[-2000:]}")
    rep = json.loads(r.stdout)["devices"][0]["replayed"]
    return dict(steps_s=rec["steps_seconds"], wall_s=wall, live=rec["peak_live_bytes"],
                allocated=rep["peak_allocated_bytes"], reserved=rep["peak_reserved_bytes"],
                params=rec["meta"]["parameters"], sdpa=rec["meta"].get("sdpa_choices"))


# -- torchinfo -----------------------------------------------------------------

def torchinfo_estimate(case):
    import torch
    from torchinfo import summary
    from vramlab_torch import models
    from vramlab_torch.step import DTYPES

    build = getattr(models, case["build"])
    with torch.device("meta"):
        model = build(**case["kwargs"])
    # torchinfo makes its input with torch.rand(...) then .to(device): on
    # meta its forward (under no_grad) costs nothing. No autocast: torchinfo
    # sizes the outputs of a float32 forward.
    s = summary(model, input_size=case["input"], dtypes=[DTYPES[case["dtype"]]], device="meta",
                mode="train", verbose=0)
    return dict(pass_bytes=s.total_output_bytes,
                total=s.total_input + s.total_output_bytes + s.total_param_bytes,
                params=s.total_params, param_bytes=s.total_param_bytes, how="meta")


# -- MemTracker ------------------------------------------------------------------

def memtracker_peak(case, steps, emulate):
    """MemTracker's peak "Total" over `steps` steps of the recorder's step
    (same model, inputs, loss, optimizer, autocast, checkpointing). With
    emulate, inside vramlab_torch.record(), whose CUDA emulation supplies
    autocast and the SDPA backend; returns (MemTracker's peak, the
    recorder's own peak of live bytes in that run, SDPA choices)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed._tools.mem_tracker import MemTracker
    import vramlab_torch
    from vramlab_torch import models
    from vramlab_torch.recorder import allow_fused_on_meta
    from vramlab_torch.step import DTYPES, build_optimizer, checkpoint_blocks

    allow_fused_on_meta()
    build = getattr(models, case["build"])
    amp = DTYPES[case["amp"]] if case["amp"] else None
    session = (vramlab_torch.record(cublas_workspace="off", cudnn_workspace="off", frames=False,
                                    segments="none", inplace_accumulation=False)
               if emulate else contextlib.nullcontext())
    meta = torch.device("meta")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
        with session, meta:
            model = build(**case["kwargs"])
            model.train()
            x = torch.empty(case["input"], dtype=DTYPES[case["dtype"]])
            if case["target"] == "tokens":
                y = torch.empty(case["input"], dtype=torch.int64)
            else:
                y = torch.empty(case["input"][0], dtype=torch.int64)
            if case["checkpoint"]:
                checkpoint_blocks(model, "auto")
            opt = build_optimizer(case["optimizer"], list(model.parameters()), case["lr"], "foreach")
            mt = MemTracker()
            mt.track_external(model, opt, x, y)

            def step():
                ctx = torch.autocast("cuda", dtype=amp) if amp else contextlib.nullcontext()
                with ctx:
                    out = model(x)
                    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            with mt:
                for _ in range(steps):
                    step()
                    mt.reset_mod_stats()  # else: "does not support ... multiple iterative calls"
    peak = mt.get_tracker_snapshot("peak")[meta]["Total"]
    if emulate:
        return peak, session.summary()["peak_live_bytes"], dict(session.emulation.sdpa_choices)
    return peak, None, None


# -- the table -------------------------------------------------------------------

def gib(n):
    return "—" if n is None else f"{n / GIB:.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small stand-ins, to check the script")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--vramlab", default=default_vramlab(),
                    help="the vramlab binary (default: $VRAMLAB_BIN, /tmp/vramlab-bin, target/*/vramlab)")
    ap.add_argument("--keep", metavar="DIR", help="write the recordings here (default: a temporary dir)")
    a = ap.parse_args(argv)
    import torch

    cases = QUICK if a.quick else CASES
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = a.keep or tmpdir
        os.makedirs(tmp, exist_ok=True)
        for case in cases:
            row = dict(label=case["label"])
            log(f"{case['label']}: recording and replaying")
            try:
                row.update(record_and_replay(case, tmp, a.steps, a.vramlab))
            except Exception as e:  # noqa: BLE001 - report and go on
                notes.append(f"{case['label']}: recorder/replay failed: {e}")
            log(f"{case['label']}: torchinfo")
            try:
                ti = torchinfo_estimate(case)
                row.update(ti_pass=ti["pass_bytes"], ti_total=ti["total"])
                if "params" in row and ti["params"] != row["params"]:
                    notes.append(f"{case['label']}: torchinfo counts {ti['params']:,} parameters, the "
                                 f"model has {row['params']:,} (a tied weight counted twice)")
            except Exception as e:  # noqa: BLE001
                notes.append(f"{case['label']}: torchinfo on meta failed: {type(e).__name__}: {e}")
            log(f"{case['label']}: MemTracker")
            for key, emulate in (("mt_plain", False), ("mt_emu", True)):
                try:
                    peak, live, sdpa = memtracker_peak(case, a.steps, emulate)
                    row[key] = peak
                    if emulate and live != peak:
                        notes.append(f"{case['label']}: MemTracker under the emulation {peak:,} bytes, "
                                     f"the recorder's live peak in the same run {live:,} bytes")
                except Exception as e:  # noqa: BLE001
                    notes.append(f"{case['label']}: MemTracker ({'emulated' if emulate else 'plain'}) "
                                 f"failed: {type(e).__name__}: {e}")
            rows.append(row)

    print(f"PyTorch {torch.__version__}, CPU only; {a.steps} training step(s) each; GiB = 2^30 bytes.\n")
    print("| step | recording: steps / wall | recorder: live-tensor peak | replay: peak allocated "
          "| replay: peak reserved | torchinfo: fwd/bwd pass | torchinfo: estimated total "
          "| MemTracker (meta, plain) | MemTracker (meta, + CUDA emulation) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = (f"{r['steps_s']:.2f} s / {r['wall_s']:.1f} s" if "steps_s" in r else "—")
        print(f"| {r['label']} | {t} | {gib(r.get('live'))} | {gib(r.get('allocated'))} "
              f"| {gib(r.get('reserved'))} | {gib(r.get('ti_pass'))} | {gib(r.get('ti_total'))} "
              f"| {gib(r.get('mt_plain'))} | {gib(r.get('mt_emu'))} |")
    if notes:
        print()
        for n in notes:
            print(f"* {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
