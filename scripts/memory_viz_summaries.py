#!/usr/bin/env python3
"""Writes memory_viz's own segment summary (`torch.cuda._memory_viz.segsum`)
of each real snapshot in tests/fixtures/snapshots beside it, as
NAME.segsum.txt, for tests/doctor_cli.rs to check `vramlab doctor` against
(the tests themselves need no PyTorch). Also writes state_only.pickle:
scenario.pickle without its trace, as a snapshot taken with
enabled="state" or without _record_memory_history would be.

    python scripts/memory_viz_summaries.py    # needs torch (pip install torch)
"""
import os
import pickle

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

with open(os.path.join(HERE, "scenario.pickle"), "rb") as f:
    data = pickle.load(f)
data.pop("device_traces", None)
with open(os.path.join(HERE, "state_only.pickle"), "wb") as f:
    pickle.dump(data, f)
