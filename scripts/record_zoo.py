#!/usr/bin/env python3
"""The recorder (python/vramlab_torch) on the PyTorch versions of vramlab's
six zoo models: two training steps each, as `python -m vramlab_torch record`
records them, written as small snapshots (no frames) under
tests/fixtures/recorder/zoo/ with cases.json, which pairs each with the
`vramlab estimate` arguments of the same step (model, sizes, batch,
optimizer, loss, f32). tests/recorder_fixtures.rs replays each and compares
it with the estimate, step by step; docs/recorder.md ("The zoo: the
recorder against estimate") has the table.

    python scripts/record_zoo.py [--out tests/fixtures/recorder/zoo]

needs PyTorch (the CPU wheel), not a GPU. The builders below are the
recorder's BUILD arguments too (`scripts/record_zoo.py:gpt`); the models
are scripts/torch_reference.py's, scripts/gpt_reference.py's and
scripts/resnet_reference.py's, which mirror the zoo's layouts and op order.

The rules the recorder adds are pinned, not `auto`: cuBLAS workspaces per
GEMM as PyTorch 2.15 allocates them (32 MiB, compute capability 9.0; the
Linear-with-bias forward's cuBLASLt 1 MiB, kept) and cuDNN convolution
workspaces by the rule fitted on an H200; CUBLAS_WORKSPACE_CONFIG and
CUBLASLT_WORKSPACE_SIZE are unset for the recording.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import types
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
if importlib.util.find_spec("safetensors") is None:
    # The reference scripts import it at the top; nothing here uses it.
    _st = types.ModuleType("safetensors")
    _st.torch = types.ModuleType("safetensors.torch")
    for _n in ("save_file", "load_file", "safe_open"):
        setattr(_st.torch, _n, None)
    _st.safe_open = None
    sys.modules["safetensors"] = _st
    sys.modules["safetensors.torch"] = _st.torch

import gpt_reference  # noqa: E402
import resnet_reference  # noqa: E402
import torch_reference  # noqa: E402

# -- the builders (BUILD for python -m vramlab_torch record) ------------------

def mlp(widths=(13, 17, 9, 5)):
    return torch_reference.Mlp(list(widths))


def simple_cnn():
    return torch_reference.SimpleConvNet()


def resnet_mini(width=4, depth=3, classes=7):
    return torch_reference.ResnetMini(width, depth, classes)


def attention(dim=12, hidden=20, classes=5):
    return torch_reference.Attention(dim, hidden, classes)


def gpt(layers=2, heads=2, dim=64, positions=64, vocab=1000):
    return gpt_reference.Gpt(layers, heads, dim, positions, vocab, 0.0)


def resnet50(width=8, classes=10):
    return resnet_reference.Resnet(50, width, classes)


# -- the cases -------------------------------------------------------------------

# name: (builder arguments, recorder arguments, `vramlab estimate` arguments).
# The same step on both sides: batch, sizes, optimizer (AdamW: lr 1e-3,
# weight decay 0.01; SGD: momentum 0.9), foreach, F.cross_entropy, f32,
# two steps.
ADAMW = ["--optimizer", "adamw", "--foreach"]
CASES = {
    "mlp": (["--arg", "widths=[13,17,9,5]"],
            ["--input", "3,13", "--target", "classes:5", *ADAMW],
            ["--model", "mlp", "--widths", "13,17,9,5", "--batch", "3", "--optimizer", "adamw"]),
    "simple-cnn": ([],
                   ["--input", "2,3,32,32", "--target", "classes:10", *ADAMW],
                   ["--model", "simple-cnn", "--batch", "2", "--optimizer", "adamw"]),
    "resnet-mini": (["--arg", "width=4", "--arg", "depth=3", "--arg", "classes=7"],
                    ["--input", "3,3,9,9", "--target", "classes:7", *ADAMW],
                    ["--model", "resnet-mini", "--width", "4", "--depth", "3", "--resolution", "9",
                     "--classes", "7", "--batch", "3", "--optimizer", "adamw"]),
    "attention": (["--arg", "dim=12", "--arg", "hidden=20", "--arg", "classes=5"],
                  ["--input", "3,7,12", "--target", "classes:5", *ADAMW],
                  ["--model", "attention", "--seq-len", "7", "--dim", "12", "--hidden", "20",
                   "--classes", "5", "--batch", "3", "--optimizer", "adamw"]),
    "gpt": (["--arg", "layers=2", "--arg", "heads=2", "--arg", "dim=64", "--arg", "positions=64",
             "--arg", "vocab=1000"],
            ["--input", "2,64", "--input-dtype", "int64", "--target", "tokens", *ADAMW],
            ["--model", "gpt", "--layers", "2", "--heads", "2", "--dim", "64", "--vocab", "1000",
             "--seq-len", "64", "--batch", "2", "--optimizer", "adamw"]),
    "resnet50": (["--arg", "width=8", "--arg", "classes=10"],
                 ["--input", "2,3,32,32", "--target", "classes:10", "--optimizer", "sgd", "--lr", "0.1",
                  "--momentum", "0.9", "--foreach"],
                 ["--model", "resnet50", "--width", "8", "--resolution", "32", "--classes", "10",
                  "--batch", "2", "--optimizer", "sgd", "--momentum", "0.9"]),
}
RULES = ["--cublas-workspace", "per-op", "--capability", "9.0", "--cudnn-workspace", "fitted-h200"]
COMMON = ["--steps", "2", "--no-frames", *RULES]
ESTIMATE_COMMON = ["--optimizer-impl", "foreach", "--steps", "2"]


def record_command(name, out):
    build, args, _ = CASES[name]
    fn = name.replace("-", "_")
    return ["python", "-m", "vramlab_torch", "record", f"scripts/record_zoo.py:{fn}", *build, *args,
            *COMMON, "--out", out]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join("tests", "fixtures", "recorder", "zoo"),
                   help="directory for the snapshots and cases.json (relative to the repository root)")
    p.add_argument("--only", action="append", choices=list(CASES), help="record only these (repeatable)")
    a = p.parse_args()
    out_dir = a.out if os.path.isabs(a.out) else os.path.join(REPO, a.out)
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for v in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE"):
        env.pop(v, None)
    cases = []
    for name in CASES:
        file = f"{name}.pickle"
        cmd = record_command(name, os.path.join(a.out, file))
        cases.append({"snapshot": file, "model": name, "record": " ".join(cmd),
                      "estimate": CASES[name][2] + ESTIMATE_COMMON})
        if a.only and name not in a.only:
            continue
        r = subprocess.run([sys.executable, *cmd[1:-1], os.path.join(out_dir, file), "--json"], cwd=REPO,
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"{name}: the recorder failed")
        s = json.loads(r.stdout)
        print(f"{name}: {s['allocations']} allocations, peak live {s['peak_live_bytes']:,} bytes, "
              f"allocator model {s['allocator_model']['peak_allocated']:,} allocated / "
              f"{s['allocator_model']['peak_reserved']:,} reserved; "
              f"{os.path.getsize(os.path.join(out_dir, file)):,} bytes")
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
