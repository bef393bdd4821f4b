"""One rank of FSDP2 / DDP recorded on meta with a fake process group
(vramlab_torch/distributed.py). Skipped where PyTorch, torch.distributed's
fake process group or FSDP2 is missing."""

import json
import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vramlab_torch import distributed, models, record_step  # noqa: E402

OK, WHY = distributed.available()
pytestmark = pytest.mark.skipif(not OK, reason=f"no fake process group / FSDP2 here: {WHY}")

WORLD = 4
# dims divisible by WORLD: every shard is exactly 1/WORLD (FSDP2 pads dim 0
# to a multiple of the world size otherwise).
GPT = dict(layers=2, dim=64, heads=4, vocab=1000, positions=128)


def gpt_params():
    with torch.device("meta"):
        m = models.gpt2(**GPT)
    block = sum(p.numel() for p in m.h[0].parameters())
    return sum(p.numel() for p in m.parameters()), block


def record(dist, **kw):
    rec = record_step(models.gpt2, build_kwargs=GPT, inputs=[(2, 16)], input_dtypes=[torch.int64],
                      target="tokens", optimizer="adam", steps=2, frames=False,
                      cublas_workspace="off", dist=dist, world_size=WORLD, **kw)
    rec.finish()
    return rec


def live_at_end(rec):
    sizes = {}
    for ev in rec.events:
        if ev["op"] == "alloc":
            sizes[ev["id"]] = ev
        else:
            sizes.pop(ev["id"])
    return list(sizes.values())


def test_fsdp2_rank0_holds_a_shard_and_gathers_each_block():
    n, block = gpt_params()
    rec = record("fsdp")
    meta = rec.meta
    assert meta["dist"]["kind"] == "fsdp2" and meta["parameters"] == n
    # Model states right before the last zero_grad: this rank's shards.
    live = meta["live_before_last_zero_grad"]
    assert live["parameter"] == n * 4 // WORLD
    assert live["gradient/fsdp reduce-scatter"] == n * 4 // WORLD
    assert live["optimizer_state"] == 2 * n * 4 // WORLD
    # Nothing gathered is alive then, nor at the end.
    assert not any("unsharded" in k or "all-gather" in k for k in live)
    end = live_at_end(rec)
    assert not [ev for ev in end if ev.get("role") in (distributed.ROLE_UNSHARDED, distributed.ROLE_GATHER)]
    # Each block is gathered whole (all-gather buffer of the block's bytes),
    # in the forward and again in the backward, and freed each time.
    gathers = [ev for ev in rec.events if ev["op"] == "alloc" and ev.get("role") == distributed.ROLE_GATHER]
    block_gathers = [ev for ev in gathers if ev["size"] == block * 4]
    assert len(block_gathers) == GPT["layers"] * 2 * 2, [ev["size"] for ev in gathers]
    freed = {ev["id"] for ev in rec.events if ev["op"] == "free"}
    assert all(ev["id"] in freed for ev in gathers)
    # The unsharded parameters (re-allocated by storage resizes, which the
    # recorder is told of) are a whole block's parameters at a time.
    unsharded = [ev for ev in rec.events if ev["op"] == "alloc" and ev.get("role") == distributed.ROLE_UNSHARDED]
    h0_fwd_step2 = [ev for ev in unsharded if ev["step"] == 2 and ev["phase"] == "forward"
                    and ev.get("where", "").startswith("h.0")]
    assert sum(ev["size"] for ev in h0_fwd_step2) == block * 4
    assert all(ev["id"] in freed for ev in unsharded if ev.get("where", "").startswith("h."))


def test_fsdp2_snapshot_carries_the_roles(tmp_path):
    rec = record("fsdp")
    out = tmp_path / "fsdp.pickle"
    rec.save(str(out))
    import pickle
    snap = pickle.load(open(out, "rb"))
    roles = {json.loads(e["user_metadata"]).get("role") for e in snap["device_traces"][0]
             if e["action"] == "alloc"}
    assert {distributed.ROLE_GATHER, distributed.ROLE_UNSHARDED, distributed.ROLE_REDUCE} <= roles


def test_ddp_buckets_hold_every_gradient_and_are_rebuilt():
    n, _ = gpt_params()
    rec = record("ddp")
    live = rec.meta["live_before_last_zero_grad"]
    assert live["parameter"] == n * 4 and live["gradient"] == n * 4
    assert live["optimizer_state"] == 2 * n * 4
    assert live["workspace/ddp bucket"] == n * 4
    buckets = [ev for ev in rec.events if ev["op"] == "alloc" and ev.get("role") == distributed.ROLE_BUCKET
               and ev["size"] > 1024]
    # One bucket at construction, rebuilt by the size caps before the
    # second forward (this model: under 1 MiB, so one again).
    assert buckets[0]["phase"] == "setup" and buckets[0]["size"] == n * 4
    assert any(ev["step"] == 2 for ev in buckets[1:])
