"""What CUDA decides above the kernels, done on meta tensors: a
TorchFunctionMode (it sees the torch.* / F.* calls the model's Python code
makes, above autograd, so its casts are recorded by autograd as CUDA's
are).

SDPA backend. On meta, F.scaled_dot_product_attention always takes the
math path (it materialises the [B, H, S, S] attention matrix). On a CUDA
GPU of compute capability 8.0 or more PyTorch picks, in order: flash
attention (fp16/bf16, no attn_mask, head dim <= 256, no GQA), then the
memory-efficient kernel (fp32 too, attn_mask allowed, head dim a multiple
of 8 for fp16/bf16 or 4 for fp32, no GQA), then math. On Hopper and
Blackwell (compute capability 9.x, 10.x) PyTorch puts cuDNN attention
first (sdp_utils.cpp's check_prefer_cudnn_attention: a runtime cuDNN newer
than 9.15, as the CUDA 13 wheels bring, and TORCH_CUDNN_SDPA_DEPRIORITIZED
unset): fp16/bf16, head dims a multiple of 8 and <= 128, masks allowed.
Measured on an H200 with PyTorch 2.11 (cu130, cuDNN 9.19): GPT-2's bf16
attention runs cuDNN, its fp32 attention the memory-efficient kernel. The
rule is applied from PyTorch 2.11 (older versions: flash first, as
before; with a CUDA 12 wheel whose cuDNN is 9.15 or older PyTorch keeps
flash first too: say sdpa="flash"). sdpa="auto" makes that choice and
calls the chosen kernel's aten op (_scaled_dot_product_cudnn_attention /
_flash_attention / _efficient_attention, whose meta kernels and backward
formulas are PyTorch's); "cudnn", "flash", "efficient" force one where it
applies; "math" keeps meta's choice. cuDNN's philox seed and offset are
device tensors (8 bytes each, kept for the backward, as measured); the
workspaces cuDNN allocates inside the kernels (the backward's, about the
size of an fp32 dQ, freed at once) are not added.

Autocast. torch.autocast("cuda") cannot be entered without a GPU, and
meta tensors have no autocast dispatch key. autocast(dtype) here applies
CUDA's autocast policy (aten/src/ATen/autocast_mode.h: the lower-precision
list, the fp32 list, the fp32-with-dtype list, the promote list) to the
calls the model makes: eligible floating arguments are cast with .to(),
and casts of leaf tensors that require grad (the parameters) are cached
until the outermost autocast exits, as CUDA's weight cast cache is. Calls
made from inside another function the mode passes through (a Python
function not in the lists, e.g. F.multi_head_attention_forward, or C++
composites) are not re-examined: CUDA's autocast would see those too.
cross_entropy is taken as CUDA runs it: cross_entropy_loss calls
log_softmax(input, dim, input.dtype) (the explicit dtype keeps autocast's
fp32_set_opt_dtype rule from applying: the log-probabilities stay in
bf16/fp16, saved for the backward), then nll_loss, which is on the fp32
list: its input is cast to float32 (also saved). Measured on CUDA (2.11):
bf16 logits, bf16 log-probabilities and their fp32 copy all alive at the
end of the forward.

"cuda" in the user's code. There is no GPU: torch.arange(n, device="cuda"),
t.cuda(), t.to("cuda"), t.to(0), model.cuda() / model.to("cuda") (their
tensors' .to / .cuda), torch.device("cuda") as a device= argument or as a
default device would initialise CUDA and fail. The mode puts them on the
recording's device (meta) instead, where a CUDA run would have them on the
GPU, and counts them (map_cuda_device, CudaToMeta for the model's builder).
pin_memory (page-locked host memory: no GPU memory) is left out.

Dropout. CUDA's at::dropout (aten/src/ATen/native/Dropout.cpp) runs
native_dropout in training for 0 < p < 1 on a non-empty tensor, whose mask
is a bool tensor (1 byte an element) saved for the backward; meta takes the
CPU's composite path (a noise tensor of the input's dtype and size,
bernoulli_, then mul: 4 bytes an element in fp32). F.dropout / nn.Dropout /
torch.dropout are run as native_dropout. The in-place form (inplace=True:
dropout_), F.dropout1d/2d/3d (feature_dropout), alpha_dropout and
feature_alpha_dropout take the composite path on CUDA too: left as they are.

Tensors made with no device inside forward (torch.arange(n)) land on the
recording's default device, meta, as GPU memory; in a CUDA run they are on
the CPU, and an op that mixes them with the model's CUDA tensors fails.
Those not moved with .to(...) afterwards are counted (no_device) and the
recording warns (0-dim ones are left out: CUDA ops take CPU scalars).

cuDNN convolution workspaces: CudnnConvWorkspaces, at the end of this file
(used by the recorder's dispatch mode, not by this function mode).
"""

import os
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

LOWER = {
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "_convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "__matmul__", "__rmatmul__", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
}
FP32 = {
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow", "__pow__", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
    "rms_norm",
}
# F.interpolate's modes that run an fp32-list upsample op (area is a pool).
UPSAMPLE_MODES = {"nearest", "nearest-exact", "linear", "bilinear", "trilinear", "bicubic"}
FP32_SET_DTYPE = {"prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                  "linalg_matrix_norm", "sum", "norm", "linalg_norm"}
PROMOTE = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add"}
LOWER_DTYPES = (torch.float16, torch.bfloat16)
SDPA_CHOICES = ("auto", "cudnn", "flash", "efficient", "math")


def torch_version():
    """PyTorch's (major, minor); (0, 0) where it does not parse."""
    v = torch.__version__.split("+")[0].split(".")
    try:
        return int(v[0]), int(v[1])
    except (ValueError, IndexError):
        return (0, 0)


def cudnn_attention_first(capability, version=None):
    """Whether CUDA's SDPA tries cuDNN attention first (see the module's
    docstring): compute capability 9.x or 10.x, PyTorch 2.11 or later,
    TORCH_CUDNN_SDPA_DEPRIORITIZED not 1 (older builds: TORCH_CUDNN_SDPA_
    PREFERRED not 0)."""
    version = torch_version() if version is None else version
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") == "1" \
            or os.environ.get("TORCH_CUDNN_SDPA_PREFERRED") == "0":
        return False
    return version >= (2, 11) and capability[0] in (9, 10)


_META = torch.device("meta")


def is_cuda_device(d):
    """A device= value that names a CUDA device: "cuda", "cuda:N",
    torch.device("cuda"), or an index (PyTorch reads an int as cuda:N)."""
    if isinstance(d, bool):
        return False
    if isinstance(d, int):
        return True
    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    return isinstance(d, torch.device) and d.type == "cuda"


def map_cuda_device(func, args, kwargs):
    """(func, args, kwargs, mapped): a call that names a CUDA device with
    the device replaced by meta (the recording's device); mapped says
    whether it did. Tensor.cuda(...) becomes Tensor.to(meta, ...);
    pin_memory (host memory) becomes the tensor itself (func None)."""
    mapped = False
    if func is torch.Tensor.pin_memory:
        return None, args, kwargs, True
    if kwargs.get("pin_memory"):
        kwargs = dict(kwargs, pin_memory=False)
        mapped = True
    d = kwargs.get("device")
    if d is not None and is_cuda_device(d):
        kwargs = dict(kwargs, device=_META)
        mapped = True
    if func is torch.Tensor.cuda:
        names = ("device", "non_blocking", "memory_format")
        a = dict(zip(names, args[1:]))
        a.update(kwargs)
        kw = {"non_blocking": a.get("non_blocking", False)}
        if a.get("memory_format") is not None:
            kw["memory_format"] = a["memory_format"]
        return torch.Tensor.to, (args[0], _META), kw, True
    if func is torch.Tensor.to and len(args) > 1 and is_cuda_device(args[1]):
        args = (args[0], _META) + tuple(args[2:])
        mapped = True
    return func, args, kwargs, mapped


class CudaToMeta(TorchFunctionMode):
    """Only the "cuda" -> meta mapping (map_cuda_device): around the
    model's builder, which runs before the recording (CudaEmulation does
    the same inside it). `mapped` counts the calls it changed."""

    def __init__(self):
        super().__init__()
        self.mapped = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        func, args, kwargs, mapped = map_cuda_device(func, args, kwargs or {})
        self.mapped += mapped
        if func is None:
            return args[0]
        return func(*args, **kwargs)


def _eligible(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in x):
        return type(x)(fn(e) if isinstance(e, torch.Tensor) else e for e in x)
    return x


class CudaEmulation(TorchFunctionMode):
    def __init__(self, sdpa="auto", recorder=None, capability=(9, 0)):
        super().__init__()
        if sdpa not in SDPA_CHOICES:
            raise ValueError(f"sdpa={sdpa!r}: {', '.join(SDPA_CHOICES)}")
        self.sdpa = sdpa
        self.capability = tuple(capability)
        self.cudnn_first = cudnn_attention_first(self.capability)
        self.recorder = recorder
        self.amp_dtype = None
        self.amp_depth = 0
        self.cast_cache = {}  # id(leaf) -> (leaf, cast)
        self.cache_enabled = True
        self.sdpa_choices = {}
        self.cuda_mapped = 0  # calls naming a CUDA device, put on meta
        self.native_dropouts = 0  # F.dropout calls run as CUDA's native_dropout
        # Tensors made with no device inside forward: id(tensor) -> call site,
        # and per call site [function, tensors, bytes, moved with .to()].
        self._no_device_made = {}
        self.no_device = {}

    # -- autocast ----------------------------------------------------------
    def autocast(self, dtype=torch.float16, enabled=True, cache_enabled=True):
        """Context: CUDA's autocast to `dtype`, emulated. It also sets
        PyTorch's own CUDA autocast flags (no effect on meta tensors, which
        have no autocast dispatch key) so that code that reads them, such
        as torch.utils.checkpoint's recomputation, re-enters it."""
        mode = self

        class _Ctx:
            def __enter__(self):
                self.prev = (mode.amp_dtype, mode.cache_enabled, torch.is_autocast_enabled("cuda"),
                             torch.get_autocast_dtype("cuda"), torch.is_autocast_cache_enabled())
                mode.amp_depth += 1
                mode.amp_dtype = dtype if enabled else None
                mode.cache_enabled = cache_enabled
                torch.set_autocast_enabled("cuda", bool(enabled))
                torch.set_autocast_dtype("cuda", dtype)
                torch.set_autocast_cache_enabled(cache_enabled)
                return self

            def __exit__(self, *exc):
                mode.amp_depth -= 1
                mode.amp_dtype, mode.cache_enabled, en, dt, ce = self.prev
                torch.set_autocast_enabled("cuda", en)
                torch.set_autocast_dtype("cuda", dt)
                torch.set_autocast_cache_enabled(ce)
                if mode.amp_depth == 0:
                    mode.cast_cache.clear()
                return False
        return _Ctx()

    def _to(self, t, dtype):
        if t.dtype == dtype:
            return t
        cache = (dtype == self.amp_dtype and self.cache_enabled
                 and t.is_leaf and t.requires_grad)
        if cache:
            hit = self.cast_cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
        c = t.to(dtype)
        if cache:
            self.cast_cache[id(t)] = (t, c)
            if self.recorder is not None:
                self.recorder.mark("autocast_cache", [c])
        return c

    def _cast(self, args, kwargs, dtype, only=None):
        """The arguments cast, last first: CUDA's autocast wrapper casts them
        in a pack expansion, cached_cast(args)..., which GCC (the Linux
        wheels) evaluates right to left: measured (2.11), a Linear's bias
        cast is allocated first, then the weight's, then the input's."""
        def fn(t):
            if _eligible(t) and (only is None or t.dtype in only) and t.dtype != dtype:
                return self._to(t, dtype)
            return t
        kw = {k: _map(v, fn) for k, v in reversed(list(kwargs.items()))}
        out = [_map(a, fn) for a in reversed(args)]
        return tuple(reversed(out)), {k: kw[k] for k in kwargs}

    # -- SDPA --------------------------------------------------------------
    def _sdpa(self, args, kwargs):
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
        a = dict(zip(names, args))
        a.update(kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        mask, p = a.get("attn_mask"), a.get("dropout_p", 0.0)
        causal, scale, gqa = a.get("is_causal", False), a.get("scale"), a.get("enable_gqa", False)
        d = q.shape[-1]
        same = q.dtype == k.dtype == v.dtype
        shapes_ok = q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and not gqa and q.shape[1] == k.shape[1]
        flash_ok = (same and q.dtype in LOWER_DTYPES and mask is None and d <= 256 and d % 8 == 0
                    and v.shape[-1] == d and shapes_ok)
        align = 8 if q.dtype in LOWER_DTYPES else 4
        eff_ok = same and q.dtype in (torch.float32, *LOWER_DTYPES) and d % align == 0 and shapes_ok \
            and v.shape[-1] % align == 0
        cudnn_ok = self._cudnn_ok(q, k, v, mask, p, same, shapes_ok)
        choice = "math"
        if self.sdpa == "auto":
            order = ("cudnn", "flash", "efficient") if self.cudnn_first else ("flash", "efficient")
            ok = {"cudnn": cudnn_ok, "flash": flash_ok, "efficient": eff_ok}
            choice = next((c for c in order if ok[c]), "math")
        elif self.sdpa == "cudnn" and cudnn_ok:
            choice = "cudnn"
        elif self.sdpa == "flash" and flash_ok:
            choice = "flash"
        elif self.sdpa == "efficient" and eff_ok:
            choice = "efficient"
        if self.recorder is None or not self.recorder.paused_depth:
            self.sdpa_choices[choice] = self.sdpa_choices.get(choice, 0) + 1
        if q.device.type != "meta":
            choice = "math"
        need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if choice == "cudnn":
            if mask is not None and mask.dtype == torch.bool:
                # CUDA converts a boolean mask to an additive one first (not expanded).
                mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(mask.logical_not(), float("-inf"))
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                q, k, v, mask, need_lse, p, causal, False, scale=scale)[0]
        if choice == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, p, causal, False, scale=scale)[0]
        if choice == "efficient":
            if mask is not None:
                mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]) if mask.dim() <= 4 else mask
                if mask.dtype == torch.bool:
                    # CUDA converts a boolean mask to an additive one first.
                    mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(mask.logical_not(), float("-inf"))
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, need_lse, p, causal, scale=scale)[0]
        return None

    @staticmethod
    def _cudnn_ok(q, k, v, mask, p, same, shapes_ok):
        """sdp_utils.cpp's can_use_cudnn_attention for dense inputs (cuDNN's
        head-dim limit taken as 128, and 192/128; GQA left to the others)."""
        if not hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention"):
            return False
        if not (same and shapes_ok and q.dtype in LOWER_DTYPES):
            return False
        try:
            if not torch.backends.cuda.cudnn_sdp_enabled():
                return False
        except AttributeError:  # pragma: no cover - older PyTorch
            return False
        if torch.are_deterministic_algorithms_enabled() \
                and not torch.is_deterministic_algorithms_warn_only_enabled():
            return False
        d_qk, d_v = q.shape[-1], v.shape[-1]
        if not ((d_qk <= 128 and d_v <= 128) or (d_qk == 192 and d_v == 128)):
            return False
        if d_qk % 8 or d_v % 8 or q.shape[0] > 65535 or q.shape[1] > 65535:
            return False
        if k.shape[2] == 1 or p * 16.0 != int(p * 16.0) or (p and q.shape[2] == 1):
            return False
        if min(q.shape[2], k.shape[2]) == 0 or any(t.stride(-1) != 1 for t in (q, k, v)):
            return False
        return mask is None or mask.dim() in (2, 4)

    # -- the mode ------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        func, args, kwargs, mapped = map_cuda_device(func, args, kwargs)
        if mapped:
            self.cuda_mapped += 1
            if func is None:
                return args[0]
        if self.recorder is not None and self.recorder.in_optimizer and func in _host_factories() \
                and kwargs.get("device") is None and _default_device_is_meta() \
                and not (args and isinstance(args[0], torch.Tensor)):
            # A tensor made with no device inside optimizer.step() lands on
            # the default device: the CPU in a CUDA run (PyTorch keeps
            # state['step'] on the host on purpose and calls .item() on it;
            # before 2.15, Adam/AdamW made it with torch.tensor(0.0) and no
            # device), meta here. Put it where CUDA's run has it.
            kwargs = dict(kwargs, device="cpu")
        if self._no_device_made and func is torch.Tensor.to and args:
            self._moved(args, kwargs)
        if self.recorder is not None and self.recorder.modules and func in _host_factories() \
                and self._forward_without_device(args, kwargs):
            out = func(*args, **kwargs)
            self._made_without_device(func, out)
            return out
        if func is F.dropout or func is torch.dropout:
            r = self._dropout(func, args, kwargs)
            if r is not None:
                return r
        name = getattr(func, "__name__", "")
        amp = self.amp_dtype
        if amp is not None:
            if name in LOWER:
                args, kwargs = self._cast(args, kwargs, amp)
            elif name in FP32:
                args, kwargs = self._cast(args, kwargs, torch.float32, only=LOWER_DTYPES)
            elif name in FP32_SET_DTYPE:
                first = args[0] if args else None
                if _eligible(first) and first.dtype in LOWER_DTYPES and kwargs.get("dtype") is None \
                        and not (len(args) > 2 and name in ("softmax", "log_softmax") and args[2] is not None):
                    kwargs = dict(kwargs, dtype=torch.float32)
            elif name in ("cross_entropy_loss", "cross_entropy"):
                r = self._cross_entropy(func, args, kwargs)
                if r is not None:
                    return r
            # Python functions whose inner aten calls (an upsample op, a
            # norm) this mode does not see: their policy applied here.
            elif func is F.interpolate:
                mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
                if mode in UPSAMPLE_MODES:
                    args, kwargs = self._cast(args, kwargs, torch.float32, only=LOWER_DTYPES)
            elif func is F.normalize:
                r = self._normalize(args, kwargs)
                if r is not None:
                    return r
            elif name in PROMOTE:
                dts = [t.dtype for t in tree_tensors(args, kwargs) if _eligible(t)]
                if dts:
                    wide = torch.float32 if torch.float32 in dts else dts[0]
                    args, kwargs = self._cast(args, kwargs, wide)
        if name == "scaled_dot_product_attention" and self.sdpa != "math":
            r = self._sdpa(args, kwargs)
            if r is not None:
                return r
        return func(*args, **kwargs)

    # -- F.normalize under autocast ------------------------------------------
    def _normalize(self, args, kwargs):
        """F.normalize as CUDA's autocast runs it: input / input.norm(...)
        with the norm in float32 (norm is fp32_append_dtype), so the
        quotient is float32 and the 16-bit input is saved as it is."""
        a = dict(zip(("input", "p", "dim", "eps", "out"), args))
        a.update(kwargs)
        x = a.get("input")
        if not _eligible(x) or x.dtype not in LOWER_DTYPES or a.get("out") is not None:
            return None
        p, dim, eps = a.get("p", 2.0), a.get("dim", 1), a.get("eps", 1e-12)
        denom = x.norm(p, dim, keepdim=True, dtype=torch.float32).clamp_min(eps).expand_as(x)
        return x / denom

    # -- dropout ---------------------------------------------------------------
    def _dropout(self, func, args, kwargs):
        """F.dropout / torch.dropout as CUDA's at::dropout runs them (see the
        module's docstring): native_dropout's output (its bool mask saved
        for the backward), or None where CUDA takes the composite path too."""
        if func is F.dropout:
            a = dict(zip(("input", "p", "training", "inplace"), args))
            a.update(kwargs)
            p, train, inplace = a.get("p", 0.5), a.get("training", True), a.get("inplace", False)
        else:
            a = dict(zip(("input", "p", "train"), args))
            a.update(kwargs)
            p, train, inplace = a.get("p"), a.get("train"), False
        x = a.get("input")
        if inplace or not train or type(x) is not torch.Tensor or x.device.type != "meta" \
                or not x.is_floating_point() or x.numel() == 0 \
                or not isinstance(p, (int, float)) or not 0 < p < 1:
            return None
        if self.recorder is None or not self.recorder.paused_depth:
            self.native_dropouts += 1
        return torch.native_dropout(x, float(p), True)[0]

    # -- tensors made with no device inside forward ------------------------------
    def _forward_without_device(self, args, kwargs):
        """A factory call inside a module's forward (not a probe's) that
        names no device, under the recording's default meta device."""
        rec = self.recorder
        return (not rec.in_optimizer and not rec.paused_depth and kwargs.get("device") is None
                and not (args and isinstance(args[0], torch.Tensor)) and _default_device_is_meta())

    def _made_without_device(self, func, out):
        if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.device.type != "meta":
            return
        from .recorder import python_frames
        user = next((f for f in python_frames(short=True) if not f[0].startswith("torch/")), None)
        site = f"{user[0]}:{user[1]} ({user[2]})" if user else "?"
        entry = self.no_device.setdefault(site, [f"torch.{getattr(func, '__name__', 'factory')}", 0, 0, False])
        entry[1] += 1
        entry[2] += out.untyped_storage().nbytes()
        key = id(out)
        self._no_device_made[key] = (site, weakref.ref(out, lambda r, k=key: self._no_device_made.pop(k, None)))

    def _moved(self, args, kwargs):
        """Tensor.to(...) on a tensor made with no device: a device (or a
        tensor to follow) moves it where the code wants it; a dtype alone
        leaves it on the CPU in a CUDA run."""
        made = self._no_device_made.get(id(args[0]))
        if made is None or made[1]() is not args[0]:
            return
        if kwargs.get("device") is not None or any(
                not isinstance(x, (torch.dtype, bool)) and x is not None for x in args[1:]):
            self.no_device[made[0]][3] = True

    def _cross_entropy(self, func, args, kwargs):
        names = ["input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                 "label_smoothing"]
        if func is not F.cross_entropy:
            names = ["input", "target", "weight", "reduction", "ignore_index", "label_smoothing"]
        a = dict(zip(names, args))
        a.update(kwargs)
        x = a["input"]
        if not (_eligible(x) and x.dtype in LOWER_DTYPES) or a.get("label_smoothing", 0.0):
            return None
        if a.get("size_average") is not None or a.get("reduce") is not None:
            return None
        reduction = a.get("reduction", "mean")
        if isinstance(reduction, int):
            reduction = ["none", "mean", "sum"][reduction]
        t = a["target"]
        if t.is_floating_point():
            return None
        # cross_entropy_loss: log_softmax(self, class_dim, self.scalar_type()),
        # which autocast leaves in the input's dtype; then nll_loss (fp32 list).
        lsm = torch.log_softmax(x, 1 if x.dim() > 1 else 0, dtype=x.dtype)
        return F.nll_loss(self._to(lsm, torch.float32), t, weight=a.get("weight"),
                          ignore_index=a.get("ignore_index", -100), reduction=reduction)


def _host_factories():
    """The factory functions the default device applies to (the set
    torch.device(...) as a context patches)."""
    global _FACTORIES
    if _FACTORIES is None:
        try:
            from torch.utils._device import _device_constructors
            _FACTORIES = frozenset(_device_constructors())
        except (ImportError, AttributeError):  # pragma: no cover - older PyTorch
            _FACTORIES = frozenset({torch.tensor, torch.zeros, torch.ones, torch.full, torch.empty,
                                    torch.scalar_tensor, torch.as_tensor, torch.arange})
    return _FACTORIES


_FACTORIES = None


def _default_device_is_meta():
    try:
        from torch.utils import _device
        d = getattr(_device, "CURRENT_DEVICE", None)
    except ImportError:  # pragma: no cover
        return True
    if d is None:
        # Not tracked (older PyTorch) or no default device set: ask a factory.
        return torch.empty(0).device.type == "meta"
    return torch.device(d).type == "meta"


def tree_tensors(args, kwargs):
    out = []
    for x in list(args) + list(kwargs.values()):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(e for e in x if isinstance(e, torch.Tensor))
    return out


# -- cuDNN convolution workspaces ----------------------------------------------------

CONV_WORKSPACE_RULES = ("auto", "fitted-h200", "transform", "off")
_MiB = 1 << 20


class CudnnConvWorkspaces:
    """cuDNN's convolution workspaces, which PyTorch allocates through the
    caching allocator right before each cuDNN call and frees right after
    it (aten/src/ATen/native/cudnn/Conv_v8.cpp): the forward's after its
    output, the backward's input-gradient (dgrad) one after grad_input and
    the weight-gradient (wgrad) one after grad_weight. Their sizes depend on
    the algorithm cuDNN's heuristics pick on the real GPU, so what is here
    is a rule, not a derivation. Emitted as allocations of category
    "workspace" labelled "cudnn conv workspace (forward|grad input|grad
    weight)", freed at once.

    Measured (docs/recorder.md, "Against a real GPU"): ResNet-50 (batch 32,
    224x224, fp32 NCHW, cudnn.benchmark off, TF32 allowed, PyTorch's
    defaults) on an NVIDIA H200 with PyTorch 2.11.0+cu130 and cuDNN 9.19:
    158 cuDNN calls a step (53 forward, 52 dgrad, 53 wgrad), 101 of them
    with a workspace of 1 MiB or more, up to 155 MiB. Write x, y, w for the bytes of the
    convolution's input, output and weight (in the backward: the input, the
    output's gradient, the weight) and w4 for the weight's element count x 4
    (fp32 partial sums).

    Known from the sizes (they match to the byte, so the mechanism is
    clear even though cuDNN does not document it):
      * layout copies: an fp32 NCHW convolution runs on kernels that work in
        NHWC, and the workspace holds transposed copies of x, y and, for a
        kernel larger than 1x1, w (a 1x1 filter's KCRS and KRSC layouts are
        the same bytes), plus 16 bytes (147 for a strided dgrad): T =
        x + y + [w] + 16;
      * 1x1, stride-1 convolutions over a large enough image run as a GEMM
        on NCHW directly: no workspace for the forward or dgrad (a 400-byte
        one, or none: left out), and for wgrad 32 fp32 partial weight
        gradients summed afterwards (32 x w4; N = 32 in the run: whether it
        is N or a fixed 32 is not known);
      * wgrad otherwise adds split-K partial sums, a whole number of fp32
        copies of the weight gradient (T + m x w4).

    Fitted to that one run (the heuristics' choices; nothing documents them):
      * "large enough" for the GEMM path: output H x W >= 128 (measured: 196,
        784 and 3,136 take it, 49 does not);
      * the GEMM path's wgrad only while 32 x w4 <= 32 MiB (1 MiB weights
        took it, the one 2 MiB weight did not: T + 4 x w4);
      * the split-K count m: enough partial sums to fill the GPU's 132 SMs
        (H100 SXM, H200) with 128 x 128 tiles of the wgrad GEMM (K x C*R*S),
        at most one per 1,024 output positions (N*H*W), none below 2:
        m = min(132 // tiles, N*H*W // 1024). It gives the measured m for
        the 3x3 convolutions at 28 and 14 px (14, 3), the stride-2 1x1 at
        56 px (16), the 1x1 1024->512 (4) and where there was none (the 1x1
        and stride-2 1x1 at 7 px); it says 26 for the 64-channel 3x3 (real
        14: 1.8 MB high) and 4 for the stride-2 1x1 512->1024 (real 2: 4.2
        MB high), and misses what cuDNN's other algorithms took (the
        512-channel 3x3s at 7 px: 5.5 MB more; the 7x7 stem: 10 MB more).
    Of the 158 calls of a step (the 400-byte workspaces taken as none), 145
    come out within 1 KiB of the measured size; besides the wgrads above,
    the forwards of the 64-channel 3x3 (real: x + w + 16, no output copy)
    and of the stride-2 1x1 256->512 (real: x + w + 16) come out 25.7 and
    50.9 MB high, the 512-channel stride-2 3x3's 7.3 MB low. Not fitted
    to: SimpleConvNet (scripts/cuda_recorder_check.py), the only other
    convolution net run on the H200, whose snapshot was not kept: its
    counters show 6 allocations and 201.5 MB more over its 2 steps than the
    recording without workspaces has, where the rule adds 10, 322.6 MB.

    rule "fitted-h200" is all of that; "transform" only the layout copies
    (T for every convolution, no GEMM path, no split-K: the part that is
    known); "off" none; "auto" is "fitted-h200" while
    torch.backends.cudnn.enabled, for every PyTorch version and compute
    capability (only the one above was measured). Not modelled (no
    workspace added): grouped and depthwise convolutions (PyTorch runs
    depthwise ones on its own kernels), float64. Taken without
    measurement: cudnn.benchmark=True (cuDNN then times the algorithms and
    may take any whose workspace fits; the rule is applied as it is), fp16/bf16 tensors (their own element size for the
    copies), channels_last tensors (no layout copies: only the wgrad partial
    sums), conv1d/conv3d (the same formulas over their spatial sizes),
    transposed convolutions (cuDNN runs their forward as the dgrad of the
    matching convolution and their dgrad as its forward)."""

    SMS = 132     # H100 SXM and H200
    TILE = 128
    CHUNK = 1024  # output positions per split-K partial sum, at least

    def __init__(self, rule="auto"):
        if rule not in CONV_WORKSPACE_RULES:
            raise ValueError(f"cuDNN workspace rule {rule!r}: {', '.join(CONV_WORKSPACE_RULES)}")
        self.rule = "fitted-h200" if rule == "auto" else rule
        self.added = 0
        self.largest = 0

    def describe(self):
        if self.rule == "off":
            return "cuDNN convolution workspaces: off (not added)"
        what = ("fitted on an H200, PyTorch 2.11, cuDNN 9.19, fp32 NCHW" if self.rule == "fitted-h200"
                else "layout copies only")
        return f"cuDNN convolution workspaces: rule {self.rule} ({what})"

    def sizes(self, func, args, out):
        """{output index: (bytes, label)} for a convolution op (forward:
        index 0; backward: 0 grad input, 1 grad weight), {} when none."""
        if self.rule == "off" or not torch.backends.cudnn.enabled:
            return {}
        try:
            if func is torch.ops.aten.convolution.default:
                x, w = args[0], args[1]
                y = out
                stride, padding, transposed, groups = args[3], args[4], args[6], args[8]
                kinds = {0: "forward"}
            else:
                y, x, w = args[0], args[1], args[2]
                stride, padding, transposed, groups = args[4], args[5], args[7], args[9]
                mask = args[10]
                kinds = {i: k for i, k in ((0, "grad input"), (1, "grad weight"))
                         if mask[i] and out[i] is not None}
        except (IndexError, TypeError):
            return {}
        if not all(isinstance(t, torch.Tensor) for t in (x, w, y)) or groups != 1 \
                or x.device.type != "meta" or x.dtype not in (torch.float32, *LOWER_DTYPES) \
                or x.dim() not in (3, 4, 5) or x.dim() != w.dim():
            return {}
        if transposed:
            # The matching convolution maps y's shape to x's: its forward is
            # this one's dgrad and the other way round.
            x, y = y, x
            swap = {"forward": "dgrad", "grad input": "forward", "grad weight": "wgrad"}
        else:
            swap = {"forward": "forward", "grad input": "dgrad", "grad weight": "wgrad"}
        res = {}
        for i, label in kinds.items():
            n = self.size(swap[label], x, y, w, stride, padding)
            if n > 0:
                res[i] = (n, f"cudnn conv workspace ({label})")
        return res

    def size(self, kind, x, y, w, stride, padding):
        """Bytes of the workspace for kind "forward", "dgrad" or "wgrad" of
        a convolution with input x, output y, weight w (tensors: shapes,
        dtypes, layouts), by this rule (0: none)."""
        if self.rule == "off":
            return 0
        e = x.element_size()
        xb, yb, wb = x.numel() * e, y.numel() * e, w.numel() * w.element_size()
        w4 = w.numel() * 4
        kernel = list(w.shape[2:])
        one = all(k == 1 for k in kernel)
        stride = list(stride) if isinstance(stride, (list, tuple)) else [stride]
        padding = list(padding) if isinstance(padding, (list, tuple)) else [padding]
        strided = any(s != 1 for s in stride)
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
        nhwc = fmt is not None and any(
            t.is_contiguous(memory_format=fmt) and not t.is_contiguous() for t in (x, w))
        copies = 0 if nhwc else xb + yb + (0 if one else wb)
        tail = 0 if copies == 0 else (147 if kind == "dgrad" and strided else 16)
        if self.rule == "transform":
            return copies + tail
        out_px = 1
        for s in y.shape[2:]:
            out_px *= s
        gemm = one and not strided and not any(padding) and out_px >= 128
        if kind in ("forward", "dgrad"):
            return 0 if gemm else copies + tail
        # wgrad
        partials = min(x.shape[0], 32) * w4
        if gemm and partials <= 32 * _MiB:
            return partials
        k_dim, crs = w.shape[0], w.numel() // w.shape[0]
        tiles = -(-k_dim // self.TILE) * -(-crs // self.TILE)
        m = min(self.SMS // tiles, x.shape[0] * out_px // self.CHUNK)
        return copies + tail + (m * w4 if m >= 2 else 0)

    def on_conv(self, rec, label_size):
        size, label = label_size
        self.added += 1
        self.largest = max(self.largest, size)
        i = rec.synthetic_alloc(size, label, "workspace")
        rec.synthetic_free(i)
