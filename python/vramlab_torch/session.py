"""record(): a recording session around any PyTorch code on meta tensors,
the user's own training loop included."""

import contextlib
import gc
import json
import os
import pickle
import time
import warnings

import torch
import torch.optim.optimizer as optim_hooks

from . import snapshot as snapshot_mod
from .cuda_emulation import CudaEmulation, CudnnConvWorkspaces
from .recorder import (META, CublasWorkspaces, Recorder, allow_fused_on_meta, gc_paused,
                       self_test)

class RecordingWarning(UserWarning):
    """What a recording says about itself: tensors it could not record,
    layers it records as meta runs them and not as CUDA does."""


class RecordingError(RuntimeError):
    """An error of the user's code that a recording on meta tensors
    explains (explain_error): its message is one line that says what to
    change; the original is its __cause__."""


class UsageError(ValueError):
    """A mistake in how the recorder was asked (an option, BUILD, the
    model's output against --target): the message is one line that names
    the option and the fix. exit_code: 2 for the command line's usage, 1
    for what shows only once the model runs."""

    def __init__(self, message, exit_code=2):
        super().__init__(message)
        self.exit_code = exit_code


# Layers whose CUDA kernels the recording does not follow (see
# fallback_layers): (class, what the note says).
FALLBACK_NOTES = {
    "MultiheadAttention": (
        "recorded as meta runs F.multi_head_attention_forward, not as CUDA does: with "
        "need_weights=False (nn.Transformer* layers pass it) CUDA runs scaled_dot_product_attention's "
        "flash / memory-efficient / cuDNN kernel, which keeps no [batch, heads, seq, seq] attention "
        "matrix, while the recording holds the math path's (need_weights=True materialises it on "
        "CUDA too); the emulated autocast and SDPA backend do not reach inside it. Their figures "
        "follow the CPU/meta decomposition, not CUDA's kernels; call F.scaled_dot_product_attention "
        "in your own attention to record CUDA's choice"),
    "RNN": (
        "recorded as meta runs them (the CPU kernels' per-timestep matmuls and saved gates), not as "
        "CUDA does (cuDNN's fused RNN, with its own workspace and reserve space, which the recorder "
        "does not emulate): their figures follow the CPU/meta decomposition and can differ from a "
        "CUDA run's either way"),
}


def fallback_layers(model, names=None):
    """{"nn.MultiheadAttention": [module names], "nn.LSTM": [...], ...}:
    the layers of `model` (nn.MultiheadAttention, also inside
    nn.Transformer* layers; nn.RNN / nn.LSTM / nn.GRU) that meta runs
    through its fallback kernels where CUDA runs fused ones."""
    out = {}
    rnns = (torch.nn.RNN, torch.nn.LSTM, torch.nn.GRU)
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.MultiheadAttention):
            kind = "nn.MultiheadAttention"
        elif isinstance(m, torch.nn.RNNBase):
            kind = next((f"nn.{c.__name__}" for c in rnns if isinstance(m, c)), "nn.RNNBase")
        else:
            continue
        out.setdefault(kind, []).append((names or {}).get(m) or n or type(m).__name__)
    return out


def fallback_note(kind):
    return FALLBACK_NOTES["MultiheadAttention" if kind == "nn.MultiheadAttention" else "RNN"]


def fallback_warnings(found):
    """One line per kind of layer in fallback_layers' answer."""
    lines = []
    for kind, mods in sorted(found.items()):
        note = fallback_note(kind)
        shown = ", ".join(mods[:3]) + (f" and {len(mods) - 3} more" if len(mods) > 3 else "")
        lines.append(f"{len(mods)} {kind} layer{'s' if len(mods) > 1 else ''} ({shown}): {note}")
    return lines


def _user_frame(tb):
    """'file.py:LINE (function)' of the innermost frame of a traceback that
    is neither PyTorch's nor this package's machinery (the user's code)."""
    import traceback
    own = os.path.dirname(os.path.abspath(__file__)) + os.sep
    machinery = {own + f for f in ("recorder.py", "session.py", "cuda_emulation.py", "snapshot.py",
                                   "step.py", "__main__.py", "__init__.py", "distributed.py")}
    for fr in reversed(traceback.extract_tb(tb)):
        fn = os.path.abspath(fr.filename)
        p = fn.replace("\\", "/")
        if fn in machinery or "/torch/" in p or "/site-packages/" in p or p.startswith("<"):
            continue
        rel = os.path.relpath(fn) if fn.startswith(os.getcwd() + os.sep) else fn
        return f"{rel}:{fr.lineno} ({fr.name})"
    return None


def explain_error(exc):
    """A one-line explanation of an error that comes from running on meta
    tensors without a GPU, or None: the CUDA driver asked for (code that
    needs a GPU), a value read from a meta tensor (.item(), float(t),
    .tolist(), .cpu(), .numpy(), `if t > 0:`)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    at = _user_frame(exc.__traceback__)
    where = f"your code at {at}" if at else "your code"
    if isinstance(exc, (RuntimeError, AssertionError)) and (
            isinstance(exc, _ACCELERATOR_ERRORS) or any(s in text for s in _DRIVER_MESSAGES)):
        # A CUDA wheel on a machine without a GPU or driver gets to the
        # runtime: "CUDA error: CUDA driver version is insufficient ..."
        # (torch.AcceleratorError, from torch.cuda.Stream() and the like).
        return (f"{where} asked the CUDA driver for something ({text[:80]}); a recording runs "
                f"without a GPU: device='cuda', .cuda() and .to('cuda') go to its meta device, but "
                f"torch.cuda.* calls that need the device do not: leave them out of the recorded code "
                f"or guard them with `if torch.cuda.is_available():`")
    if isinstance(exc, NotImplementedError) and "Cannot copy out of meta tensor" in text:
        return (f"{where} copies a meta tensor to the CPU (.cpu(), .to('cpu'), .numpy(); {text[:40]}), "
                f"and meta tensors have shapes, no values: put what is GPU memory in your run on "
                f"'cuda' (the recording puts it on meta; a device picked by torch.cuda.is_available() "
                f"is the CPU here) and leave copies of values to the host out of the recorded code")
    data_dependent = _data_dependent_op(exc, text)
    if data_dependent is not None:
        op, fix = data_dependent
        return (f"{where} runs {op}, whose output's size depends on the tensor's values, and meta "
                f"tensors have shapes, no values ({text[:60]}...): {fix}")
    if isinstance(exc, (RuntimeError, NotImplementedError)) and (
            "cannot be called on meta tensors" in text or ("meta" in text and "Scalar" in text)):
        return (f"{where} reads a tensor's value ({text[:80]}), and meta tensors have shapes, no "
                f"values: leave .item(), float(t), .tolist() and branches on values out of the "
                f"recorded code (print(t) and t.shape work)")
    return None


_ACCELERATOR_ERRORS = tuple(c for c in (getattr(torch, "AcceleratorError", None),) if c is not None)
_DRIVER_MESSAGES = ("NVIDIA driver", "not compiled with CUDA", "No CUDA GPUs are available",
                    "CUDA driver initialization failed", "CUDA error:", "no CUDA-capable device",
                    "driver version is insufficient")
# Ops whose output's size depends on the values (meta has none): the
# name in the error (aten::NAME, or torch.nonzero() in its meta's message),
# what the user calls, and what records instead.
_VALUE_SIZED = {
    "nonzero": ("torch.nonzero (also t[mask], torch.where(cond), argwhere)",
                "use a fixed-size form (torch.nonzero_static(t, size=N), torch.where(cond, a, b), "
                "multiplying by the mask) or leave it out of the recorded code"),
    "masked_select": ("torch.masked_select", "use torch.where(mask, t, 0) or t * mask (fixed size), or "
                      "leave it out of the recorded code"),
    "bincount": ("torch.bincount", "leave it out of the recorded code or use a fixed-size stand-in "
                 "(torch.zeros(N).scatter_add_)"),
    "repeat_interleave": ("torch.repeat_interleave with tensor repeats",
                          "pass output_size= (the total length), or leave it out of the recorded code"),
}
for _op in ("_unique", "_unique2", "unique_dim", "unique_consecutive"):
    _VALUE_SIZED[_op] = ("torch.unique", "leave it out of the recorded code or use a fixed-size stand-in "
                         "of the largest size")


def _data_dependent_op(exc, text):
    """(what the user called, the workaround) for an op that meta cannot run
    because its output's size depends on values, else None."""
    if not isinstance(exc, (RuntimeError, NotImplementedError)) and \
            type(exc).__name__ != "DataDependentOutputException":
        return None
    if "meta_nonzero_assume_all_nonzero" in text or "torch.nonzero()" in text:
        return _VALUE_SIZED["nonzero"]
    if "repeat_interleave a meta tensor without output_size" in text:
        return _VALUE_SIZED["repeat_interleave"]
    if "no fake impl or Meta kernel registered" in text and text.startswith("aten::"):
        op = text[len("aten::"):].split(":", 1)[0].split(".", 1)[0]
        if op in _VALUE_SIZED:
            return _VALUE_SIZED[op]
        return (f"aten::{op}", "PyTorch has no meta kernel for it (whatever its output's size), so a "
                "recording cannot run it: leave it out of the recorded code")
    if type(exc).__name__ == "DataDependentOutputException" or "data-dependent" in text.lower():
        return (text.split(":", 1)[0][:40] or "an op", "leave it out of the recorded code or give it a "
                "fixed output size")
    return None


CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "temporary", "input",
              "output", "workspace", "autocast_cache")


class Recording:
    """A recording: `with vramlab_torch.record() as rec: ...` then
    `rec.save("step.pickle")`.

    Inside the block: the default device is meta (tensors and modules the
    code creates have shapes and no data), a TorchDispatchMode writes down
    every device storage's allocation and free, forward hooks give module
    paths, optimizer step hooks and autograd give the phases, and
    torch.autocast("cuda", ...) is emulated (see cuda_emulation.py).

    Options: frames (record each allocation's Python stack: True, the
    default; "short": file names without the machine's part; False: none),
    cublas_workspace ("auto", "per-op", "cached", "off"; see
    recorder.CublasWorkspaces), capability (the GPU's compute capability,
    for the cuBLAS workspace size and the SDPA backend; default (9, 0),
    Hopper), sdpa ("auto", "cudnn", "flash", "efficient", "math"),
    cudnn_workspace (cuDNN convolution workspaces by rule: "auto",
    "fitted-h200", "transform", "off"; see
    cuda_emulation.CudnnConvWorkspaces),
    inplace_accumulation (autograd adds gradients in place as CUDA does;
    default True), segments ("simulate" or "none", for the pickle),
    auto_phase (phases from hooks; the CLI sets them itself)."""

    def __init__(self, frames=True, cublas_workspace="auto", capability=(9, 0), sdpa="auto",
                 inplace_accumulation=True, segments="simulate", auto_phase=True,
                 default_device_meta=True, cudnn_workspace="auto"):
        self.accumulate = self_test() if inplace_accumulation else (-1, -1)
        self.workspaces = CublasWorkspaces(cublas_workspace, capability)
        self.conv_workspaces = CudnnConvWorkspaces(cudnn_workspace)
        self.recorder = Recorder(self.accumulate, frames=frames, workspaces=self.workspaces,
                                 auto_phase=auto_phase, conv_workspaces=self.conv_workspaces)
        self.emulation = CudaEmulation(sdpa, recorder=self.recorder, capability=capability)
        self.segments = segments
        self.auto_phase = auto_phase
        self.default_device_meta = default_device_meta
        self.names = {}  # module -> qualified name
        self.fallback = {}  # layers meta runs where CUDA runs fused kernels (fallback_layers)
        self.meta = {"torch": str(torch.__version__), "cublas_workspace": self.workspaces.describe(),
                     "cudnn_workspace": self.conv_workspaces.describe(),
                     "sdpa": sdpa + (" (cuDNN attention first: compute capability "
                                     f"{capability[0]}.{capability[1]}, PyTorch {torch.__version__})"
                                     if sdpa == "auto" and self.emulation.cudnn_first else "")}
        self.seconds = None
        self._stack = None
        self._finished = False

    # -- labels ------------------------------------------------------------
    def watch(self, model, prefix=""):
        """Module paths of `model` for the `where` labels (done by itself at
        the first forward of a root module)."""
        for n, m in model.named_modules(prefix=prefix):
            self.names.setdefault(m, n or type(m).__name__)
        for kind, mods in fallback_layers(model, self.names).items():
            known = self.fallback.setdefault(kind, [])
            known.extend(m for m in mods if m not in known)
        return model

    def mark(self, category, tensors):
        """Set the category of the storages of `tensors` (one of
        CATEGORIES; "cast_cache", the name before "autocast_cache", still
        reads as that)."""
        category = "autocast_cache" if category == "cast_cache" else category
        if category not in CATEGORIES:
            raise ValueError(f"category {category!r}: one of {CATEGORIES}")
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        self.recorder.mark(category, list(tensors))

    def phase(self, name):
        self.recorder.set_phase(name)

    def autocast(self, dtype=torch.bfloat16, enabled=True, cache_enabled=True):
        """CUDA's autocast, emulated on meta (torch.autocast("cuda", ...) is
        redirected here while recording)."""
        return self.emulation.autocast(dtype, enabled, cache_enabled)

    # -- hooks -------------------------------------------------------------
    def _install(self, stack):
        rec = self.recorder
        session = self

        def pre(mod, args):
            if mod not in session.names and not rec.modules:
                session.watch(mod)
                # A root module's first forward: its parameters and buffers
                # are parameters, its tensor arguments made before any
                # forward are inputs.
                rec.mark("parameter", list(mod.parameters()) + list(mod.buffers()), force=False)
            if not rec.modules and session.auto_phase:
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                for t in tensors:
                    ev = rec.event_of(t)
                    if ev is not None and ev["phase"] in ("setup", "between", "after_optimizer") \
                            and "category" not in ev:
                        ev["category"] = "input"
            rec.modules.append(session.names.get(mod) or type(mod).__name__)
            running.append(mod)

        def post(mod, _args, _out):
            if running and running[-1] is mod:
                running.pop()
                rec.modules.pop()

        # always_call: the pop also when a forward raises, which
        # torch.utils.checkpoint's recomputation does on purpose (it stops
        # inside the blocks' forwards once it has what the backward needs);
        # else the recomputed modules stay on the stack and name what runs
        # after the backward (the optimizer's state, the next loss).
        running = []  # the modules whose forward is running, as rec.modules names them
        h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
        try:
            h2 = torch.nn.modules.module.register_module_forward_hook(post, always_call=True)
        except TypeError:  # PyTorch before 2.1
            h2 = torch.nn.modules.module.register_module_forward_hook(post)
        stack.callback(h1.remove)
        stack.callback(h2.remove)

        def opt_pre(opt, _args, _kwargs):
            params = [p for g in opt.param_groups for p in g["params"]]
            rec.mark("parameter", params, force=False)
            rec.mark("gradient", [p.grad for p in params if p.grad is not None])
            if session.auto_phase:
                rec.set_phase("optimizer")
            rec.in_optimizer += 1

        def opt_post(opt, _args, _kwargs):
            rec.in_optimizer -= 1
            state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
            rec.mark("optimizer_state", state, force=False)
            if session.auto_phase:
                rec.set_phase("after_optimizer")

        h3 = optim_hooks.register_optimizer_step_pre_hook(opt_pre)
        h4 = optim_hooks.register_optimizer_step_post_hook(opt_post)
        stack.callback(h3.remove)
        stack.callback(h4.remove)

        if self.auto_phase:
            # Hook the graph below what backward starts from, so the
            # engine's own gradient accumulations are told from the nodes'.
            orig_backward = torch.autograd.backward

            def backward(tensors, *a, **k):
                ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
                rec.hook_graph([t.grad_fn for t in ts if t.grad_fn is not None])
                return orig_backward(tensors, *a, **k)
            torch.autograd.backward = backward
            stack.callback(setattr, torch.autograd, "backward", orig_backward)

        # torch.autocast("cuda", ...): emulated (no GPU to enter it on).
        A = torch.amp.autocast_mode.autocast
        orig = A.__init__, A.__enter__, A.__exit__

        def a_init(self_, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type != "cuda":
                return orig[0](self_, device_type, dtype, enabled, cache_enabled)
            self_.device = "cuda"
            self_.fast_dtype = dtype or torch.float16
            self_._enabled = enabled
            self_._vramlab = session.emulation.autocast(
                self_.fast_dtype, enabled, True if cache_enabled is None else cache_enabled)

        def a_enter(self_):
            if getattr(self_, "_vramlab", None) is None:
                return orig[1](self_)
            # torch.utils.checkpoint's recomputation runs where the
            # emulation's TorchFunctionMode is not on the stack, but always
            # inside torch.autocast("cuda", ...) (see `infer` below): put
            # the mode back for it.
            self_._vramlab_mode = None
            from torch.overrides import _get_current_function_mode_stack
            if session._stack is not None and session.emulation not in _get_current_function_mode_stack():
                session.emulation.__enter__()
                self_._vramlab_mode = session.emulation
            self_._vramlab.__enter__()
            return self_

        def a_exit(self_, *exc):
            if getattr(self_, "_vramlab", None) is None:
                return orig[2](self_, *exc)
            r = self_._vramlab.__exit__(*exc)
            if self_._vramlab_mode is not None:
                self_._vramlab_mode.__exit__(*exc)
            return r
        A.__init__, A.__enter__, A.__exit__ = a_init, a_enter, a_exit

        def restore():
            A.__init__, A.__enter__, A.__exit__ = orig
        stack.callback(restore)

        # torch.utils.checkpoint restores the caller's autocast state for
        # the recomputation, for the inputs' device type: meta has none, so
        # it is told "cuda" (whose state the emulation keeps; the CUDA
        # module is not initialised, so no RNG state is stashed).
        import torch.utils.checkpoint as ckpt
        orig_infer = ckpt._infer_device_type

        def infer(*args):
            d = orig_infer(*args)
            return "cuda" if d == "meta" else d
        ckpt._infer_device_type = infer
        stack.callback(setattr, ckpt, "_infer_device_type", orig_infer)

    # -- the context -------------------------------------------------------
    def __enter__(self):
        allow_fused_on_meta()
        self._stack = contextlib.ExitStack()
        self._stack.__enter__()
        warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
        self._install(self._stack)
        self._stack.enter_context(gc_paused())
        if self.default_device_meta:
            self._stack.enter_context(META)
        self._stack.enter_context(self.recorder)
        self._stack.enter_context(self.emulation)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.seconds = time.perf_counter() - self._t0
        self._stack.__exit__(exc_type, exc, tb)
        self._stack = None
        self.finish()
        if exc is None:
            for line in self.warning_lines():
                warnings.warn(line, RecordingWarning, stacklevel=2)
        elif not isinstance(exc, RecordingError):
            why = explain_error(exc)
            if why is not None:
                raise RecordingError(why) from exc
        return False

    def warning_lines(self):
        """What the recording says about itself, one line each: tensors
        made off its device (not recorded), layers recorded as meta runs
        them and not as CUDA does."""
        out = []
        for dev, d in sorted(self.meta.get("not_recorded", {}).items()):
            out.append(
                f"{d['tensors']} tensor(s) ({human_bytes(d['bytes'])}) were made on {dev}, not on the "
                f"recording's device (meta), and are not in the recording (the first: {d['first_op']}"
                + (f", at {d['at']}" if d.get("at") else "") + "): make them without a device or with "
                "device='cuda' (the recording puts 'cuda' on meta) if they are GPU memory in your run")
        nd = self.meta.get("no_device_in_forward")
        if nd:
            out.append(
                f"{nd['tensors']} tensor(s) ({human_bytes(nd['bytes'])}) were made with no device inside "
                f"forward and not moved with .to() themselves (the first: {nd['first']}): the recording put "
                f"them on its meta device, as GPU memory, but in a CUDA run they are made on the CPU (the "
                f"default device), not GPU memory. Unless they reach the GPU another way (a tensor made "
                f"from them and moved, an index), an op that mixes them with the model's CUDA tensors fails "
                f"(\"Expected all tensors to be on the same device\"): make them with device=x.device")
        out.extend(fallback_warnings(self.fallback))
        return out

    def finish(self):
        """After the block: check that nothing waited on a cycle, stop
        listening for frees (what is alive now stays alive: the trace ends
        without freeing it), and give every allocation a category."""
        if self._finished:
            return
        self._finished = True
        rec = self.recorder
        n = len(rec.events)
        gc.collect()
        cyclic = len(rec.events) - n
        rec.on = False
        if cyclic:
            # Frees that only the cyclic collector made: CUDA frees these
            # at the same moment (later), so they are kept, but said.
            self.meta["freed_by_cyclic_gc"] = cyclic
        for ev in rec.events:
            if ev["op"] == "alloc" and "category" not in ev:
                ev["category"] = "input" if ev["phase"] in ("setup",) else "temporary"
        self.meta["sdpa_choices"] = dict(self.emulation.sdpa_choices)
        if self.emulation.cuda_mapped:
            self.meta["cuda_device_mapped"] = self.meta.get("cuda_device_mapped", 0) + self.emulation.cuda_mapped
        if self.emulation.native_dropouts:
            self.meta["native_dropout"] = self.emulation.native_dropouts
        stray = [(site, e) for site, e in self.emulation.no_device.items() if not e[3]]
        if stray:
            site, e = stray[0]
            self.meta["no_device_in_forward"] = {
                "call_sites": len(stray), "tensors": sum(e[1] for _, e in stray),
                "bytes": sum(e[2] for _, e in stray), "first": f"{e[0]} at {site}"}
        if rec.off_device:
            self.meta["not_recorded"] = {
                dev: {"tensors": n, "bytes": b, "first_op": op, "at": at}
                for dev, (n, b, op, at) in rec.off_device.items()}
        if self.fallback:
            self.meta["fallback_kernels"] = {
                kind: {"modules": mods, "note": fallback_note(kind)}
                for kind, mods in sorted(self.fallback.items())}
        self.meta["cublas_workspaces_per_op"] = self.workspaces.per_op
        self.meta["cudnn_conv_workspaces"] = self.conv_workspaces.added
        self.meta["accumulations_in_place"] = (
            f"{sum(1 for a in rec.accumulations if a[0] is True)} of {len(rec.accumulations)}")

    # -- results -----------------------------------------------------------
    @property
    def events(self):
        return self.recorder.events

    def summary(self):
        """Peaks of live bytes (storage nbytes, as requested) overall and
        per category at that moment, and at the end."""
        live, sizes, cats = 0, {}, {}
        peak, at_peak = 0, {}
        by_cat = {}
        for ev in self.events:
            if ev["op"] == "alloc":
                sizes[ev["id"]] = (ev["size"], ev["category"])
                live += ev["size"]
                by_cat[ev["category"]] = by_cat.get(ev["category"], 0) + ev["size"]
                if live > peak:
                    peak, at_peak = live, dict(by_cat)
            else:
                size, cat = sizes.pop(ev["id"])
                live -= size
                by_cat[cat] -= size
        for size, cat in sizes.values():
            cats[cat] = cats.get(cat, 0) + size
        allocs = sum(1 for e in self.events if e["op"] == "alloc")
        return {"allocations": allocs, "peak_live_bytes": peak,
                "at_peak": {k: v for k, v in at_peak.items() if v},
                "end_live_bytes": live, "end_by_category": cats}

    def snapshot(self):
        """(the snapshot dict, the allocator model's peaks)."""
        self.finish()
        return snapshot_mod.to_snapshot(self.events, self.segments, meta=self.meta)

    def save(self, path, format=None):
        """Writes the recording: a PyTorch memory snapshot pickle (format
        "pickle", the default unless path ends in .jsonl) or vramlab's JSON
        Lines trace ("jsonl"). Returns the allocator model's summary for a
        pickle, None for JSON Lines."""
        self.finish()
        fmt = format or ("jsonl" if str(path).endswith(".jsonl") else "pickle")
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        if fmt == "jsonl":
            with open(path, "w") as f:
                for ev in self.events:
                    f.write(json.dumps({k: v for k, v in ev.items() if k != "frames"},
                                       separators=(",", ":")) + "\n")
            return None
        if fmt != "pickle":
            raise ValueError(f"format {fmt!r}: pickle or jsonl")
        snap, summary = self.snapshot()
        with open(path, "wb") as f:
            pickle.dump(snap, f)
        return summary


def human_bytes(n):
    """Bytes in an adaptive unit: 512 B, 3.5 KiB, 12.0 MiB, 1.25 GiB."""
    if abs(n) < 1024:
        return f"{n} B"
    for unit, scale in (("KiB", 2**10), ("MiB", 2**20)):
        if abs(n) < 1024 * scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 2**30:,.2f} GiB"


def record(**options):
    """`with vramlab_torch.record() as rec:` ... `rec.save("step.pickle")`.
    Options as Recording's."""
    return Recording(**options)
