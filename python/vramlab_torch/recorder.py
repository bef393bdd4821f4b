"""The recorder: a TorchDispatchMode that sees every aten op below autograd
on meta tensors (shapes, no data) and writes down each device storage's
allocation and free, as the CUDA caching allocator would be asked for them.

vramlab's scripts/record_step.py records PyTorch's own training step with
this recorder (frames off, no CUDA emulation) and checks it event for event
against the CPU allocator (see that script's docstring for the rules); the
package runs the same machinery on any nn.Module and any training loop.

How. After an op returns, each output tensor's untyped_storage() not seen
before is an allocation (views and in-place ops return known storages). A
weakref on the storage's Python object (PyTorch keeps one per StorageImpl,
alive exactly as long as it) gives the free, which under CPython's
reference counting is the moment its last tensor goes. Cyclic gc is off
while recording. Zero-byte storages are left out (the allocator is never
asked for them). Host (CPU) tensors that PyTorch deliberately keeps on the
CPU (Adam's state['step'] without fused=True, and such) stay real CPU
tensors and are not recorded. Any other storage an op makes on a device
that is not meta (the user's code said device="cpu", or chose the CPU
because torch.cuda.is_available() is False) is not recorded either, but
counted in `off_device` and reported (Recording.finish): a recording must
not lose tensors without saying so.

CUDA-vs-meta corrections, in both: autograd's
gradient accumulation (CUDA adds in place where PyTorch refuses to under a
dispatch mode; calibrated by a self-test at start-up), and fused optimizers
allowed on meta (_fused_sgd_ has no meta kernel and only mutates its
arguments: skipped). Only the package adds: CUDA's SDPA backend choice and CUDA's
autocast policy (see cuda_emulation.py), cuBLAS workspaces (below) and
cuDNN convolution workspaces (cuda_emulation.CudnnConvWorkspaces, by a rule
fitted on an H200).
"""

import gc
import os
import sys
import threading
import weakref

import torch
import torch.optim.optimizer as optim_module
import torch.utils._foreach_utils as foreach_utils
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

# By this name, so that tests can pretend to be another PyTorch.
from .cuda_emulation import torch_version as _torch_version

META = torch.device("meta")
ADD = torch.ops.aten.add.Tensor
PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# This package's machinery (its example models are user code).
_OWN = {os.path.join(PKG_DIR, f) for f in ("recorder.py", "session.py", "cuda_emulation.py",
                                            "snapshot.py", "step.py", "__main__.py", "__init__.py")}
# Frames of the machinery that runs a Python mode (dynamo-disabled wrappers,
# the dispatch and device modes), which a CUDA run would not have.
_MACHINERY = {
    ("torch/utils/_python_dispatch.py", None), ("torch/_dynamo/eval_frame.py", "_fn"),
    ("torch/_compile.py", "inner"), ("torch/utils/_device.py", "__torch_function__"),
}
_MACHINERY_FILES = {f for f, n in _MACHINERY if n is None}

# Ops that run a cuBLAS GEMM on CUDA (at::cuda::blas::gemm / bgemm and the
# cuBLASLt addmm path).
GEMM_OPS = {
    torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default, torch.ops.aten.addbmm.default,
    torch.ops.aten._addmm_activation.default,
}
# SDPA kernels whose outputs past (out, logsumexp) are host scalars on CUDA
# (philox seed and offset, empty debug mask, cumulative lengths).
SDPA_KERNELS = {
    torch.ops.aten._scaled_dot_product_flash_attention.default: 2,
    torch.ops.aten._scaled_dot_product_efficient_attention.default: 2,
}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# cuDNN attention: its philox seed and offset are device tensors (8 bytes
# each, at::zeros before the kernel runs: allocated before the output and
# the softmax statistics, as measured on CUDA), kept for the backward.
_CUDNN_SDPA = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
_CUDNN_SDPA = getattr(_CUDNN_SDPA, "default", None)
# Convolutions: cuDNN allocates a workspace per call on CUDA (see
# cuda_emulation.CudnnConvWorkspaces).
CONV_OPS = {torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default}


def allow_fused_on_meta():
    """torch.optim checks fused=True's devices against this list."""
    orig = foreach_utils._get_fused_kernels_supported_devices
    if "meta" not in orig():
        def devices():
            return orig() + ["meta"]
        foreach_utils._get_fused_kernels_supported_devices = devices
        optim_module._get_fused_kernels_supported_devices = devices


def plain_tensors(t):
    """The tensors holding a tensor's memory: itself, or for a wrapper
    subclass (DTensor: FSDP2's sharded parameters and gradients) its inner
    tensors. A wrapper's own storage holds nothing on CUDA (on meta it
    reports the whole logical size), and the ops the subclass runs on its
    inner tensors happen inside the mode's call, where the mode does not see
    them: their storages are taken from the subclass's outputs."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    attrs, _ = t.__tensor_flatten__()
    out = []
    for a in attrs:
        inner = getattr(t, a)
        if isinstance(inner, torch.Tensor):
            out.extend(plain_tensors(inner))
    return out


def storage_uses(t):
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class CublasWorkspaces:
    """cuBLAS / cuBLASLt workspaces, which CUDA allocates through the caching
    allocator inside the GEMM kernels' host code (invisible on meta), by
    PyTorch's rules (aten/src/ATen/cuda/CublasHandlePool.cpp):

    size: CUBLAS_WORKSPACE_CONFIG (":SIZE_KiB:COUNT" pairs, summed SIZE*COUNT
    KiB) if set, else 32 MiB (4096 KiB x 8) on compute capability 9.x-12.x
    (Hopper, Blackwell) and 8 MiB + 128 KiB (":4096:2:16:8") before them.
    cuBLASLt (addmm with a 1-D bias, the Linear-with-bias forward): its own
    workspace, CUBLASLT_WORKSPACE_SIZE KiB (default 1024), one per handle
    and stream, kept.

    mode "per-op" (PyTorch 2.15's default: TORCH_CUBLAS_WORKSPACE_CACHE
    unset): each cuBLAS GEMM allocates a workspace after its output and frees
    it when the GEMM returns. mode "cached" (TORCH_CUBLAS_WORKSPACE_CACHE=1,
    and PyTorch before 2.15): one workspace per (handle, stream), allocated
    at the first GEMM and kept for the life of the process; the forward runs
    on the caller's thread and the backward on autograd's device thread,
    which have different handles, so a training step makes two.

    Whether cuBLASLt shares the cuBLAS workspace when caching is on:
    TORCH_CUBLASLT_UNIFIED_WORKSPACE=1 / 0 says so; unset, PyTorch 2.15
    shares it (unified by default with caching) and PyTorch before 2.15 does
    not (opt-in): measured on an H200 with PyTorch 2.11, the first
    Linear-with-bias forward allocates the 32 MiB cuBLAS workspace and then
    a 1 MiB cuBLASLt workspace, both kept, and the backward (plain mm)
    another 32 MiB. 2.12 to 2.14 are taken as 2.11 (not measured)."""

    def __init__(self, mode="auto", capability=(9, 0), config=None, lt_kib=None):
        if mode == "auto":
            cache_env = os.environ.get("TORCH_CUBLAS_WORKSPACE_CACHE")
            if cache_env is not None:
                mode = "cached" if cache_env == "1" else "per-op"
            else:
                mode = "per-op" if _torch_version() >= (2, 15) else "cached"
        if mode not in ("per-op", "cached", "off"):
            raise ValueError(f"cuBLAS workspace mode {mode!r}: auto, per-op, cached or off")
        self.mode = mode
        self.capability = tuple(capability)
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") if config is None else config
        self.config = config
        self.size = parse_workspace_config(config, self.capability)
        lt = os.environ.get("CUBLASLT_WORKSPACE_SIZE") if lt_kib is None else lt_kib
        self.lt_size = int(lt) * 1024 if lt not in (None, "") else 1024 * 1024
        uni = os.environ.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
        unified = uni == "1" if uni in ("0", "1") else _torch_version() >= (2, 15)
        self.unified = mode == "cached" and unified
        self.kept = {}  # (kind, thread) -> alloc id
        self.per_op = 0

    def describe(self):
        if self.mode == "off":
            return "cuBLAS workspaces: off (not added)"
        cc = f"{self.capability[0]}.{self.capability[1]}"
        src = f"CUBLAS_WORKSPACE_CONFIG={self.config}" if self.config else f"default for compute capability {cc}"
        s = f"cuBLAS workspace {self.size} bytes ({src}), mode {self.mode}"
        if not self.unified:
            s += f"; cuBLASLt workspace {self.lt_size} bytes, kept per thread"
        return s

    def on_gemm(self, rec, func, args):
        if self.mode == "off":
            return
        thread = "autograd" if rec.phase == "backward" else "main"
        lt = (func is torch.ops.aten.addmm.default and isinstance(args[0], torch.Tensor)
              and args[0].dim() == 1)
        if self.mode == "cached":
            # cuBLASLt's handle is the cuBLAS handle, and taking the handle
            # sets its workspace: a cuBLASLt GEMM makes the cuBLAS workspace
            # too (then, not unified, its own), as measured (2.11).
            key = ("cublas", thread)
            if key not in self.kept:
                self.kept[key] = rec.synthetic_alloc(
                    self.size, f"cublas workspace ({thread} thread)", "workspace")
            if not (lt and not self.unified):
                return
        if lt and not self.unified:
            key = ("cublasLt", thread)
            if key not in self.kept:
                self.kept[key] = rec.synthetic_alloc(
                    self.lt_size, f"cublasLt workspace ({thread} thread)", "workspace")
            return
        self.per_op += 1
        i = rec.synthetic_alloc(self.size, f"cublas workspace ({func})", "workspace")
        rec.synthetic_free(i)


def parse_workspace_config(config, capability):
    """CublasHandlePool.cpp's parseChosenWorkspaceSize."""
    import re
    default = 4096 * 8 * 1024 if 9 <= capability[0] <= 12 else 4096 * 1024 * 2 + 16 * 1024 * 8
    if not config:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if not pairs:
        return default
    return sum(int(s) * 1024 * int(c) for s, c in pairs)


_SHORT = {}


def short_path(fn):
    """A file name without the machine's part: what follows site-packages/
    (torch/nn/modules/linear.py), else the path relative to the working
    directory when under it, else the base name."""
    s = _SHORT.get(fn)
    if s is None:
        p = fn.replace("\\", "/")
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in p:
                s = p.rsplit(marker, 1)[1]
                break
        else:
            cwd = os.getcwd().replace("\\", "/") + "/"
            s = p[len(cwd):] if p.startswith(cwd) else os.path.basename(p) if os.path.isabs(p) else p
        _SHORT[fn] = s
    return s


def python_frames(limit=48, short=False):
    """The Python stack of the allocating call, innermost first, as
    (filename, line, name), without this package's own frames and the
    dispatch-mode machinery's (neither exists in a CUDA run)."""
    out = []
    f = sys._getframe(1)
    redirected = None  # (file, name) of a call a torch function mode took over
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        name = f.f_code.co_name
        if fn not in _OWN:
            tail = "/".join(fn.replace("\\", "/").rsplit("/", 3)[-3:])
            tail2 = "/".join(tail.split("/")[-2:])
            if tail2 == "torch/overrides.py" and name == "handle_torch_function":
                # Tensor.backward -> handle_torch_function -> a mode -> Tensor.backward:
                # without modes (a CUDA run) the outer call is the same frame.
                redirected = (out[-1][0], out[-1][2]) if out else None
            elif not out and tail2 == "torch/_ops.py":
                pass  # the emulation's own torch.ops call (SDPA kernels)
            elif tail not in _MACHINERY_FILES and (tail, name) not in _MACHINERY \
                    and (tail2, name) not in _MACHINERY:
                entry = (short_path(fn) if short else fn, f.f_lineno, name)
                if redirected is not None and (entry[0], entry[2]) == redirected:
                    redirected = None
                else:
                    redirected = None
                    out.append(entry)
        f = f.f_back
    return tuple(out)


class Recorder(TorchDispatchMode):
    """Allocations and frees of the device (meta) storages the ops it sees
    create. Events are dicts holding no tensor:
    {"op": "alloc", "id", "size", "label", "category", "phase", "step",
    "where", "frames"} and {"op": "free", "id"}."""

    def __init__(self, accumulate=None, frames=True, workspaces=None, auto_phase=False,
                 conv_workspaces=None):
        super().__init__()
        self.events = []
        self.live = {}  # id(storage object) -> [alloc event, weakref]
        self.quiet = {}  # id(storage object) -> weakref
        self.synthetic = {}  # id -> alloc event (workspaces: no storage)
        self.next_id = 0
        self.phase = "setup"
        self.step = 0
        self.modules = []
        self.in_node = False
        self.on = True
        self.accumulate = accumulate
        self.accumulations = []
        self.frames = frames
        self.workspaces = workspaces
        self.conv_workspaces = conv_workspaces
        self.auto_phase = auto_phase
        self.in_optimizer = 0
        self.thread = threading.get_ident()
        self.paused_depth = 0
        # Set around a library's own allocations (distributed.py): a role
        # for user_metadata and, if given, the category.
        self.role = None
        self.role_category = None
        # distributed.py, around DDP's bucket rebuild: a copy from meta to
        # the host keeps the host tensor's values (what rank 0 broadcast).
        self.host_copies_keep = False
        # distributed.py, around DDP's constructor: host tensors made then
        # are PyTorch's own (the reducer's used-parameter map with
        # find_unused_parameters), kept on the host by design: not reported
        # as the user's, and a copy from meta into one of them (the map
        # copied back after its allreduce, in the backward) keeps its values
        # (rank 0's own map, which is what the allreduce gives rank 0 in
        # substance: a parameter unused on every rank is 0 in both).
        self.library_host = 0
        self.host_kept = {}  # id(storage object) -> weakref
        # Storages made off the recording's device (not meta), outside
        # optimizer.step(): device type -> [count, bytes, first op, where].
        self.off_device = {}

    # -- storages --------------------------------------------------------
    def known(self, st):
        return id(st) in self.live or id(st) in self.quiet

    def _freed(self, key, _ref):
        entry = self.live.pop(key, None)
        if entry is not None and self.on:
            self.events.append({"op": "free", "id": entry[0]["id"]})

    def _event(self, size, label, category):
        ev = {"op": "alloc", "id": self.next_id, "size": size, "label": label}
        if category:
            ev["category"] = category
        ev["phase"], ev["step"] = self.phase, self.step
        if self.role:
            ev["role"] = self.role
            if self.role_category and not category:
                ev["category"] = self.role_category
        where = self.where()
        if where:
            ev["where"] = where
        if self.frames:
            ev["frames"] = python_frames(short=self.frames == "short")
        self.next_id += 1
        self.events.append(ev)
        return ev

    def add(self, st, label, category=None):
        if st.nbytes() == 0 or st.device.type != "meta":
            if st.nbytes() and self.library_host and st.device.type == "cpu":
                key = id(st)
                self.host_kept[key] = weakref.ref(st, lambda r, k=key: self.host_kept.pop(k, None))
            elif st.nbytes() and not self.in_optimizer and not self.host_copies_keep:
                self._off_device(st, label)
            self.add_quiet(st)
            return
        ev = self._event(st.nbytes(), label, category)
        key = id(st)
        self.live[key] = [ev, weakref.ref(st, lambda r, k=key: self._freed(k, r))]

    def _off_device(self, st, label):
        entry = self.off_device.get(st.device.type)
        if entry is None:
            frames = python_frames(short=True)
            user = next((f for f in frames if not f[0].startswith("torch/")), None)
            where = f"{user[0]}:{user[1]} ({user[2]})" if user else None
            entry = self.off_device[st.device.type] = [0, 0, label, where]
        entry[0] += 1
        entry[1] += st.nbytes()

    def add_quiet(self, st):
        key = id(st)
        self.quiet[key] = weakref.ref(st, lambda r, k=key: self.quiet.pop(k, None))

    def storage_resized(self, st, label, category=None):
        """A storage's nbytes changed outside any op (FSDP2 frees and
        re-allocates unsharded parameters with storage.resize_, which no
        dispatch mode sees): a free of what it held, an allocation of what
        it holds now."""
        if st.device.type != "meta":
            return
        key = id(st)
        nbytes = st.nbytes()
        entry = self.live.get(key)
        if entry is not None:
            if entry[0]["size"] == nbytes:
                return
            del self.live[key]
            if self.on:
                self.events.append({"op": "free", "id": entry[0]["id"]})
        if nbytes == 0:
            self.add_quiet(st)
            return
        self.quiet.pop(key, None)
        self.add(st, label, category)

    def synthetic_alloc(self, size, label, category):
        ev = self._event(size, label, category)
        self.synthetic[ev["id"]] = ev
        return ev["id"]

    def synthetic_free(self, i):
        if self.synthetic.pop(i, None) is not None and self.on:
            self.events.append({"op": "free", "id": i})

    def event_of(self, t):
        for p in plain_tensors(t):
            entry = self.live.get(id(p.untyped_storage()))
            if entry:
                return entry[0]
        return None

    def mark(self, category, tensors, force=True):
        for t in tensors:
            if isinstance(t, torch.Tensor):
                for p in plain_tensors(t):
                    ev = self.event_of(p)
                    if ev is not None and (force or "category" not in ev):
                        ev["category"] = category

    def where(self):
        """The module whose forward runs the op, or in the backward the
        autograd node; none in optimizer.step() and zero_grad (the
        optimizer's state and temporaries belong to no module)."""
        if self.in_optimizer or self.phase in ("optimizer", "zero_grad"):
            return None
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                return node.name()
        return self.modules[-1] if self.modules else None

    def live_bytes(self):
        return sum(ev["size"] for ev, _ in self.live.values()) + sum(
            ev["size"] for ev in self.synthetic.values())

    def paused(self):
        """Context: ops run, nothing is recorded (storages made meanwhile
        are never reported, nor their frees)."""
        rec = self

        class _P:
            def __enter__(self):
                self.was = rec.paused_depth
                rec.paused_depth += 1

            def __exit__(self, *exc):
                rec.paused_depth = self.was
                return False
        return _P()

    # -- phases ----------------------------------------------------------
    def set_phase(self, name):
        """Categories of what the ending phase allocated, by what is alive
        now: forward and loss allocations alive when backward starts are
        activations; optimizer allocations alive after the step are its
        state; backward allocations that did not become a .grad are
        temporaries."""
        ending, self.phase = self.phase, name
        category = {"forward": "activation", "loss": "activation",
                    "backward": "temporary", "optimizer": "optimizer_state"}.get(ending)
        if category == "activation" and name not in ("backward", "loss"):
            category = None  # forward without backward (eval): decided later
        if category:
            for ev, _ in self.live.values():
                if ev["phase"] == ending and ev["step"] == self.step and "category" not in ev:
                    ev["category"] = category

    def _auto(self):
        """Phase from what is running (the user's loop, record())."""
        if self.in_optimizer:
            return
        if torch._C._current_autograd_node() is not None:
            if self.phase != "backward":
                self.set_phase("backward")
        elif self.modules:
            if self.phase not in ("forward",):
                if self.phase in ("setup", "backward", "after_backward", "optimizer", "after_optimizer", "between"):
                    self.step += 1
                self.set_phase("forward")
        elif self.phase == "backward":
            self.set_phase("after_backward")

    # -- autograd's InputBuffer ------------------------------------------
    def engine_accumulation(self, func, args, kwargs):
        if func is not ADD or kwargs or len(args) != 2 or self.in_node:
            return False
        node = torch._C._current_autograd_node()
        if node is None or "AccumulateGrad" in node.name() or torch.is_grad_enabled():
            return False
        return all(isinstance(t, torch.Tensor) for t in args)

    def cuda_adds_in_place(self, old, new):
        return (not old._is_zerotensor() and not old.is_nested and not old.is_sparse
                and not new.is_sparse and old.shape == new.shape and old.dtype == new.dtype
                and is_non_overlapping_and_dense_or_false(old)
                and (old._use_count(), storage_uses(old)) == self.accumulate)

    def hook_graph(self, roots):
        """Pre and post hooks on every node of the graph below `roots`
        (AccumulateGrad's aside): they mark the nodes' own ops."""
        def pre(_grad_outputs):
            self.in_node = True

        def post(_grad_inputs, _grad_outputs):
            self.in_node = False

        if not isinstance(roots, (list, tuple)):
            roots = [roots]
        seen, todo = set(), list(roots)
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if "AccumulateGrad" not in node.name():
                node.register_prehook(pre)
                node.register_hook(post)
            todo.extend(n for n, _ in node.next_functions)

    # -- the mode --------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused_depth:
            return func(*args, **kwargs)
        if func is torch.ops.aten.copy_.default and args[0].device.type == "cpu" \
                and args[1].device.type == "meta" and (
                    self.host_copies_keep or id(args[0].untyped_storage()) in self.host_kept):
            return args[0]
        if self.auto_phase:
            self._auto()
        if self.engine_accumulation(func, args, kwargs):
            old, new = args
            if self.accumulate is None:
                self.accumulations.append(("probe", old._use_count(), storage_uses(old)))
            elif self.cuda_adds_in_place(old, new):
                self.accumulations.append((True, old.untyped_storage().nbytes()))
                return old.add_(new)
            else:
                self.accumulations.append((False, old.untyped_storage().nbytes()))
        try:
            out = func(*args, **kwargs)
        except NotImplementedError:
            # No meta kernel (_fused_sgd_): an op that only mutates its
            # arguments and returns nothing allocates nothing; skip it.
            schema = func._schema
            if schema.returns or not any(a.alias_info and a.alias_info.is_write for a in schema.arguments):
                raise
            return None
        name = None
        host_from = SDPA_KERNELS.get(func)
        gemm_out = False
        leaves = tree_leaves(out)
        if func is _CUDNN_SDPA and func is not None:
            leaves = [out[6], out[7], out[0], out[1]]
        if any(isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t) for t in leaves):
            leaves = [p for t in leaves
                      for p in (plain_tensors(t) if isinstance(t, torch.Tensor) else [t])]
        conv_ws = {}
        if self.conv_workspaces is not None and func in CONV_OPS:
            # cuDNN's workspace right after each output it makes (forward:
            # the output; backward: grad input, then grad weight), freed
            # when the call returns.
            conv_ws = self.conv_workspaces.sizes(func, args, out)
            leaves = list(out) if isinstance(out, (tuple, list)) else [out]
        for i, t in enumerate(leaves):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            if self.known(st):
                entry = self.live.get(id(st))
                if entry is not None and entry[0]["size"] != st.nbytes():
                    raise RuntimeError(f"{func} resized a storage ({entry[0]['size']} -> {st.nbytes()} bytes)")
                continue
            if host_from is not None and i >= host_from:
                self.add_quiet(st)
                continue
            name = name or str(func)
            self.add(st, name)
            if i in conv_ws:
                self.conv_workspaces.on_conv(self, conv_ws[i])
            gemm_out = gemm_out or (t.device.type == "meta" and t.dtype in _FLOATS)
        if self.workspaces is not None and func in GEMM_OPS and gemm_out:
            self.workspaces.on_gemm(self, func, args)
        return out


# -- the self-test of the InputBuffer emulation -------------------------------

def _cases():
    """Graphs where h gets two gradients; each returns (h, witness, loss):
    the first gradient to reach h's buffer is the witness's (or a view of
    it). PyTorch adds in place in the first case only."""
    def residual(x, c):
        h = x * 1.5
        s = h + h.sin()
        return h, s, (s * c).sum()

    def twice(x, c):
        h = x * 1.5
        s = h + h
        return h, s, (s.sin() * c).sum()

    def view(x, c):
        h = x * 1.5
        a = (h * c).sum()
        ht = h.t()
        return h, ht, a + (ht * c).sum()
    return {"residual": residual, "twice": twice, "view": view}


_CALIBRATED = None


def self_test():
    """(use count, storage use count) of a buffered gradient, seen from
    inside the mode, at which CUDA adds in place: calibrated on the case
    where PyTorch (CPU, no mode) adds in place, checked on the others.
    Cached for the process."""
    global _CALIBRATED
    if _CALIBRATED is not None:
        return _CALIBRATED
    real, probes = {}, {}
    with torch.device("cpu"):
        for name, case in _cases().items():
            _probe(name, case, real, probes)
    if not real["residual"]:
        raise RuntimeError(f"self-test: PyTorch {torch.__version__} no longer accumulates in place ({real})")
    calibrated = probes["residual"]
    for name in real:
        if (probes[name] == calibrated) != real[name]:
            raise RuntimeError(f"self-test: in place {real}, but the reference counts are {probes}")
    _CALIBRATED = calibrated
    return calibrated


def _probe(name, case, real, probes):
    x = torch.randn(16, 16, requires_grad=True)
    h, witness, loss = case(x, torch.randn(16, 16))
    ptr = {}
    witness.register_hook(lambda g: ptr.__setitem__("first", g.data_ptr()))
    h.register_hook(lambda g: ptr.__setitem__("h", g.data_ptr()))
    loss.backward()
    real[name] = ptr["h"] == ptr["first"]

    rec = Recorder(accumulate=None, frames=False)
    with META:
        x = torch.randn(16, 16, requires_grad=True)
        h, witness, loss = case(x, torch.randn(16, 16))
    rec.phase = "backward"
    rec.hook_graph(loss.grad_fn)
    with rec:
        loss.backward()
    if len(rec.accumulations) != 1:
        raise RuntimeError(f"self-test {name}: {len(rec.accumulations)} accumulations, expected 1")
    probes[name] = rec.accumulations[0][1:]


def gc_paused():
    """Context: cyclic gc off (frees must come from reference counting)."""
    class _G:
        def __enter__(self):
            gc.collect()
            self.was = gc.isenabled()
            gc.disable()

        def __exit__(self, *exc):
            if self.was:
                gc.enable()
            return False
    return _G()
