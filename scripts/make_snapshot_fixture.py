#!/usr/bin/env python3
"""Writes tests/fixtures/snapshots/scenario.pickle: a PyTorch memory snapshot
in the documented format of torch.cuda.memory._dump_snapshot() (a pickled
dict with "segments" and "device_traces"; trace entries with "action",
"addr", "size", "stream", "time_us", "frames"), for a scenario whose
allocator decisions follow from PyTorch's rules by hand:

  small requests (<= 1 MiB) share 2 MiB segments; 1-10 MiB requests get
  20 MiB segments; >= 10 MiB requests get their size rounded up to 2 MiB;
  free blocks are reused best-fit (a 13 MiB free tail serves a 12 MiB
  request, so the scenario asks for 14 MiB to force a new segment); a large
  block is split only when more than 1 MiB would remain.

No GPU was available to record one with torch.cuda; when one is, record
    torch.cuda.memory._record_memory_history(); ...; torch.cuda.memory._dump_snapshot(path)
and `vramlab replay path` reads it the same way. Standard library only.
"""
import os
import pickle

MiB = 1 << 20
BASE = 0x7F0000000000
GAP = 64 * MiB
seg_base = {}
trace = []
t = [0]


def entry(action, addr, size):
    t[0] += 10
    trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                  "time_us": t[0], "frames": [{"filename": "scenario.py", "line": len(trace), "name": action}]})


def segment(name, size):
    addr = BASE + len(seg_base) * GAP
    seg_base[name] = (addr, size)
    entry("segment_alloc", addr, size)
    return addr


def alloc(addr, size):
    entry("alloc", addr, size)


def free(addr, size):
    entry("free_requested", addr, size)
    entry("free_completed", addr, size)


s0 = segment("s0", 2 * MiB)            # a: 1000 B, small pool
alloc(s0, 1000)
s1 = segment("s1", 20 * MiB)           # b: 3 MiB -> 20 MiB segment
alloc(s1, 3 * MiB)
alloc(s1 + 3 * MiB, 4 * MiB)           # c: split from the 17 MiB left
s2 = segment("s2", 14 * MiB)           # d: 14 MiB; the 13 MiB left in s1 is too small
alloc(s2, 14 * MiB)
free(s1, 3 * MiB)                      # b freed: a 3 MiB hole
alloc(s1, 3 * MiB - 100)               # e: rounds to 3 MiB, best fit is the hole
s3 = segment("s3", 32 * MiB)           # f: 30 MiB + 1 -> 32 MiB segment
alloc(s3, 30 * MiB + 1)
alloc(s0 + 1024, 5000)                 # g: small, fits after a
for addr, size in [(s0, 1000), (s0 + 1024, 5000), (s1 + 3 * MiB, 4 * MiB), (s2, 14 * MiB),
                   (s1, 3 * MiB - 100), (s3, 30 * MiB + 1)]:
    free(addr, size)
alloc(s2, 14 * MiB)                    # h: best fit is the 14 MiB segment
alloc(s3, 25 * MiB)                    # i: splits the 32 MiB segment (7 MiB left)
s4 = segment("s4", 22 * MiB)           # j: nothing free fits 22 MiB
alloc(s4, 22 * MiB - 100)
for addr, size in [(s2, 14 * MiB), (s3, 25 * MiB), (s4, 22 * MiB - 100)]:
    free(addr, size)

segments = [{"address": a, "total_size": s, "stream": 0,
             "segment_type": "small" if s == 2 * MiB else "large",
             "segment_pool_id": (0, 0), "allocated_size": 0, "active_size": 0,
             "blocks": [{"address": a, "size": s, "requested_size": 0, "state": "inactive", "frames": []}]}
            for a, s in seg_base.values()]
snapshot = {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None}}
out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "snapshots", "scenario.pickle")
with open(out, "wb") as f:
    pickle.dump(snapshot, f)
print(f"wrote {os.path.normpath(out)}: {len(trace)} trace entries, segments {[s // MiB for _, s in seg_base.values()]} MiB")
