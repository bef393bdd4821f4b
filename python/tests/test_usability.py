"""What a user meets: "cuda" in their code, models that return dicts and
tuples, mistakes on the command line (one line each, not a traceback),
layers recorded as meta runs them. Small models: each test runs in about
a second."""

import os
import pickle
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import vramlab_torch  # noqa: E402
from vramlab_torch import record, record_step  # noqa: E402
from vramlab_torch.__main__ import main  # noqa: E402

# The models of an outside user's pass (reduced), as files for BUILD.
USER_MODELS = '''
import torch, torch.nn as nn

class PosModel(nn.Module):
    """'cuda' said in forward, as user code often does."""
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16); self.pos = nn.Embedding(32, 16); self.out = nn.Linear(16, 100)
    def forward(self, x):
        pos = torch.arange(x.shape[1], device="cuda")
        return self.out(self.emb(x) + self.pos(pos))

class PosModelOk(PosModel):
    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device)
        return self.out(self.emb(x) + self.pos(pos))

def build(): return PosModel()
def build_cuda(): return PosModel().cuda()
def build_to(): return PosModel().to(torch.device("cuda"))
def build_ok(): return PosModelOk()

class DictOut(nn.Module):
    """a scalar first, the logits under "logits" (the pass's MHA model)"""
    def __init__(self):
        super().__init__(); self.emb = nn.Embedding(100, 16); self.out = nn.Linear(16, 100)
    def forward(self, x):
        h = self.emb(x)
        return {"aux": h.mean(), "logits": self.out(h)}
def dict_out(): return DictOut()

class Two(nn.Module):
    def __init__(self):
        super().__init__(); self.a = nn.Linear(8, 4); self.b = nn.Linear(6, 4)
    def forward(self, x, y): return self.a(x) + self.b(y)
def two(): return Two()

def not_a_module(): return 42

class Broken(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(4, 4)
    def forward(self, x): raise ValueError("forward exploded")
def broken(): return Broken()

def asks_the_driver():
    torch.cuda.current_device()
    return nn.Linear(4, 4)

class StreamUser(PosModelOk):
    def forward(self, x):
        torch.cuda.Stream()
        return super().forward(x)
def stream_user(): return StreamUser()

class Nonzero(PosModelOk):
    def forward(self, x):
        return super().forward(x[torch.nonzero(x[:, 0]).squeeze(1)])
def nonzero(): return Nonzero()
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "user_models.py"
    path.write_text(USER_MODELS)
    return str(path)


def run_main(argv, capsys):
    """(exit code, stdout, stderr) of the command, in this process."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def tokens_args(spec, out):
    return ["record", spec, "--input", "2,8", "--input-dtype", "int64", "--target", "tokens",
            "--optimizer", "sgd", "--cublas-workspace", "off", "--steps", "1", "--out", str(out), "--json"]


# -- 1. "cuda" in the user's code ----------------------------------------------------

def test_cuda_in_user_code_is_recorded_on_the_recordings_device(user_file, tmp_path, capsys):
    """device="cuda" in forward, model.cuda() and model.to(torch.device("cuda"))
    in the builder record what the same model says without "cuda" (they
    failed with "Found no NVIDIA driver")."""
    import json
    peaks = {}
    for fn in ("build_ok", "build", "build_cuda", "build_to"):
        code, out, err = run_main(tokens_args(f"{user_file}:{fn}", tmp_path / f"{fn}.pickle"), capsys)
        assert code == 0, err
        s = json.loads(out)
        peaks[fn] = (s["peak_live_bytes"], s["allocations"])
        if fn != "build_ok":
            assert s["meta"]["cuda_device_mapped"] >= 1
    assert len(set(peaks.values())) == 1, peaks


def test_cuda_in_a_user_loop(tmp_path):
    """record(): .to("cuda"), .cuda(), device="cuda" / torch.device("cuda") /
    an index, and pin_memory, as a CUDA run has them."""
    def loop(cuda):
        with record(cublas_workspace="off") as rec:
            m = nn.Linear(64, 10)
            if cuda:
                m = m.to("cuda")
                x = torch.randn(8, 64, device="cuda")
                y = torch.zeros(8, dtype=torch.long, device=torch.device("cuda:0"))
                w = torch.ones(10).cuda()
                w2 = torch.ones(10, device=0)
                z = torch.empty(4, pin_memory=True)
                assert z.device.type == "meta"
            else:
                x = torch.randn(8, 64)
                y = torch.zeros(8, dtype=torch.long)
                w, w2 = torch.ones(10), torch.ones(10)
                z = torch.empty(4)
            (F.cross_entropy(m(x) * w * w2, y)).backward()
        return rec
    plain, cuda = loop(False), loop(True)
    assert cuda.summary() == plain.summary()
    assert cuda.meta["cuda_device_mapped"] >= 5 and "cuda_device_mapped" not in plain.meta


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_calls_that_need_the_driver_are_one_line(user_file, tmp_path, capsys):
    with pytest.raises(vramlab_torch.session.RecordingError, match=r"torch\.cuda\..*is_available") as e:
        with record():
            nn.Linear(4, 4)
            torch.cuda.current_device()
    assert "\n" not in str(e.value) and "NVIDIA driver" in str(e.value.__cause__)
    code, out, err = run_main(tokens_args(f"{user_file}:asks_the_driver", tmp_path / "x.pickle"), capsys)
    assert code == 1 and err.count("\n") == 1 and "asks_the_driver" in err, err


def test_tensors_off_the_recordings_device_are_said():
    """A tensor made on the CPU is not GPU memory in the recording: it was
    dropped without a word."""
    with pytest.warns(vramlab_torch.session.RecordingWarning, match="made on cpu"):
        with record(cublas_workspace="off") as rec:
            m = nn.Linear(64, 10, device="cpu")
            m(torch.randn(8, 64, device="cpu")).sum().backward()
    d = rec.meta["not_recorded"]["cpu"]
    assert d["tensors"] >= 4 and d["bytes"] >= (64 * 10 + 10 + 8 * 64) * 4
    assert "test_usability.py" in d["at"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", vramlab_torch.session.RecordingWarning)
        with record(cublas_workspace="off"):
            m = nn.Linear(8, 4)
            opt = torch.optim.Adam(m.parameters())  # state['step'] stays on the host, on purpose
            m(torch.randn(2, 8)).sum().backward()
            opt.step()


def test_reading_a_value_in_a_user_loop_is_one_line():
    with pytest.raises(vramlab_torch.session.RecordingError, match=r"\.item\(\)") as e:
        with record():
            loss = nn.Linear(4, 1)(torch.randn(2, 4)).sum()
            print(loss.item())
    assert "\n" not in str(e.value) and "test_usability.py" in str(e.value)


# -- 2, 3. the model's output and the target -----------------------------------------

def test_dict_and_tuple_outputs():
    from vramlab_torch.step import pick_output
    t3, t0 = torch.empty(2, 8, 5, device="meta"), torch.empty((), device="meta")
    assert pick_output({"aux": t0, "logits": t3})[1] == "output['logits']"
    assert pick_output({"aux": t0, "scores": t3})[1] == "output['scores']"
    assert pick_output((t0, t3))[1] == "output[1]"
    assert pick_output((t3, t0))[1] == "output[0]"
    assert pick_output([{"logits": t3}])[1] == "output[0]['logits']"
    for bad, shown in [({"a": t3, "b": t3}, "dict{'a': Tensor[2, 8, 5], 'b': Tensor[2, 8, 5]}"),
                       ((t0, t0), "tuple(Tensor[], Tensor[])"), ({"n": 3}, "dict{'n': int}")]:
        with pytest.raises(vramlab_torch.session.UsageError) as e:
            pick_output(bad)
        assert shown in str(e.value) and "\n" not in str(e.value)


def test_target_none_takes_a_models_own_loss():
    """--target none sums the output; a model that returns its own loss
    first (loss, logits), or as "loss", has that scalar summed, not its
    logits."""
    from vramlab_torch.step import pick_loss
    t3, t0 = torch.empty(2, 8, 5, device="meta"), torch.empty((), device="meta")
    assert pick_loss((t0, t3))[1] == "output[0]"
    assert pick_loss({"logits": t3, "loss": t0})[1] == "output['loss']"
    assert pick_loss({"logits": t3})[1] == "output['logits']"
    assert pick_loss(t3)[1] == "output"


def test_dict_output_uses_logits_and_says_so(user_file, tmp_path, capsys):
    """The MHA model of the pass returned {"aux": scalar, "logits": ...}:
    IndexError from a lambda in step.py."""
    code, out, err = run_main(tokens_args(f"{user_file}:dict_out", tmp_path / "d.pickle")[:-1], capsys)
    assert code == 0, err
    assert "loss (tokens) of the model's output['logits'] [2, 8, 100] float32" in out


def test_classes_target_on_a_per_token_output_hints_tokens(user_file, tmp_path, capsys):
    argv = tokens_args(f"{user_file}:dict_out", tmp_path / "c.pickle")
    argv[argv.index("tokens")] = "classes"
    code, out, err = run_main(argv, capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert "--target tokens" in err and "[2, 8, 100]" in err


# -- 4, 5. mistakes on the command line ----------------------------------------------

MISTAKES = {
    "no such file": (["nope.py:build"], 2, "BUILD 'nope.py:build': no file nope.py"),
    "no colon": (["{f}"], 2, "expected FILE.py:FUNCTION"),
    "no function": (["{f}:nothere"], 2, "has no 'nothere'; it defines"),
    "not a module": (["{f}:not_a_module"], 2, "not_a_module() returned int, not an nn.Module"),
    "no blocks": (["{f}:build_ok", "--checkpoint"], 2, "--checkpoint-class"),
    "bad shape": (["{f}:build_ok", "--input", "32,abc"], 2, "--input '32,abc'"),
    "capability": (["{f}:build_ok", "--capability", "hopper"], 2, "--capability 'hopper'"),
    "steps 0": (["{f}:build_ok", "--steps", "0"], 2, "--steps"),
    "steps -1": (["{f}:build_ok", "--steps", "-1"], 2, "--steps"),
    "dtypes": (["{f}:two", "--input", "2,8", "--input", "2,6", "--input-dtype", "float32,float32,int64"], 2,
               "--input-dtype: 3 dtypes for 2"),
    "float64": (["{f}:build_ok", "--input-dtype", "float64"], 2, "--input-dtype 'float64'"),
    "arg": (["{f}:build_ok", "--arg", "width=3"], 2, "--arg width"),
    "size 0": (["{f}:build_ok", "--input", "0,8"], 2, "--input '0,8': every size is 1 or more"),
    "target": (["{f}:build_ok", "--target", "foo"], 2, "--target 'foo': one of classes[:N], tokens"),
    "classes:abc": (["{f}:build_ok", "--target", "classes:abc"], 2, "N of classes:N"),
    "classes:0": (["{f}:build_ok", "--target", "classes:0"], 2, "N of classes:N"),
    "classes:-3": (["{f}:build_ok", "--target", "classes:-3"], 2, "N of classes:N"),
    "lr": (["{f}:build_ok", "--lr", "-1"], 2, "--lr: torch.optim.AdamW refuses it (Invalid learning rate"),
    "momentum": (["{f}:build_ok", "--optimizer", "sgd", "--momentum", "-1"], 2, "--momentum: torch.optim.SGD"),
    "momentum adamw": (["{f}:build_ok", "--momentum", "0.9"], 2, "--momentum 0.9: SGD's, with --optimizer sgd"),
    "out dir": (["{f}:build_ok", "--out", "{tmp}"], 2, "a directory; give the file to write"),
    "out no dir": (["{f}:build_ok", "--out", "{tmp}/nodir/x.pickle"], 2, "nodir; create it first"),
    "out unwritable": (["{f}:build_ok", "--out", "/proc/x.pickle"], 2, "--out /proc/x.pickle: cannot write it"),
    # What shows once the model runs: exit status 1.
    "classes:N against the output": (["{f}:build_ok", "--target", "classes:10"], 1,
                                      "the output used is [2, 8, 100], 100 classes, not 10"),
    "wrong input shape": (["{f}:two", "--input", "2,8", "--input", "2,7"], 1,
                          "first forward failed with --input 2,8 (float32) --input 2,7 (float32), "
                          "in module 'b' (Linear) at "),
    "value-sized op": (["{f}:nonzero"], 1, "runs torch.nonzero (also t[mask]"),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_mistakes_are_one_line(case, user_file, tmp_path, capsys):
    extra, want_code, want = MISTAKES[case]
    argv = ["record", *[e.replace("{f}", user_file).replace("{tmp}", str(tmp_path)) for e in extra]]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "x.pickle")]
    if "--input" not in argv:
        argv[2:2] = ["--input", "2,8", "--input-dtype", "int64"] if case != "float64" else ["--input", "2,8"]
    code, out, err = run_main(argv, capsys)
    assert code == want_code, (code, err)
    assert err.count("\n") == 1 and want.replace("{tmp}", str(tmp_path)) in err, err
    assert "Traceback" not in err and out == ""
    assert os.listdir(tmp_path) == ["user_models.py"]  # nothing written, nothing left


def test_checking_out_touches_no_link_and_opens_no_fifo(tmp_path):
    """--out is checked without writing through it: a dangling link was
    followed into an empty target and then removed; a FIFO without a
    reader blocked the check forever."""
    from vramlab_torch.__main__ import _check_out
    link = tmp_path / "link.pickle"
    link.symlink_to(tmp_path / "target.pickle")
    _check_out(str(link))
    assert link.is_symlink() and not (tmp_path / "target.pickle").exists()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _check_out(str(fifo))  # returns at once: nothing opens it
    assert sorted(os.listdir(tmp_path)) == ["link.pickle", "pipe"]


def test_a_failed_save_is_one_line(user_file, tmp_path, capsys, monkeypatch):
    def full(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(vramlab_torch.session.Recording, "save", full)
    code, out, err = run_main(tokens_args(f"{user_file}:build_ok", tmp_path / "x.pickle"), capsys)
    assert code == 1 and err.count("\n") == 1 and "cannot write it (No space left on device)" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_cuda_stream_in_forward_is_one_line(user_file, tmp_path, capsys):
    """torch.cuda.Stream() on a CUDA wheel without a driver raises
    torch.AcceleratorError ("CUDA error: CUDA driver version is
    insufficient ..."): it was a 44-line traceback."""
    code, out, err = run_main(tokens_args(f"{user_file}:stream_user", tmp_path / "x.pickle"), capsys)
    assert code == 1 and err.count("\n") == 1 and "user_models.py:" in err and "(forward)" in err, err


def test_cuda_runtime_errors_are_explained():
    from vramlab_torch.session import explain_error
    for text in ("CUDA error: CUDA driver version is insufficient for CUDA runtime version",
                 "CUDA error: no CUDA-capable device is detected"):
        try:
            raise RuntimeError(text)
        except RuntimeError as e:
            why = explain_error(e)
        assert why is not None and "asked the CUDA driver" in why and "test_usability.py:" in why, text


def test_value_sized_ops_are_one_line():
    """nonzero, masked_select, unique, ...: meta cannot size their output.
    It was a 66-line traceback ending in meta_nonzero_assume_all_nonzero."""
    for op, fix in [(lambda x: torch.nonzero(x), "nonzero_static"), (lambda x: x[x > 0], "nonzero_static"),
                    (lambda x: torch.masked_select(x, x > 0), "torch.where(mask, t, 0)"),
                    (lambda x: torch.unique(x), "fixed-size stand-in"),
                    (lambda x: torch.repeat_interleave(x.long()[0]), "output_size=")]:
        with pytest.raises(vramlab_torch.session.RecordingError, match="depends on the tensor's values") as e:
            with record(cublas_workspace="off"):
                op(torch.empty(4, 8))
        assert "\n" not in str(e.value) and fix in str(e.value) and "test_usability.py:" in str(e.value)


class _NoDevice(nn.Module):
    def __init__(self, stray=True):
        super().__init__()
        self.pos = nn.Embedding(16, 8)
        self.stray = stray

    def forward(self, x):
        ok = torch.arange(x.shape[1]).to(x.device) + torch.tensor(1.0)  # moved; a 0-dim scalar
        pos = torch.arange(x.shape[1]) if self.stray else torch.arange(x.shape[1], device=x.device)
        return self.pos(pos + ok.long()).expand(x.shape[0], -1, -1) * x.unsqueeze(-1)


def test_tensors_made_with_no_device_in_forward_are_said():
    """torch.arange(n) in forward is on the CPU in a CUDA run, where using it
    with the model's CUDA tensors fails; on meta it was recorded silently."""
    with pytest.warns(vramlab_torch.session.RecordingWarning, match="no device inside forward") as w:
        with record(cublas_workspace="off") as rec:
            _NoDevice()(torch.empty(2, 4)).sum().backward()
    nd = rec.meta["no_device_in_forward"]
    assert nd["call_sites"] == 1 and nd["tensors"] == 1 and nd["bytes"] == 4 * 8, nd
    assert nd["first"].startswith("torch.arange at ") and "test_usability.py" in nd["first"]
    assert "Expected all tensors to be on the same device" in " ".join(str(x.message) for x in w)
    with warnings.catch_warnings():
        warnings.simplefilter("error", vramlab_torch.session.RecordingWarning)
        with record(cublas_workspace="off") as rec:
            _NoDevice(stray=False)(torch.empty(2, 4)).sum().backward()
            torch.arange(5)  # outside forward: the block's default device, as documented
    assert "no_device_in_forward" not in rec.meta


def test_sgd_follows_torch_optims_defaults_and_the_metadata_says(user_file, tmp_path, capsys):
    """--optimizer sgd had momentum 0.9 by default, where torch.optim.SGD
    (and the README) say 0: a momentum buffer per parameter more."""
    import json
    argv = tokens_args(f"{user_file}:build_ok", tmp_path / "s.pickle")
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    plain = json.loads(out)
    assert plain["meta"]["momentum"] == 0 and plain["meta"]["weight_decay"] == 0
    assert plain["meta"]["optimizer_options"]["foreach"] is True
    assert "optimizer_state" not in plain["end_by_category"]
    code, out, err = run_main(argv + ["--momentum", "0.9", "--weight-decay", "0.1"], capsys)
    assert code == 0, err
    m = json.loads(out)
    assert m["meta"]["momentum"] == 0.9 and m["meta"]["optimizer_options"]["weight_decay"] == 0.1
    assert m["end_by_category"]["optimizer_state"] == m["end_by_category"]["parameter"]
    with open(tmp_path / "s.pickle", "rb") as f:
        assert pickle.load(f)["vramlab_torch"]["momentum"] == 0.9


def test_the_users_own_errors_keep_their_traceback(user_file, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    r = subprocess.run([sys.executable, "-m", "vramlab_torch", "record", f"{user_file}:broken", "--input", "1,4",
                        "--out", str(tmp_path / "x.pickle")], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "Traceback" in r.stderr and "forward exploded" in r.stderr
    assert 'raise ValueError("forward exploded")' in r.stderr
    r = subprocess.run([sys.executable, "-m", "vramlab_torch", "record", f"{user_file}:build", "--input", "2,y",
                        "--out", str(tmp_path / "x.pickle")], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--input '2,y'" in r.stderr, r.stderr


def test_the_api_checks_steps_and_dtypes():
    with pytest.raises(ValueError, match="at least 1 step"):
        record_step(lambda: nn.Linear(4, 2), inputs=[(2, 4)], steps=0)
    with pytest.raises(ValueError, match="2 dtypes for 1 input"):
        record_step(lambda: nn.Linear(4, 2), inputs=[(2, 4)], input_dtypes=[torch.float32] * 2)


# -- 6. layers meta runs through its fallback kernels --------------------------------

class _Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.rnn = nn.LSTM(16, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.rnn(self.enc(x))[0][:, -1])


def test_layers_recorded_as_meta_runs_them_are_said(tmp_path):
    with pytest.warns(vramlab_torch.session.RecordingWarning) as w:
        rec = record_step(_Layers, inputs=[(2, 5, 16)], steps=1, cublas_workspace="off")
    said = " ".join(str(x.message) for x in w)
    assert "1 nn.MultiheadAttention layer (enc.self_attn)" in said and "flash" in said
    assert "1 nn.LSTM layer (rnn)" in said and "cuDNN" in said
    fk = rec.meta["fallback_kernels"]
    assert fk["nn.MultiheadAttention"]["modules"] == ["enc.self_attn"] and fk["nn.LSTM"]["modules"] == ["rnn"]
    rec.save(str(tmp_path / "l.pickle"))
    with open(tmp_path / "l.pickle", "rb") as f:
        assert "nn.LSTM" in pickle.load(f)["vramlab_torch"]["fallback_kernels"]
    with pytest.warns(vramlab_torch.session.RecordingWarning, match="nn.GRU layer"):
        with record(cublas_workspace="off"):
            nn.GRU(4, 4)(torch.randn(3, 2, 4))[0].sum().backward()


# -- 7. nits ---------------------------------------------------------------------------

def test_amp_spellings_help_once_and_small_amounts(user_file, tmp_path, capsys):
    for amp in ("fp16", "bf16", "float16", "bfloat16"):
        argv = tokens_args(f"{user_file}:build_ok", tmp_path / "a.pickle") + ["--amp", amp]
        code, out, err = run_main(argv, capsys)
        assert code == 0, err
    code, out, err = run_main(["record", f"{user_file}:build_ok", "--input", "2,8", "--input-dtype", "int64",
                               "--target", "tokens", "--steps", "1", "--out", str(tmp_path / "s.pickle")], capsys)
    assert code == 0 and "0.0 MiB" not in out and " KiB" in out and " B" in out, out
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["record", "--help"])
    rec_help = capsys.readouterr().out
    assert "cannot see (not in the file)" not in top and "record --help" in top
    assert rec_help.count("cannot see (not in the file)") == 1 and "fp16" in rec_help
    from vramlab_torch.__main__ import AMP_CHOICES
    from vramlab_torch.step import AMP_DTYPES
    assert set(AMP_CHOICES) == set(AMP_DTYPES)
    from vramlab_torch.session import human_bytes
    assert [human_bytes(n) for n in (0, 512, 1536, 3 * 2**20, 5 * 2**30)] == \
        ["0 B", "512 B", "1.5 KiB", "3.0 MiB", "5.00 GiB"]


def test_fsdp_without_blocks_lists_the_classes():
    """--dist fsdp on a model with no repeated blocks named no class to pass
    to --fsdp-blocks, where --checkpoint's error lists them."""
    from vramlab_torch.distributed import find_blocks
    from vramlab_torch.session import UsageError
    with pytest.raises(UsageError, match=r"--fsdp-blocks CLASS \(the model's classes: .*Linear"):
        find_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
