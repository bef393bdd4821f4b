#!/usr/bin/env python3
"""The recorder on fake tensors against the same training steps run on CUDA.

For each model below, two halves:

  a. `python -m vramlab_torch record ... --steps 2 --json` (no GPU used: the
     child runs with CUDA_VISIBLE_DEVICES=""), its summary kept: peak of live
     tensor bytes, its caching-allocator model's peak allocated / reserved;
     the snapshot written to OUT/<name>.pred.pickle where kept;
  b. the same program on the GPU: the model built with the same builder (on
     the CPU, then .to("cuda"), which allocates the parameters as the
     recorder's to_empty does), the inputs and target made as the recorder
     makes them (then filled in place with valid values), the recorder's own
     optimizer and loss functions (vramlab_torch.step), autocast, 2 steps of
     forward + loss / backward / step / zero_grad(set_to_none=True), under
     torch.cuda.memory._record_memory_history(stacks="python"), from a clean
     allocator (empty_cache, cuBLAS workspaces cleared, peaks reset); then
     max_memory_allocated / max_memory_reserved / memory_allocated /
     memory_reserved and memory_stats(), and the snapshot dumped to
     OUT/<name>.cuda.pickle where kept.

Models (--models picks some):
  resnet50         torchvision's resnet50 (else vramlab_torch.models:resnet50,
                   the same network written out), batch 32, 224x224, fp32,
                   SGD momentum 0.9, lr 0.1 (as scripts/compare_estimators.py)
  gpt2-bf16        vramlab_torch.models:gpt2 (GPT-2 small, 124M, tied head),
                   batch 8 x 1024 tokens, AdamW foreach, bf16 autocast
  gpt2-fp32        the same in float32
  simple-convnet   scripts/torch_reference.py's SimpleConvNet, batch 64,
                   3x32x32, Adam lr 1e-3

Everything goes to OUT/cuda_check.json (rewritten as results come in) and
one line per model is printed. At most 8 files are left in OUT: the JSON and
at most 7 pickles (by default both for resnet50, gpt2-bf16 and gpt2-fp32,
the prediction alone for simple-convnet), each under 15 MB (a bigger one is
rewritten without its stack frames, else deleted; the JSON says which).

The CUDA halves run in one child process, one model after another (a crash
there is recorded and a fresh child takes the remaining models); the
recorders run as their own processes beside it (--jobs at a time). Nothing
outlives --budget seconds (default 75): what has not finished is killed and
marked so. Without CUDA (or with --dry-run) only the recordings run and the
CUDA halves are marked skipped.

    PYTHONPATH=python python3 scripts/cuda_recorder_check.py --out DIR
    PYTHONPATH=python python3 scripts/cuda_recorder_check.py --dry-run --out /tmp/cc
"""

import argparse
import datetime
import gc
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PKG = os.path.join(ROOT, "python")
THIS = os.path.relpath(os.path.abspath(__file__), ROOT)
MAX_FILE_BYTES = 15 * 1000 * 1000
MAX_FILES = 8
RESULT = "@@RESULT "
ENV = "@@ENV "
# Environment variables that change what PyTorch allocates (or how the
# recorder models it): recorded, never changed.
ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
            "TORCH_CUBLAS_WORKSPACE_CACHE", "CUBLASLT_WORKSPACE_SIZE",
            "TORCH_CUBLASLT_UNIFIED_WORKSPACE", "CUDA_MODULE_LOADING", "CUDA_VISIBLE_DEVICES",
            "PYTORCH_NO_CUDA_MEMORY_CACHING", "TORCH_CUDNN_V8_API_DISABLED", "CUDNN_LOGINFO_DBG")


# -- the models (builders are called with no arguments) ----------------------------

def simple_convnet():
    """scripts/torch_reference.py's SimpleConvNet, taken from that file's
    source (the file itself imports safetensors at the top, which need not
    be installed): same class, same line numbers in the frames."""
    import ast
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    path = os.path.join(HERE, "torch_reference.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SimpleConvNet")
    ns = {"torch": torch, "nn": nn, "F": F, "math": math, "__name__": "torch_reference"}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), ns)
    return ns["SimpleConvNet"]()


def resnet_builder():
    import importlib.util
    try:
        if importlib.util.find_spec("torchvision") is not None:
            return "torchvision.models:resnet50", "torchvision.models.resnet50(weights=None)"
    except (ImportError, ValueError):
        pass
    return ("vramlab_torch.models:resnet50",
            "vramlab_torch.models.resnet50 (torchvision not importable; the same network written out)")


def model_specs():
    rb, rdesc = resnet_builder()
    gpt = dict(builder="vramlab_torch.models:gpt2", input=[[8, 1024]], input_dtype=["int64"],
               target="tokens", vocab=50257, optimizer="adamw", lr=1e-3, weight_decay=None,
               impl="foreach", sdpa_probe=[8, 12, 1024, 64])
    return [
        dict(name="resnet50", label=f"ResNet-50 ({rdesc}), batch 32, 224x224, fp32, SGD momentum 0.9",
             builder=rb, input=[[32, 3, 224, 224]], input_dtype=["float32"], target="classes:1000",
             optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=None, impl="foreach", amp=None),
        dict(gpt, name="gpt2-bf16", amp="bf16",
             label="GPT-2 small (vramlab_torch.models:gpt2), batch 8 x 1024, AdamW foreach, bf16 autocast"),
        dict(gpt, name="gpt2-fp32", amp=None,
             label="GPT-2 small (vramlab_torch.models:gpt2), batch 8 x 1024, AdamW foreach, fp32"),
        dict(name="simple-convnet",
             label="SimpleConvNet (scripts/torch_reference.py), batch 64, 3x32x32, fp32, Adam",
             builder=f"{THIS}:simple_convnet", input=[[64, 3, 32, 32]], input_dtype=["float32"],
             target="classes:10", optimizer="adam", lr=1e-3, weight_decay=None, impl="foreach", amp=None),
        # The README's 1.26B decoder (without checkpointing: the CUDA half
        # runs the plain step), and convolution nets the cuDNN workspace rule
        # was not fitted on: its held-out check.
        dict(name="llama-1b-bf16",
             label="1.26B decoder (vramlab_torch.models:llama_1b), batch 1 x 2048, AdamW foreach, bf16 autocast",
             builder="vramlab_torch.models:llama_1b", input=[[1, 2048]], input_dtype=["int64"],
             target="tokens", vocab=32000, optimizer="adamw", lr=1e-3, weight_decay=None,
             impl="foreach", amp="bf16"),
    ] + held_out_convnets()


def held_out_convnets():
    """torchvision's ResNet-18 and MobileNetV2, batch 32, 224x224, fp32, SGD,
    where torchvision imports (the GPU machine's image has it)."""
    import importlib.util
    try:
        if importlib.util.find_spec("torchvision") is None:
            return []
    except (ImportError, ValueError):
        return []
    return [
        dict(name=name, label=f"{name} (torchvision.models:{fn}), batch 32, 224x224, fp32, SGD momentum 0.9",
             builder=f"torchvision.models:{fn}", input=[[32, 3, 224, 224]], input_dtype=["float32"],
             target="classes:1000", optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=None,
             impl="foreach", amp=None)
        for name, fn in [("resnet18", "resnet18"), ("mobilenet-v2", "mobilenet_v2")]
    ]


def recorder_command(py, spec, steps, out):
    cmd = [py, "-m", "vramlab_torch", "record", spec["builder"]]
    for shape in spec["input"]:
        cmd += ["--input", ",".join(map(str, shape))]
    for d in spec["input_dtype"]:
        cmd += ["--input-dtype", d]
    if spec.get("vocab"):
        cmd += ["--vocab", str(spec["vocab"])]
    cmd += ["--target", spec["target"], "--optimizer", spec["optimizer"], "--lr", repr(spec["lr"])]
    if spec.get("weight_decay") is not None:
        cmd += ["--weight-decay", repr(spec["weight_decay"])]
    if spec["optimizer"] == "sgd":
        cmd += ["--momentum", repr(spec.get("momentum", 0.9))]
    cmd += [{"foreach": "--foreach", "for-loop": "--for-loop", "fused": "--fused"}[spec["impl"]]]
    if spec.get("amp"):
        cmd += ["--amp", spec["amp"]]
    cmd += ["--steps", str(steps), "--short-paths", "--out", out, "--json"]
    return cmd


# -- the CUDA half (the worker child) -----------------------------------------------

class _Helpers:
    """The recorder's own builder loader, optimizer, target and loss
    (vramlab_torch.step), so the CUDA program is the recorded one; copies of
    them if the package does not import under this PyTorch."""

    def __init__(self):
        self.source = "vramlab_torch.step"
        try:
            from vramlab_torch import step
            self.load_builder, self.build_optimizer = step.load_builder, step.build_optimizer
            self.make_target, self.first_tensor = step.make_target, step.first_tensor
            self.DTYPES = step.DTYPES
        except Exception as e:  # noqa: BLE001 - fall back, and say so
            self.source = f"the script's copies (import vramlab_torch.step failed: {type(e).__name__}: {e})"
            self.load_builder, self.build_optimizer = _load_builder, _build_optimizer
            self.make_target, self.first_tensor = _make_target, _first_tensor
            import torch
            self.DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                           "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
                           "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _load_builder(spec):
    import importlib
    import importlib.util
    where, fn = spec.rsplit(":", 1)
    if where.endswith(".py") or os.path.sep in where or os.path.exists(where):
        path = os.path.abspath(where)
        name = "vramlab_user_" + os.path.splitext(os.path.basename(path))[0]
        s = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(s)
        sys.modules[name] = mod
        s.loader.exec_module(mod)
    else:
        mod = importlib.import_module(where)
    return getattr(mod, fn)


def _build_optimizer(name, params, lr, impl, weight_decay=None, momentum=0.9, betas=(0.9, 0.999)):
    import torch
    kw = {"foreach": dict(foreach=True), "for-loop": dict(foreach=False), "fused": dict(fused=True)}[impl]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay or 0.0, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay or 0.0, **kw)
    wd = 0.01 if weight_decay is None else weight_decay
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=wd, **kw)


def _make_target(target, inputs, probe):
    import torch
    import torch.nn.functional as F
    if target.startswith("classes"):
        y = torch.empty(inputs[0].shape[0], dtype=torch.int64)
        return y, lambda o, y: F.cross_entropy(o.reshape(-1, o.shape[-1]) if o.dim() > 2 else o, y)
    if target == "tokens":
        y = torch.empty(inputs[0].shape, dtype=torch.int64)
        return y, lambda o, y: F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1))
    raise ValueError(f"target {target!r}")


def _first_tensor(out):
    import torch
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, dict):
        out = list(out.values())
    for o in out:
        if isinstance(o, torch.Tensor):
            return o
    raise TypeError(f"the model returned {type(out).__name__}")


def _attrs(obj, names):
    out = {}
    for n in names:
        try:
            v = getattr(obj, n)
            v = v() if callable(v) else v
            out[n] = v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
        except Exception as e:  # noqa: BLE001
            out[n] = f"unavailable ({type(e).__name__})"
    return out


def cuda_environment(torch):
    import warnings
    env = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "python": sys.version.split()[0],
           "executable": sys.executable, "cuda_available": torch.cuda.is_available(),
           "device_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if not env["cuda_available"]:
        return env
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            env["cudnn"] = torch.backends.cudnn.version()
        except Exception as e:  # noqa: BLE001
            env["cudnn"] = f"unavailable ({e})"
        p = torch.cuda.get_device_properties(0)
        env["device"] = _attrs(p, ["name", "major", "minor", "total_memory", "multi_processor_count",
                                   "L2_cache_size", "uuid"])
        env["capability"] = list(torch.cuda.get_device_capability(0))
        env["backends_cuda"] = _attrs(torch.backends.cuda, [
            "flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled",
            "preferred_blas_library", "preferred_linalg_library"])
        env["backends_cuda"]["matmul"] = _attrs(torch.backends.cuda.matmul, [
            "allow_tf32", "allow_bf16_reduced_precision_reduction",
            "allow_fp16_reduced_precision_reduction", "fp32_precision"])
        env["backends_cudnn"] = _attrs(torch.backends.cudnn, [
            "enabled", "benchmark", "deterministic", "allow_tf32", "fp32_precision"])
        env["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        if hasattr(torch._C, "_get_sdp_priority_order"):
            try:
                env["sdp_priority_order"] = [str(x) for x in torch._C._get_sdp_priority_order()]
            except Exception as e:  # noqa: BLE001
                env["sdp_priority_order"] = f"unavailable ({e})"
        env["has_clear_cublas_workspaces"] = hasattr(torch._C, "_cuda_clearCublasWorkspaces")
    return env


def _history_kwargs(torch, max_entries):
    import inspect
    # Turning the history off (enabled=None, after each model) already
    # empties the trace buffer; clear_history=True says so again where the
    # signature has it (_record_memory_history takes **kwargs and passes
    # them to _record_memory_history_impl in recent PyTorch).
    kw = dict(enabled="all", context="all", stacks="python", max_entries=max_entries)
    fn = getattr(torch.cuda.memory, "_record_memory_history_impl", torch.cuda.memory._record_memory_history)
    try:
        if "clear_history" in inspect.signature(fn).parameters:
            kw["clear_history"] = True
    except (TypeError, ValueError):
        pass
    return kw


def _clean(torch):
    gc.collect()
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()


def _stats(torch):
    keep = ("allocated_bytes.all.", "reserved_bytes.all.", "requested_bytes.all.", "active_bytes.all.",
            "inactive_split_bytes.all.", "allocation.all.", "segment.all.", "oversize_")
    return {k: v for k, v in torch.cuda.memory_stats().items()
            if k.startswith(keep) or k in ("num_alloc_retries", "num_ooms", "num_device_alloc",
                                           "num_device_free", "num_sync_all_streams")}


def _strip_frames(snap):
    for trace in snap.get("device_traces", []):
        for e in trace:
            if "frames" in e:
                e["frames"] = []
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            if "frames" in b:
                b["frames"] = []
    return snap


def cuda_one(torch, h, spec, steps, out_dir, dump, max_entries, dev="cuda"):
    """One model's steps on CUDA; returns its result dict. (dev: "cuda";
    anything else only to try the program out with torch.cuda stubbed.)"""
    import contextlib
    res = {"name": spec["name"], "helpers": h.source}
    t0 = time.perf_counter()
    build = h.load_builder(spec["builder"])
    model = build()  # on the CPU, initialised; moved to the GPU below
    model.train()
    t_build = time.perf_counter()
    _clean(torch)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    res["baseline"] = dict(allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
    free0, total = torch.cuda.mem_get_info()
    res["mem_get_info_before"] = dict(free=free0, total=total)
    torch.cuda.memory._record_memory_history(**_history_kwargs(torch, max_entries))
    recording = True
    model_ = opt = xs = y = params = x = snap = None
    try:
        t1 = time.perf_counter()
        model_ = model.to(dev)
        del model
        params = list(model_.parameters())
        dtypes = [h.DTYPES[d] for d in spec["input_dtype"]]
        while len(dtypes) < len(spec["input"]):
            dtypes.append(dtypes[-1])
        xs = [torch.empty(tuple(s), dtype=d, device=dev) for s, d in zip(spec["input"], dtypes)]
        for x in xs:  # in place: no allocation
            if x.is_floating_point():
                x.normal_()
            else:
                x.random_(0, spec.get("vocab") or 2)
        with torch.device(dev):
            y, loss_fn = h.make_target(spec["target"], xs, None)
        if y is not None:
            hi = spec["vocab"] if spec["target"] == "tokens" else int((spec["target"].split(":") + ["1000"])[1])
            y.random_(0, hi)
        opt = h.build_optimizer(spec["optimizer"], params, spec["lr"], spec["impl"], spec.get("weight_decay"),
                                spec.get("momentum", 0.9))
        del params
        amp = h.DTYPES[spec["amp"]] if spec.get("amp") else None

        # A training loop, as the recorder's step: out and loss stay bound
        # until the next step rebinds them (each old one freed after the new
        # one exists), and the last step's are alive at the end.
        held = {}
        for _ in range(steps):
            ctx = torch.autocast(dev, dtype=amp) if amp else contextlib.nullcontext()
            with ctx:
                held["out"] = model_(*xs)
                held["loss"] = loss_fn(h.first_tensor(held["out"]), y)
            held["loss"].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t_steps = time.perf_counter()
        res.update(peak_allocated=torch.cuda.max_memory_allocated(),
                   peak_reserved=torch.cuda.max_memory_reserved(),
                   end_allocated=torch.cuda.memory_allocated(), end_reserved=torch.cuda.memory_reserved(),
                   memory_stats=_stats(torch))
        free1, _ = torch.cuda.mem_get_info()
        res["mem_get_info_after"] = dict(free=free1, total=total)
        # What the device holds beyond the caching allocator's segments
        # (the CUDA context, cuBLAS/cuDNN handles, loaded kernels), and
        # other processes on the GPU if any.
        res["device_used_minus_reserved"] = (total - free1) - torch.cuda.memory_reserved()
        if dump:
            # What torch.cuda.memory._dump_snapshot(path) writes (_snapshot()
            # pickled), taken once so that its size can be checked and, if
            # need be, the frames dropped without a second snapshot.
            path = os.path.join(out_dir, f"{spec['name']}.cuda.pickle")
            snap = torch.cuda.memory._snapshot()
            entries = sum(len(t) for t in snap.get("device_traces", []))
            res["trace_entries"] = entries
            res["trace_may_be_truncated"] = entries >= max_entries
            with open(path, "wb") as f:
                pickle.dump(snap, f)
            size = os.path.getsize(path)
            res["pickle"] = dict(path=os.path.basename(path), bytes=size)
            if size > MAX_FILE_BYTES:
                with open(path, "wb") as f:
                    pickle.dump(_strip_frames(snap), f)
                size2 = os.path.getsize(path)
                res["pickle"] = dict(path=os.path.basename(path), bytes=size2,
                                     note=f"{size} bytes with frames: rewritten without them")
                if size2 > MAX_FILE_BYTES:
                    os.remove(path)
                    res["pickle"] = dict(path=None, note=f"{size} bytes with frames, {size2} without: "
                                                         f"over {MAX_FILE_BYTES}, deleted")
            snap = None
        t_dump = time.perf_counter()
        torch.cuda.memory._record_memory_history(enabled=None)
        recording = False
        res["seconds"] = dict(build_on_cpu=round(t_build - t0, 3), steps=round(t_steps - t1, 3),
                              dump=round(t_dump - t_steps, 3))
        if spec.get("sdpa_probe"):
            res["sdpa_choice"] = sdpa_choice(torch, spec["sdpa_probe"], amp or torch.float32, dev)
    except Exception as e:  # noqa: BLE001 - keep what was measured before it
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-4000:]
        e = None  # noqa: F841 - the traceback holds the step's tensors
    finally:
        if recording:
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001
                pass
        model = model_ = opt = xs = y = loss_fn = train_step = params = x = snap = None  # noqa: F841
        _clean(torch)
    res["after_free"] = dict(allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
    res["seconds"] = dict(res.get("seconds", {}), wall=round(time.perf_counter() - t0, 3))
    return res


def sdpa_choice(torch, shape, dtype, dev="cuda"):
    """The backend F.scaled_dot_product_attention takes on this GPU for q,
    k, v made as vramlab_torch.models' CausalSelfAttention makes them (views
    of one [B, T, 3C] projection; causal, no mask, requiring grad)."""
    try:
        b, nh, t, d = shape
        qkv = torch.empty(b, t, 3 * nh * d, device=dev, dtype=dtype, requires_grad=True)
        q, k, v = (z.view(b, t, nh, d).transpose(1, 2) for z in qkv.split(nh * d, dim=2))
        i = int(torch._fused_sdp_choice(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True))
        del q, k, v, qkv
        names = {-1: "ERROR", 0: "MATH", 1: "FLASH_ATTENTION", 2: "EFFICIENT_ATTENTION",
                 3: "CUDNN_ATTENTION", 4: "OVERRIDEABLE"}
        try:
            from torch.nn.attention import SDPBackend
            names.update({int(v): k for k, v in SDPBackend.__members__.items()})
        except Exception:  # noqa: BLE001
            pass
        return dict(dtype=str(dtype).replace("torch.", ""), shape=shape, backend=names.get(i, str(i)))
    except Exception as e:  # noqa: BLE001
        return dict(error=f"{type(e).__name__}: {e}")


def worker(a):
    """The child that runs the CUDA halves: prints ENV then one RESULT line
    per model, flushed, so a crash loses only the model it happened in."""
    t0 = time.perf_counter()
    import torch
    t_import = time.perf_counter()
    env = cuda_environment(torch)
    if env["cuda_available"]:
        torch.zeros(1, device="cuda")  # the context, before any model
        torch.cuda.synchronize()
        env["init_seconds"] = round(time.perf_counter() - t_import, 3)
    env["import_seconds"] = round(t_import - t0, 3)
    h = _Helpers()
    env["helpers"] = h.source
    print(ENV + json.dumps(env), flush=True)
    if not env["cuda_available"]:
        return 0
    specs = {s["name"]: s for s in model_specs()}
    dumps = set(a.cuda_dumps.split(",")) if a.cuda_dumps else set()
    for name in a.worker.split(","):
        try:
            res = cuda_one(torch, h, specs[name], a.steps, a.out, name in dumps, a.max_entries)
        except Exception as e:  # noqa: BLE001
            res = {"name": name, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-4000:]}
            e = None
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
                _clean(torch)
            except Exception as e2:  # noqa: BLE001
                res["cleanup_error"] = f"{type(e2).__name__}: {e2}"
        print(RESULT + json.dumps(res), flush=True)
    return 0


# -- the orchestrator -----------------------------------------------------------------

def mib(n):
    return "—" if n is None else f"{n / 2**20:,.1f} MiB"


def pct(pred, real):
    if pred is None or not real:
        return None
    return round(100.0 * (pred - real) / real, 2)


def tail(path, n=3000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def run_shell(cmd, timeout=10):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout.strip() if p.returncode == 0 else f"rc {p.returncode}: {p.stderr.strip()[-300:]}"
    except Exception as e:  # noqa: BLE001
        return f"unavailable ({type(e).__name__}: {e})"


class Check:
    def __init__(self, a):
        self.a = a
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + a.budget
        self.tmp = tempfile.mkdtemp(prefix="cuda_recorder_check.")
        self.procs = []  # every child started, to end them if this process fails
        specs = {s["name"]: s for s in model_specs()}
        unknown = [m for m in a.models if m not in specs]
        if unknown:
            raise SystemExit(f"unknown model(s) {unknown}: {', '.join(specs)}")
        self.specs = [specs[m] for m in a.models]
        self.results = {s["name"]: dict(name=s["name"], label=s["label"],
                                        options={k: v for k, v in s.items() if k not in ("name", "label")},
                                        steps=a.steps, recorder={}, cuda={})
                        for s in self.specs}
        self.plan_files()
        self.doc = {
            "script": THIS, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "argv": sys.argv[1:], "dry_run": a.dry_run, "out_dir": os.path.abspath(a.out),
            "limits": dict(max_file_bytes=MAX_FILE_BYTES, max_files=MAX_FILES, budget_seconds=a.budget,
                           jobs=a.jobs),
            "environment": {
                "python": sys.version.split()[0], "executable": a.python, "platform": platform.platform(),
                "cpus": os.cpu_count(), "env": {k: os.environ.get(k) for k in ENV_VARS},
                "git_head": run_shell(["git", "-C", ROOT, "rev-parse", "HEAD"]),
                "nvidia_smi": (run_shell(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                          "memory.used", "--format=csv,noheader"])
                               if shutil.which("nvidia-smi") else "not on PATH"),
            },
            "notes": [
                "cuda.peak_allocated / peak_reserved: torch.cuda.max_memory_allocated() / "
                "max_memory_reserved() over the 2 steps (model.to('cuda') included), from an empty "
                "caching allocator (empty_cache, cuBLAS workspaces cleared, peak stats reset); they "
                "count every block of the caching allocator: cuBLAS and cuDNN workspaces when PyTorch "
                "allocates them through it, but not the CUDA context, handles and kernels "
                "(cuda.device_used_minus_reserved, from mem_get_info, is that and any other process).",
                "recorder.summary: `python -m vramlab_torch record ... --json` run with "
                "CUDA_VISIBLE_DEVICES='' (what a machine without a GPU sees): peak_live_bytes (live "
                "tensor bytes as requested), allocator_model.peak_allocated / peak_reserved (its model "
                "of the caching allocator; compare with cuda.peak_allocated / peak_reserved), and "
                "cuda.memory_stats['requested_bytes.all.peak'] is the real counterpart of "
                "peak_live_bytes.",
                "comparison.*_pct: (predicted - real) / real, in percent.",
            ],
            "models": [self.results[s["name"]] for s in self.specs],
        }

    # Which pickles are kept: at most MAX_FILES files in OUT in all.
    def plan_files(self):
        a = self.a
        os.makedirs(a.out, exist_ok=True)
        ours = {"cuda_check.json"} | {f"{s['name']}.{k}.pickle" for s in model_specs() for k in ("pred", "cuda")}
        for f in os.listdir(a.out):
            if f in ours:
                os.remove(os.path.join(a.out, f))
        others = [f for f in os.listdir(a.out)
                  if not f.startswith(".cuda_check") and os.path.isfile(os.path.join(a.out, f))]
        room = MAX_FILES - 1 - len(others)
        wanted = []  # (name, kind) in priority order
        both = [m for m in a.dump_both if m in self.results]
        pred = [m for m in a.dump_pred if m in self.results and m not in both]
        for m in both:
            wanted.append((m, "pred"))
            if not a.dry_run:
                wanted.append((m, "cuda"))
        wanted += [(m, "pred") for m in pred]
        self.keep = set(wanted[:max(room, 0)])
        self.files_note = (f"{len(others)} other file(s) already in the folder; room for {max(room, 0)} "
                           f"pickle(s): " + ", ".join(f"{m}.{k}.pickle" for m, k in wanted[:max(room, 0)]))

    def left(self):
        return self.deadline - time.perf_counter()

    def write_json(self):
        self.doc["total_seconds"] = round(time.perf_counter() - self.t0, 3)
        path = os.path.join(self.a.out, "cuda_check.json")
        tmp = os.path.join(self.a.out, ".cuda_check.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1, default=str)
            f.write("\n")
        os.replace(tmp, path)

    def child_env(self, hide_gpu):
        env = dict(os.environ)
        env["PYTHONPATH"] = PKG + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        if hide_gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    # -- recorder processes ----------------------------------------------------
    def start_recorder(self, spec):
        name = spec["name"]
        out = os.path.join(self.tmp, f"{name}.pred.pickle")
        cmd = recorder_command(self.a.python, spec, self.a.steps, out)
        r = self.results[name]["recorder"]
        r["command"] = "python " + " ".join(cmd[1:])
        p = self.spawn(cmd, f"{name}.rec", hide_gpu=True)
        return dict(p=p, name=name, out=out, t0=time.perf_counter())

    def spawn(self, cmd, tag, hide_gpu):
        """A child process whose output goes to TAG.out and TAG.err in the
        scratch folder; killed with the rest when time runs out."""
        with open(os.path.join(self.tmp, f"{tag}.out"), "w") as so, \
                open(os.path.join(self.tmp, f"{tag}.err"), "w") as se:
            p = subprocess.Popen(cmd, cwd=ROOT, env=self.child_env(hide_gpu), stdout=so, stderr=se)
        self.procs.append(p)
        return p

    def finish_recorder(self, job, killed=False):
        name = job["name"]
        r = self.results[name]["recorder"]
        r["wall_seconds"] = round(time.perf_counter() - job["t0"], 3)
        out_txt = tail(os.path.join(self.tmp, f"{name}.rec.out"), 10 ** 7)
        if killed:
            r["error"] = f"killed at the time budget ({self.a.budget} s)"
        elif job["p"].returncode != 0:
            r["error"] = (f"exit status {job['p'].returncode}: "
                          + tail(os.path.join(self.tmp, f"{name}.rec.err")))
        else:
            try:
                s = json.loads(out_txt)
                r["summary"] = s
            except ValueError as e:
                r["error"] = f"unreadable --json output ({e}): {out_txt[-1000:]}"
        if os.path.exists(job["out"]):
            self.keep_pred(name, job["out"], r)
        self.log_progress(name, "recording", r)

    def keep_pred(self, name, path, r):
        size = os.path.getsize(path)
        if (name, "pred") not in self.keep:
            r["pickle"] = dict(path=None, bytes=size, note="not kept (file limit)")
            os.remove(path)
            return
        note = None
        if size > MAX_FILE_BYTES:
            with open(path, "rb") as f:
                snap = pickle.load(f)  # the recorder's own plain-dict pickle
            with open(path, "wb") as f:
                pickle.dump(_strip_frames(snap), f)
            size2 = os.path.getsize(path)
            note = f"{size} bytes with frames: rewritten without them"
            if size2 > MAX_FILE_BYTES:
                os.remove(path)
                r["pickle"] = dict(path=None, note=f"{size} bytes with frames, {size2} without: deleted")
                return
            size = size2
        dest = os.path.join(self.a.out, f"{name}.pred.pickle")
        shutil.move(path, dest)
        r["pickle"] = dict(path=os.path.basename(dest), bytes=size, **({"note": note} if note else {}))

    # -- the CUDA worker ---------------------------------------------------------
    def start_worker(self, names):
        cmd = [self.a.python, os.path.abspath(__file__), "--worker", ",".join(names), "--out", self.a.out,
               "--steps", str(self.a.steps), "--max-entries", str(self.a.max_entries),
               "--max-file-bytes", str(MAX_FILE_BYTES),
               "--cuda-dumps", ",".join(n for n in names if (n, "cuda") in self.keep)]
        k = len(self.doc.setdefault("cuda_workers", []))
        p = self.spawn(cmd, f"worker{k}", hide_gpu=False)
        info = dict(models=names, t0=time.perf_counter())
        self.doc["cuda_workers"].append(info)
        return dict(p=p, k=k, names=names, info=info, seen=0)

    def read_worker(self, w, final=False, killed=False):
        """Takes the lines the worker has printed so far; at the end,
        returns the models it did not finish."""
        def parsed(ln, prefix):
            try:
                return json.loads(ln[len(prefix):])
            except ValueError:  # a line cut short by a kill
                return None

        lines = tail(os.path.join(self.tmp, f"worker{w['k']}.out"), 10 ** 8).splitlines()
        lines = [ln for ln in lines if (ln.startswith(ENV) and parsed(ln, ENV) is not None)
                 or (ln.startswith(RESULT) and parsed(ln, RESULT) is not None)]
        done = []
        for ln in lines:
            if ln.startswith(ENV):
                if "environment_cuda" not in self.doc:
                    self.doc["environment_cuda"] = parsed(ln, ENV)
            else:
                done.append(parsed(ln, RESULT)["name"])
        new = [ln for ln in lines if ln.startswith(RESULT)][w["seen"]:]
        for ln in new:
            res = parsed(ln, RESULT)
            self.results[res["name"]]["cuda"] = res
            self.log_progress(res["name"], "CUDA run", res)
        w["seen"] += len(new)
        if not final:
            return None
        w["info"]["seconds"] = round(time.perf_counter() - w["info"].pop("t0"), 3)
        w["info"]["returncode"] = w["p"].returncode
        err = tail(os.path.join(self.tmp, f"worker{w['k']}.err"))
        env = self.doc.get("environment_cuda")
        if env is not None and not env.get("cuda_available"):
            for n in w["names"]:
                self.results[n]["cuda"] = {"skipped": "no CUDA device (torch.cuda.is_available() is False)"}
            return []
        missing = [n for n in w["names"] if n not in done]
        if missing and not any(ln.startswith(ENV) for ln in lines):
            # It died before it began (PyTorch or CUDA would not start):
            # another one would too.
            for n in missing:
                self.results[n]["cuda"] = {"error": f"the CUDA child ended (exit status {w['p'].returncode}) "
                                                    "before its first model", "stderr_tail": err}
            w["info"]["stderr_tail"] = err
            return []
        if missing:
            why = (f"killed at the time budget ({self.a.budget} s)" if killed
                   else f"the CUDA child ended (exit status {w['p'].returncode}) during this model")
            self.results[missing[0]]["cuda"] = {"error": why, "stderr_tail": err}
            w["info"]["stderr_tail"] = err
            if killed:
                for n in missing[1:]:
                    self.results[n]["cuda"] = {"error": f"not run: time budget ({self.a.budget} s) spent"}
                return []
            return missing[1:]
        return []

    def log_progress(self, name, what, r):
        took = r.get("wall_seconds", (r.get("seconds") or {}).get("wall"))
        state = f"error: {r['error'][:200]}" if r.get("error") else "done"
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {name}: {what} {state}"
              + (f" ({took:.1f} s)" if isinstance(took, (int, float)) else ""), flush=True)
        try:
            self.write_json()
        except OSError as e:
            print(f"  (could not write the JSON: {e})", flush=True)

    # -- the loop ----------------------------------------------------------------
    def run(self):
        a = self.a
        print(f"{len(self.specs)} model(s), {a.steps} steps each; out: {os.path.abspath(a.out)}; "
              f"{self.files_note}; budget {a.budget:.0f} s"
              + ("; dry run: recordings only" if a.dry_run else ""), flush=True)
        self.doc["files_plan"] = self.files_note
        pending = list(self.specs)
        running = []
        worker = None
        todo_cuda = [] if a.dry_run else [s["name"] for s in self.specs]
        if a.dry_run:
            for s in self.specs:
                self.results[s["name"]]["cuda"] = {"skipped": "--dry-run"}
        if todo_cuda:
            worker = self.start_worker(todo_cuda)
        while pending or running or worker:
            while pending and len(running) < a.jobs and self.left() > 0:
                running.append(self.start_recorder(pending.pop(0)))
            for job in list(running):
                if job["p"].poll() is not None:
                    running.remove(job)
                    self.finish_recorder(job)
            if worker is not None:
                if worker["p"].poll() is not None:
                    rest = self.read_worker(worker, final=True)
                    worker = None
                    if rest and self.left() > 15:
                        worker = self.start_worker(rest)
                    elif rest:
                        for n in rest:
                            self.results[n]["cuda"] = {"error": "not run: too little of the time budget left"}
                else:
                    self.read_worker(worker)
            if self.left() <= 0:
                for job in running:
                    job["p"].kill()
                    job["p"].wait()
                    self.finish_recorder(job, killed=True)
                running = []
                for s in pending:
                    self.results[s["name"]]["recorder"]["error"] = f"not run: time budget ({a.budget} s) spent"
                pending = []
                if worker is not None:
                    worker["p"].kill()
                    worker["p"].wait()
                    self.read_worker(worker, final=True, killed=True)
                    worker = None
            time.sleep(0.05)
        self.compare()
        self.write_json()
        self.report()

    def compare(self):
        for r in self.results.values():
            s = r["recorder"].get("summary") or {}
            m = s.get("allocator_model") or {}
            c = r["cuda"]
            if not s or "peak_allocated" not in c:
                continue
            req = (c.get("memory_stats") or {}).get("requested_bytes.all.peak")
            r["comparison"] = dict(
                real_peak_allocated=c["peak_allocated"], predicted_peak_allocated=m.get("peak_allocated"),
                peak_allocated_pct=pct(m.get("peak_allocated"), c["peak_allocated"]),
                real_peak_reserved=c["peak_reserved"], predicted_peak_reserved=m.get("peak_reserved"),
                peak_reserved_pct=pct(m.get("peak_reserved"), c["peak_reserved"]),
                real_peak_requested=req, predicted_peak_live=s.get("peak_live_bytes"),
                peak_live_vs_requested_pct=pct(s.get("peak_live_bytes"), req),
                real_end_allocated=c["end_allocated"], predicted_end_allocated=m.get("end_allocated"),
                real_end_reserved=c["end_reserved"], predicted_end_reserved=m.get("end_reserved"))

    def report(self):
        print()
        env = self.doc.get("environment_cuda") or {}
        if env.get("cuda_available"):
            print(f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}, cuDNN {env.get('cudnn')}), "
                  f"{(env.get('device') or {}).get('name')}, nvidia-smi: {self.doc['environment']['nvidia_smi']}")
        for r in self.results.values():
            s = r["recorder"].get("summary") or {}
            m = s.get("allocator_model") or {}
            c = r["cuda"]
            rec = (f"recorder: live {mib(s.get('peak_live_bytes'))}, alloc {mib(m.get('peak_allocated'))}, "
                   f"reserved {mib(m.get('peak_reserved'))} in {r['recorder'].get('wall_seconds', 0):.1f} s"
                   if s else f"recorder: ERROR {str(r['recorder'].get('error'))[:160]}")
            if "peak_allocated" in c:
                cmp_ = r.get("comparison") or {}
                cu = (f"CUDA: alloc {mib(c['peak_allocated'])} ({_sgn(cmp_.get('peak_allocated_pct'))}), "
                      f"reserved {mib(c['peak_reserved'])} ({_sgn(cmp_.get('peak_reserved_pct'))}), "
                      f"requested {mib(c.get('memory_stats', {}).get('requested_bytes.all.peak'))} "
                      f"in {c['seconds']['wall']:.1f} s")
                if c.get("sdpa_choice"):
                    cu += f", SDPA {c['sdpa_choice'].get('backend', c['sdpa_choice'].get('error'))}"
            elif c.get("skipped"):
                cu = f"CUDA: skipped ({c['skipped']})"
            else:
                cu = f"CUDA: ERROR {str(c.get('error'))[:160]}"
            print(f"{r['name']}: {rec} | {cu}")
        print(f"total {time.perf_counter() - self.t0:.1f} s; wrote {os.path.join(self.a.out, 'cuda_check.json')} "
              f"and {len([f for f in os.listdir(self.a.out) if f.endswith('.pickle')])} pickle(s)"
              + (" (percentages: predicted vs real)" if not self.a.dry_run else ""))


def _sgn(p):
    return "pred —" if p is None else f"pred {p:+.1f}%"


def main(argv=None):
    global MAX_FILE_BYTES
    names = [s["name"] for s in model_specs()]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or "cuda_check",
                    help="output folder (default: $OUT, else ./cuda_check)")
    ap.add_argument("--dry-run", action="store_true", help="the recordings only (no CUDA)")
    ap.add_argument("--models", default=",".join(names), help=f"comma list of {', '.join(names)}")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--budget", type=float, default=75.0, help="seconds; everything still running then is killed")
    ap.add_argument("--jobs", type=int, default=4 if (os.cpu_count() or 1) >= 8 else 1,
                    help="recorder processes at a time (default 4 with 8+ CPUs, else 1)")
    ap.add_argument("--dump-both", default="resnet50,gpt2-bf16,gpt2-fp32",
                    help="models whose .pred.pickle and .cuda.pickle are kept")
    ap.add_argument("--dump-pred", default="simple-convnet", help="models whose .pred.pickle alone is kept")
    ap.add_argument("--max-entries", type=int, default=500000,
                    help="_record_memory_history(max_entries=...)")
    ap.add_argument("--max-file-bytes", type=int, default=MAX_FILE_BYTES,
                    help=f"a pickle over this is rewritten without frames, else deleted (default {MAX_FILE_BYTES})")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the child processes")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cuda-dumps", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    MAX_FILE_BYTES = a.max_file_bytes
    if a.worker:
        sys.path.insert(0, PKG)
        return worker(a)
    a.models = [m for m in a.models.split(",") if m]
    a.dump_both = [m for m in a.dump_both.split(",") if m]
    a.dump_pred = [m for m in a.dump_pred.split(",") if m]
    check = Check(a)
    try:
        check.run()
    except BaseException as e:  # noqa: BLE001 - whatever happens, the JSON is written
        check.doc["fatal_error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-4000:]}"
        print(f"error: {check.doc['fatal_error']}", flush=True)
        try:
            check.write_json()
        except OSError:
            pass
        if isinstance(e, KeyboardInterrupt):
            raise
    finally:
        for p in check.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(check.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
