"""Set a recording of one data-parallel rank (python -m vramlab_torch record
... --dist fsdp|ddp) beside `vramlab estimate`'s figures for that rank.

    python3 scripts/dist_compare.py STEP.pickle RECORD.json ESTIMATE.json REPLAY.json

STEP.pickle: the recording; RECORD.json: the recorder's --json output;
ESTIMATE.json: `vramlab estimate ... --json`; REPLAY.json: `vramlab replay
STEP.pickle --json`. Prints one JSON object: for the recording, live bytes
per category (and distributed.py's roles) right before the last zero_grad,
each role's peak of live bytes and its allocations' sizes; for the
estimate, model_states, kind_peaks, peak_allocated / peak_reserved.
Needs no PyTorch (the pickle holds plain Python objects)."""

import json
import pickle
import sys
from collections import Counter


def roles(snapshot):
    """Per category/role (and per group of them): peak of live bytes,
    allocation count, the largest sizes."""
    live = {}
    cur, peak, count = Counter(), Counter(), Counter()
    by_size = {}

    def change(role, size):
        for key in [role] + [g for g, members in GROUPS.items() if role in members]:
            cur[key] += size
            peak[key] = max(peak[key], cur[key])

    for e in snapshot["device_traces"][0]:
        md = json.loads(e.get("user_metadata") or "{}")
        if e["action"] == "alloc":
            role = md.get("category", "?") + (f"/{md['role']}" if md.get("role") else "")
            live[e["addr"]] = (role, e["size"])
            count[role] += 1
            by_size.setdefault(role, Counter())[e["size"]] += 1
            change(role, e["size"])
        elif e["action"] == "free_completed":
            role, size = live.pop(e["addr"])
            change(role, -size)
    out = {r: {"peak_live_bytes": peak[r], "allocations": count[r],
               "largest": sorted(by_size[r], reverse=True)[:4]} for r in by_size}
    for g in GROUPS:
        if peak[g]:
            out[g] = {"peak_live_bytes": peak[g]}
    return out


# Sums whose peaks are compared with the estimate's kinds.
GROUPS = {
    "gathered (fsdp all-gather buffer + unsharded parameters)": (
        "temporary/fsdp all-gather buffer", "parameter/fsdp unsharded parameter"),
    "ddp buckets": ("workspace/ddp bucket",),
}


def main(pickle_path, record_json, estimate_json, replay_json):
    snap = pickle.load(open(pickle_path, "rb"))
    rec = json.load(open(record_json))
    est = json.load(open(estimate_json))
    rep = json.load(open(replay_json))
    live = rec["meta"]["live_before_last_zero_grad"]
    states = {k: v for k, v in live.items()
              if k.split("/")[0] in ("parameter", "gradient", "optimizer_state")
              and "unsharded" not in k}
    s = est["stages"][0]
    out = {
        "recording": {
            "model_states_before_last_zero_grad": sum(states.values()),
            "of_which": states,
            "live_before_last_zero_grad": live,
            "roles": roles(snap),
            "replay_peak_allocated": rep["devices"][0]["replayed"]["peak_allocated_bytes"],
            "replay_peak_reserved": rep["devices"][0]["replayed"]["peak_reserved_bytes"],
        },
        "estimate": {
            "model_states": s["model_states"],
            "kind_peaks": dict(s["kind_peaks"]),
            "peak_allocated": s["peak_allocated"],
            "peak_reserved": s["peak_reserved"],
            "stage_params": s["stage_params"],
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:5])
