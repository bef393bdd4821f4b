#!/usr/bin/env python3
"""Writes memory_viz's own segment summary (`torch.cuda._memory_viz.segsum`)
of each real snapshot in tests/fixtures/snapshots beside it, as
NAME.segsum.txt, and the counts of its trace listing
(`torch.cuda._memory_viz.trace`: entries, allocations, `del`s, cudaMalloc
and cudaFree lines) as NAME.trace.txt, for tests/doctor_cli.rs to check `vramlab doctor` against
(the tests themselves need no PyTorch). Also writes state_only.pickle:
scenario.pickle without its trace, as a snapshot taken with
enabled="state" or without _record_memory_history would be.

    python scripts/memory_viz_summaries.py    # needs torch (pip install torch)
"""
import os
import pickle
import re

from torch.cuda import _memory_viz

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "snapshots")

for name in ["ftcourse_memory_snapshot", "cs336_kkaitlyn_ctx128_fullstep"]:
    with open(os.path.join(HERE, name + ".pickle"), "rb") as f:
        data = pickle.load(f)
    text = _memory_viz.segsum(data)
    # The per-segment picture is long; the totals are what the test reads.
    tail = text[text.index("segments: "):]
    with open(os.path.join(HERE, name + ".segsum.txt"), "w") as f:
        f.write(tail)
    # The trace listing, counted: "N entries", "x = seg_K[offset:size]" per
    # allocation, "del x" per free, cudaMalloc / cudaFree per segment.
    lines = _memory_viz.trace(data).splitlines()
    entries = sum(int(l.split()[0]) for l in lines if l.endswith(" entries"))
    counts = {
        "entries": entries,
        "allocations": sum(1 for l in lines if re.match(r"^\w+ = \w+\[\d+:", l)),
        "frees": sum(1 for l in lines if l.startswith("del ")),
        "segment_allocs": sum(1 for l in lines if "cudaMalloc" in l),
        "segment_frees": sum(1 for l in lines if "cudaFree" in l),
    }
    with open(os.path.join(HERE, name + ".trace.txt"), "w") as f:
        f.write("".join(f"{k}: {v}\n" for k, v in counts.items()))

with open(os.path.join(HERE, "scenario.pickle"), "rb") as f:
    data = pickle.load(f)
data.pop("device_traces", None)
with open(os.path.join(HERE, "state_only.pickle"), "wb") as f:
    pickle.dump(data, f)
