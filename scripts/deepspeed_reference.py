#!/usr/bin/env python3
"""Writes crates/parallel/tests/fixtures/deepspeed_zero.json: DeepSpeed's own
model-state estimators (deepspeed.runtime.zero.stage_1_and_2 /
stage3 `estimate_zero{2,3}_model_states_mem_needs`, no offload) for the
transformers and GPU counts the Rust tests build, so that the tests check
vramlab's per-rank ZeRO programs against them without DeepSpeed.

    pip install deepspeed   # CPU is enough (DS_BUILD_OPS=0)
    python scripts/deepspeed_reference.py
"""
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs  # noqa: E402

# (layers, heads, hidden, positions, vocab): GPT-2 blocks as vramlab's gpt.
MODELS = {
    "small": (4, 4, 256, 512, 4096),
    "gpt2": (12, 12, 768, 1024, 50257),
    "7b": (32, 32, 4096, 2048, 50257),
    "70b": (80, 64, 8192, 4096, 50257),
    "175b": (96, 96, 12288, 2048, 50257),
}


def params(layers, heads, h, positions, vocab):
    block = 12 * h * h + 13 * h
    return layers * block + (vocab + positions) * h + 2 * h


def largest_module(layers, heads, h, positions, vocab):
    return max(vocab * h, positions * h, 4 * h * h + 4 * h)


def main():
    cases = []
    for name, m in MODELS.items():
        psi, big = params(*m), largest_module(*m)
        for gpus in (1, 2, 8, 64, 1024):
            _, z2 = estimate_zero2_model_states_mem_needs(psi, num_gpus_per_node=gpus, cpu_offload=False)
            _, z3, layer = estimate_zero3_model_states_mem_needs(
                psi, big, num_gpus_per_node=gpus, cpu_offload=False, cpu_offload_params=False)
            cases.append(dict(model=name, dims=m, gpus=gpus, params=psi, largest_layer_params=big,
                              zero2_gpu_bytes=z2, zero3_gpu_bytes=z3, zero3_largest_layer_bytes=layer))
    out = os.path.join(os.path.dirname(__file__), "..", "crates", "parallel", "tests", "fixtures",
                       "deepspeed_zero.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(generator="scripts/deepspeed_reference.py", deepspeed=deepspeed.__version__,
                       cases=cases), f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
