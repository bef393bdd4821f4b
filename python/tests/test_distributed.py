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


# -- DDP's find_unused_parameters, the summary, the command line's checks -------------

class _Unused(torch.nn.Module):
    """A parameter never used in forward (find_unused_parameters' case)."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(32, 32)
        self.used = torch.nn.Linear(32, 10)
        self.unused = torch.nn.Linear(32, 64)

    def forward(self, x):
        return self.used(torch.relu(self.trunk(x)))


UNUSED_FILE = '''
import torch.nn as nn, torch
class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(32, 32); self.used = nn.Linear(32, 10); self.unused = nn.Linear(32, 64)
    def forward(self, x): return self.used(torch.relu(self.trunk(x)))
def unused(): return Unused()
'''


@pytest.mark.parametrize("steps", [1, 2])
def test_ddp_find_unused_records_unused_parameters_and_the_used_map(steps):
    # DDP's reducer copies its used-parameter map back to the host in the
    # backward (a copy out of meta): rank 0 keeps its own map.
    rec = record_step(_Unused, inputs=[(8, 32)], target="classes:10", optimizer="sgd", steps=steps,
                      frames=False, cublas_workspace="off", dist="ddp", world_size=2,
                      ddp_kwargs={"find_unused_parameters": True})
    rec.finish()
    n_tensors = 6
    d = rec.meta["dist"]
    assert d["used_map_bytes"] == 4 * n_tensors
    n = sum(p.numel() for p in _Unused().parameters())
    assert d["bucket_bytes"] == n * 4 and d["buckets"] == len(d["bucket_sizes"])
    # The map is on the device as in DDP (int32 per parameter), alive to the end.
    alive = {ev["id"] for ev in live_at_end(rec)}
    maps = [ev for ev in rec.events if ev["op"] == "alloc" and ev.get("role") == distributed.ROLE_BUCKET
            and ev["size"] == 4 * n_tensors]
    assert maps and maps[0]["id"] in alive
    # The unused layer gets no gradient, the used ones do, in every step.
    assert rec.meta["live_before_last_zero_grad"]["gradient"] == sum(
        p.numel() * 4 for name, p in _Unused().named_parameters() if not name.startswith("unused"))


def test_ddp_host_tensors_are_pytorchs_not_the_users():
    # find_unused_parameters' host-side map is DDP's own: not reported as
    # the user's; a tensor the user makes on the CPU still is.
    rec = record_step(_Unused, inputs=[(8, 32)], target="classes:10", optimizer="adam", steps=2,
                      frames=False, cublas_workspace="off", dist="ddp", world_size=2,
                      ddp_kwargs={"find_unused_parameters": True})
    rec.finish()
    assert "not_recorded" not in rec.meta, rec.meta.get("not_recorded")
    from vramlab_torch import record
    with distributed.fake_world(2):
        with pytest.warns(Warning, match="1 tensor.* made on cpu"):
            with record(frames=False, cublas_workspace="off") as r:
                m = _Unused().to_empty(device="meta")
                ddp = distributed.wrap_ddp(m, r, find_unused_parameters=True)
                ddp(torch.empty(8, 32)).sum().backward()
                torch.zeros(16, device="cpu")  # the user's own
    assert r.meta["not_recorded"]["cpu"]["tensors"] == 1


from test_usability import run_main as _cli  # (exit code, stdout, stderr) in this process


GPT_ARGS = ["vramlab_torch.models:gpt2", *[x for k, v in GPT.items() for x in ("--arg", f"{k}={v}")],
            "--input", "2,16", "--input-dtype", "int64", "--target", "tokens", "--optimizer", "adam",
            "--cublas-workspace", "off", "--no-frames"]


def test_dist_summary_says_the_mode_world_size_and_buckets(tmp_path, capsys):
    n, _ = gpt_params()
    code, out, err = _cli(["record", *GPT_ARGS, "--dist", "ddp", "--world-size", "2",
                           "--out", str(tmp_path / "d.pickle")], capsys)
    assert code == 0, err
    assert "distributed: DDP, rank 0 of 2" in out and "gradient bucket(s)" in out, out
    code, out, err = _cli(["record", *GPT_ARGS, "--dist", "fsdp", "--world-size", str(WORLD),
                           "--out", str(tmp_path / "f.pickle")], capsys)
    assert code == 0, err
    from vramlab_torch.session import human_bytes
    assert f"distributed: FSDP2, rank 0 of {WORLD}" in out, out
    assert f"this rank's parameters {human_bytes(n * 4 // WORLD)} of {human_bytes(n * 4)}" in out, out
    code, out, err = _cli(["record", *GPT_ARGS, "--dist", "ddp", "--world-size", "2", "--json",
                           "--out", str(tmp_path / "d.pickle")], capsys)
    d = json.loads(out)["meta"]["dist"]
    assert d["kind"] == "ddp" and d["world_size"] == 2 and d["bucket_bytes"] == n * 4


def test_doctor_says_which_rank_of_which_layout_a_recording_is(tmp_path, capsys):
    """doctor reads meta.dist: a DDP rank is told what sharding and
    gradient_as_bucket_view would change, an FSDP2 rank that its states
    are sharded already."""
    import subprocess
    from test_recorder import vramlab_binary
    binary = vramlab_binary()
    assert binary is not None, "no vramlab binary: set VRAMLAB_BIN (scripts/test.sh does)"
    for dist, said in [("ddp", "rank 0 of DDP over 2 ranks"), ("fsdp", "rank 0 of FSDP2 over 2 ranks")]:
        out = tmp_path / f"{dist}.pickle"
        code, _, err = _cli(["record", *GPT_ARGS, "--dist", dist, "--world-size", "2",
                             "--out", str(out)], capsys)
        assert code == 0, err
        r = subprocess.run([binary, "doctor", str(out)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert said in r.stdout, r.stdout
        assert ("gradient_as_bucket_view=True" in r.stdout) == (dist == "ddp"), r.stdout


DIST_MISTAKES = {
    "world size 0": (["--dist", "ddp", "--world-size", "0"], "--world-size 0"),
    "world size -2": (["--dist", "fsdp", "--world-size", "-2"], "--world-size -2"),
    "world size alone": (["--world-size", "4"], "--world-size 4: with --dist"),
    "fsdp-blocks ddp": (["--dist", "ddp", "--fsdp-blocks", "Block"], "--fsdp-blocks Block: with --dist fsdp"),
    "fsdp-blocks alone": (["--fsdp-blocks", "Block"], "--fsdp-blocks Block: with --dist fsdp"),
    "bucket cap 0": (["--dist", "ddp", "--bucket-cap-mb", "0"], "--bucket-cap-mb 0"),
    "bucket cap -1": (["--dist", "ddp", "--bucket-cap-mb", "-1"], "--bucket-cap-mb -1"),
    "find-unused alone": (["--find-unused"], "--find-unused: DDP's options, with --dist ddp"),
    "bucket-view fsdp": (["--dist", "fsdp", "--bucket-view"], "--bucket-view: DDP's options"),
}


@pytest.mark.parametrize("case", sorted(DIST_MISTAKES))
def test_dist_option_mistakes_are_one_line(case, tmp_path, capsys):
    extra, want = DIST_MISTAKES[case]
    code, out, err = _cli(["record", *GPT_ARGS, *extra, "--out", str(tmp_path / "x.pickle")], capsys)
    assert code == 2 and err.count("\n") == 1 and want in err, (code, err)
    assert out == "" and not (tmp_path / "x.pickle").exists()


def test_the_api_checks_world_size():
    with pytest.raises(ValueError, match="--world-size 0"):
        record_step(_Unused, inputs=[(8, 32)], dist="ddp", world_size=0)


def test_ddp_find_unused_from_the_command_line_is_quiet(tmp_path):
    # A subprocess: PyTorch's C++ warnings are once per process, on stderr.
    import subprocess
    (tmp_path / "m.py").write_text(UNUSED_FILE)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    r = subprocess.run([sys.executable, "-m", "vramlab_torch", "record", f"{tmp_path / 'm.py'}:unused",
                        "--input", "8,32", "--target", "classes:10", "--optimizer", "sgd", "--dist", "ddp",
                        "--world-size", "2", "--find-unused", "--steps", "2", "--cublas-workspace", "off",
                        "--out", str(tmp_path / "x.pickle")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "Time stats" not in r.stderr, r.stderr
    assert "made on cpu" not in r.stdout and "used map 24 B" in r.stdout, r.stdout
