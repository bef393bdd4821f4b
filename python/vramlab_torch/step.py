"""One PyTorch training step of any nn.Module, recorded: what
`python -m vramlab_torch record` runs.

    model = build_fn(**args)                    # under torch.device("meta"): no memory
    model.to_empty(device=...)                  # recorded: the parameters, as .to("cuda") makes them
    x, y = torch.empty(...), torch.empty(...)   # recorded: the inputs
    opt = torch.optim.AdamW(model.parameters(), ...)

    for step in range(steps):                   # --steps (default 2)
        with torch.autocast("cuda", dtype):     # --amp only
            out = model(*x)                     # the last step's out freed here
            loss = F.cross_entropy(out.view(-1, out.shape[-1]), y.view(-1))   # --target; the last loss freed here
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)         # --zero-grad
    # out and loss are still bound

The loop's names hold out (the model's whole output: with --target none the
loss it returns is in it) and loss from one step to the next, as a training
loop does: the old out dies where `out = model(*x)` rebinds the name, after
the new one exists (once the model's forward has returned it, in the next
step's forward), the old loss where the new loss is bound, and the last
step's are alive at the end of the recording. vramlab's trainer runs its
step the same way (crates/engine/src/train/step.rs), so `vramlab estimate`
holds them alike; a function `def train_step(x, y)` would free them at its
return instead, lowering what is alive between steps and at the end by
their size. The same with --dist ddp (out is DDP's output) and fsdp.

What is alive after the last step (parameters, buffers, inputs, optimizer
state, the loop's out and loss) is left alive: the recording ends without
freeing it. The loop's names are items of a dict (`held["out"] =
runner(*xs)`: the old value is dropped after the new one exists, as a
name's rebinding drops it; frees are emitted by weakrefs when a storage's
last reference dies), and nothing else keeps a reference to them.
"""

import contextlib
import importlib
import importlib.util
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cuda_emulation import CudaToMeta
from .recorder import META
from .session import Recording, RecordingError, UsageError, _user_frame, explain_error

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
          "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "fp32": torch.float32, "fp16": torch.float16, "half": torch.float16}
# --amp's spellings: every DTYPES name of float16 and bfloat16.
AMP_DTYPES = tuple(k for k, v in DTYPES.items() if v in (torch.float16, torch.bfloat16))


def load_builder(spec):
    """"path/to/file.py:fn" or "package.module:fn" -> the callable. A spec
    that names no file, module or function raises UsageError (one line);
    errors of the file's own code (raised while it is imported) are the
    user's and propagate as they are."""
    if ":" not in spec:
        example = f"{spec}:build" if spec.endswith(".py") else f"{spec}.py:build or {spec}:build"
        raise UsageError(f"BUILD {spec!r}: expected FILE.py:FUNCTION or MODULE:FUNCTION, the function "
                         f"that returns your nn.Module (e.g. {example})")
    where, fn = spec.rsplit(":", 1)
    if where.endswith(".py") or os.path.sep in where or os.path.exists(where):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise UsageError(f"BUILD {spec!r}: no file {where} (from {os.getcwd()}): give the path "
                             f"of the .py file that defines {fn}")
        name = "vramlab_user_" + os.path.splitext(os.path.basename(path))[0]
        s = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(s)
        sys.modules[name] = mod
        sys.path.insert(0, os.path.dirname(path))
        try:
            s.loader.exec_module(mod)
        finally:
            sys.path.pop(0)
    else:
        try:
            mod = importlib.import_module(where)
        except ModuleNotFoundError as e:
            if e.name is None or not (where == e.name or where.startswith(e.name + ".")):
                raise  # an import inside the module: the user's code
            raise UsageError(f"BUILD {spec!r}: no module {where!r} to import (a file is named with "
                             f"its .py: {where}.py:{fn})") from None
    if not callable(getattr(mod, fn, None)):
        defined = [k for k, v in vars(mod).items() if callable(v) and not k.startswith("_")
                   and getattr(v, "__module__", None) == mod.__name__]
        what = "has no" if not hasattr(mod, fn) else "has a non-callable"
        raise UsageError(f"BUILD {spec!r}: {where} {what} {fn!r}"
                         + (f"; it defines {', '.join(defined[:10])}" if defined else ""))
    return getattr(mod, fn)


def _describe(out, depth=0):
    """A short description of a model's output: Tensor[2, 16, 100],
    dict{'aux': Tensor[], 'logits': Tensor[2, 16, 100]}, tuple(...)."""
    if isinstance(out, torch.Tensor):
        return f"Tensor{list(out.shape)}"
    if depth > 2:
        return type(out).__name__
    if isinstance(out, dict):
        items = list(out.items())
        inner = ", ".join(f"{k!r}: {_describe(v, depth + 1)}" for k, v in items[:6])
        return f"{type(out).__name__}{{{inner}{', ...' if len(items) > 6 else ''}}}"
    if isinstance(out, (list, tuple)):
        inner = ", ".join(_describe(v, depth + 1) for v in out[:6])
        return f"{type(out).__name__}({inner}{', ...' if len(out) > 6 else ''})"
    return type(out).__name__


def pick_output(out):
    """(tensor, path): the output the loss is taken of, and where it was in
    the model's output ("output", "output['logits']", "output[0]",
    "output.logits"). A tensor is itself; an object with a .logits tensor
    (Hugging Face's ModelOutput) its logits; a dict its "logits" key, else
    its one tensor with a last dimension; a tuple or list its first tensor
    with a last dimension (nested ones searched the same way). Raises
    UsageError naming the output's structure where there is none."""
    if isinstance(out, torch.Tensor):
        return out, "output"
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits, "output.logits"
    if isinstance(out, dict):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"], "output['logits']"
        found = [(t, f"output[{k!r}]{p[len('output'):]}") for k, v in out.items()
                 for t, p in _with_last_dim(v)]
        if len(found) == 1:
            return found[0]
        why = (f"no 'logits' key and {len(found)} tensors with a last dimension" if found
               else "no tensor with a last dimension")
    elif isinstance(out, (list, tuple)):
        for i, v in enumerate(out):
            for t, p in _with_last_dim(v):
                return t, f"output[{i}]{p[len('output'):]}"
        why = "no tensor with a last dimension"
    else:
        why = "not a tensor, a tuple, a list or a dict"
    raise UsageError(
        f"the model returned {_describe(out)}: {why} to take the loss of; return the logits "
        f"(a tensor, a tuple's first tensor, or a dict's 'logits'), or compute the loss in your own "
        f"loop with vramlab_torch.record()", exit_code=1)


def pick_loss(out):
    """(tensor, path) for --target none: a model that computes its own loss
    returns it first or as "loss" (Hugging Face's ModelOutput, a dict, a
    tuple whose first element is a scalar); that scalar is summed, not the
    logits beside it. Else pick_output's choice."""
    if isinstance(out, torch.Tensor):
        return out, "output"
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss, "output.loss"
    if isinstance(out, dict) and isinstance(out.get("loss"), torch.Tensor) and out["loss"].dim() == 0:
        return out["loss"], "output['loss']"
    if isinstance(out, (list, tuple)) and out and isinstance(out[0], torch.Tensor) and out[0].dim() == 0:
        return out[0], "output[0]"
    return pick_output(out)


def _with_last_dim(v):
    """[(tensor, path)]: what pick_output takes from v (a tensor itself, a
    container's pick), if it has a last dimension; else []."""
    if isinstance(v, torch.Tensor):
        return [(v, "output")] if v.dim() >= 1 else []
    try:
        t, p = pick_output(v) if isinstance(v, (list, tuple, dict)) or hasattr(v, "logits") else (None, None)
    except UsageError:
        return []
    return [(t, p)] if t is not None and t.dim() >= 1 else []


def first_tensor(out):
    """The model's output tensor (pick_output's, without its path)."""
    return pick_output(out)[0]


def model_classes(model, limit=12):
    """The class names of a model's modules, most parameters first (for
    messages that ask for a class name)."""
    sizes = {}
    for m in model.modules():
        n = type(m).__name__
        sizes[n] = sizes.get(n, 0) + sum(p.numel() for p in m.parameters(recurse=False))
    names = sorted(sizes, key=lambda k: -sizes[k])
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def build_optimizer(name, params, lr, impl, weight_decay=None, momentum=0.0, betas=(0.9, 0.999)):
    """torch.optim's SGD / Adam / AdamW with torch.optim's defaults (SGD's
    momentum 0, AdamW's weight decay 0.01). A hyperparameter torch.optim
    refuses (its ValueError: "Invalid learning rate: -1.0") is a UsageError
    naming the option."""
    kw = {"foreach": dict(foreach=True), "for-loop": dict(foreach=False),
          "fused": dict(fused=True)}[impl]
    try:
        if name == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=momentum or 0.0, weight_decay=weight_decay or 0.0,
                                   **kw)
        if name == "adam":
            return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay or 0.0, **kw)
        if name == "adamw":
            wd = 0.01 if weight_decay is None else weight_decay
            return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=wd, **kw)
    except ValueError as e:
        text = str(e)
        opt = ("--lr" if "learning rate" in text else "--momentum" if "momentum" in text
               else "--weight-decay" if "weight_decay" in text else f"--optimizer {name}")
        raise UsageError(f"{opt}: torch.optim.{_OPTIMIZERS[name]} refuses "
                         f"it ({text}); give a value it takes (learning rate, momentum and weight decay "
                         f"are 0 or more)") from None
    raise ValueError(f"optimizer {name!r}: sgd, adam or adamw")


_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}


def optimizer_options(opt):
    """The optimizer's hyperparameters as torch.optim holds them
    (opt.defaults: lr, momentum, weight_decay, betas, foreach, fused, ...),
    JSON's types only: what the snapshot's metadata says was recorded."""
    out = {}
    for k, v in opt.defaults.items():
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) for x in v):
            out[k] = list(v)
    return out


def find_blocks(model, which="auto"):
    """The model's repeated blocks: every module of class `which`, or for
    "auto" the children of the nn.ModuleList / nn.Sequential with the most
    parameters whose two or more children are all of one class; [] where
    there are none."""
    if which != "auto":
        return [m for m in model.modules() if type(m).__name__ == which]
    best = None
    for m in model.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2:
            kinds = {type(c) for c in m}
            if len(kinds) == 1 and any(True for _ in next(iter(m)).parameters()):
                n = sum(p.numel() for p in m.parameters())
                if best is None or n > best[0]:
                    best = (n, list(m))
    return best[1] if best else []


def checkpoint_blocks(model, which="auto"):
    """Activation checkpointing (torch.utils.checkpoint, non-reentrant) on
    the model's repeated blocks (`find_blocks`). Returns the class name and
    how many blocks were wrapped."""
    from torch.utils.checkpoint import checkpoint

    blocks = find_blocks(model, which)
    if not blocks and which == "auto":
        raise UsageError("--checkpoint: the model has no nn.ModuleList / nn.Sequential of two or more "
                         "blocks of one class; name the modules to checkpoint with --checkpoint-class "
                         f"CLASS (the model's classes: {model_classes(model)})")
    if not blocks:
        raise UsageError(f"--checkpoint-class {which}: no module of that class in the model "
                         f"(its classes: {model_classes(model)})")
    for b in blocks:
        fwd = b.forward

        def wrapped(*a, _fwd=fwd, **k):
            return checkpoint(_fwd, *a, use_reentrant=False, preserve_rng_state=False, **k)
        b.forward = wrapped
    return type(blocks[0]).__name__, len(blocks)


def parse_shape(text):
    """"32,3,224,224" (or 32x3x224x224) -> (32, 3, 224, 224); UsageError
    naming --input otherwise."""
    try:
        shape = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        shape = None
    if not shape:
        raise UsageError(f"--input {text!r}: a shape is sizes separated by commas, e.g. 32,3,224,224")
    if any(d < 1 for d in shape):
        # A size of 0 records an empty step (nothing allocated for the
        # batch), a negative one nothing at all: neither is a model's input.
        raise UsageError(f"--input {text!r}: every size is 1 or more (a batch of 0 records nothing), "
                         f"e.g. 32,3,224,224")
    return shape


def parse_target(target):
    """--target's value -> (kind, N): ("classes", N or None), ("tokens",
    None), ("same", None), ("none", None). UsageError (exit 2) otherwise:
    N of classes:N is a whole number, 1 or more."""
    kind, sep, n = str(target).partition(":")
    if kind == "classes" and not sep:
        return "classes", None
    if kind == "classes":
        try:
            classes = int(n)
        except ValueError:
            classes = None
        if classes is None or classes < 1:
            raise UsageError(f"--target {target}: N of classes:N is the number of classes, a whole number, "
                             f"1 or more (e.g. classes:1000), or leave it out (classes)")
        return "classes", classes
    if kind in ("tokens", "same", "none") and not sep:
        return kind, None
    raise UsageError(f"--target {target!r}: one of classes[:N], tokens, same, none")


def make_target(target, inputs, probe):
    """(y, loss function) for --target: classes[:N] (int64 [B], cross
    entropy), tokens (int64 shaped like the first input, cross entropy over
    the last dimension), same (a tensor shaped like the output, MSE; the
    output's shape from `probe()`, a forward outside the recording) or none
    (the output's sum)."""
    kind, n_classes = parse_target(target)
    if kind == "classes":
        y = torch.empty(inputs[0].shape[0], dtype=torch.int64)

        def classes(o, y):
            _has_classes(o, target)
            if n_classes is not None and o.dim() >= 1 and o.shape[-1] != n_classes:
                # Refused, not warned: classes:N names the model's class
                # count, so an output of another width means the command and
                # the model built disagree (a wrong --arg, the wrong BUILD),
                # and the recording would be of a model other than the one meant.
                raise UsageError(
                    f"--target {target}: the output used is [{', '.join(map(str, o.shape))}], "
                    f"{o.shape[-1]} classes, not {n_classes}; say --target classes:{o.shape[-1]} (or "
                    f"classes), or build the model with {n_classes} classes", exit_code=1)
            rows = o.numel() // o.shape[-1] if o.shape[-1] else 0
            if rows != y.shape[0]:
                hint = (" (a language model's per-token logits: say --target tokens, labels shaped like "
                        "the first input)" if o.dim() > 2 else "")
                raise UsageError(
                    f"--target {target}: the output used is [{', '.join(map(str, o.shape))}], "
                    f"{rows} rows of {o.shape[-1]} classes, but the target is one class per sample "
                    f"({y.shape[0]}, the first input's batch){hint}", exit_code=1)
            return F.cross_entropy(o.reshape(-1, o.shape[-1]) if o.dim() > 2 else o, y)
        return y, classes
    if kind == "tokens":
        y = torch.empty(inputs[0].shape, dtype=torch.int64)

        def tokens(o, y):
            _has_classes(o, target)
            rows = o.numel() // o.shape[-1] if o.shape[-1] else 0
            if rows != y.numel():
                raise UsageError(
                    f"--target tokens: the output used is [{', '.join(map(str, o.shape))}], {rows} rows "
                    f"of {o.shape[-1]} classes, but the labels are shaped like the first input "
                    f"[{', '.join(map(str, y.shape))}] ({y.numel()} labels); one class per sample is "
                    f"--target classes", exit_code=1)
            return F.cross_entropy(o.reshape(-1, o.shape[-1]), y.reshape(-1))
        return y, tokens
    if kind == "same":
        shape, dtype = probe()
        y = torch.empty(shape, dtype=dtype)
        return y, lambda o, y: F.mse_loss(o, y)
    return None, lambda o, y: o.sum()  # none


def _has_classes(o, target):
    if o.dim() == 0:
        raise UsageError(f"--target {target}: the output used is a scalar (a loss?), with no class "
                         f"dimension to take cross entropy over; --target none takes its sum",
                         exit_code=1)


def record_step(build, *, inputs, input_dtypes=None, target="classes", optimizer="adamw", lr=1e-3,
                impl="foreach", weight_decay=None, momentum=0.0, steps=2, amp=None, checkpoint=None,
                zero_grad="set-to-none", build_kwargs=None, dist=None, world_size=8,
                ddp_kwargs=None, fsdp_blocks="auto", **options):
    """Records `steps` training steps of build(**build_kwargs); returns the
    Recording (save it with .save(path)). `inputs`: shapes; input_dtypes:
    their dtypes (default float32). `dist`: "fsdp" (FSDP2's fully_shard on
    each block of `fsdp_blocks`, then the root) or "ddp"
    (DistributedDataParallel(model, **ddp_kwargs)), rank 0 of `world_size`
    on a fake process group (see distributed.py); the inputs are that rank's.
    Other options as Recording's."""
    if dist is not None:
        from . import distributed
        if dist not in ("fsdp", "ddp"):
            raise ValueError(f"dist {dist!r}: fsdp or ddp")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise UsageError(f"--world-size {world_size}: the number of ranks, 1 or more (default 8)")
        ok, why = distributed.available()
        if not ok:
            raise UsageError(f"--dist {dist}: {why}", exit_code=1)
        with distributed.fake_world(world_size):
            return _record_step(build, inputs, input_dtypes, target, optimizer, lr, impl, weight_decay,
                                momentum, steps, amp, checkpoint, zero_grad, build_kwargs, dist,
                                world_size, ddp_kwargs, fsdp_blocks, options)
    return _record_step(build, inputs, input_dtypes, target, optimizer, lr, impl, weight_decay, momentum,
                        steps, amp, checkpoint, zero_grad, build_kwargs, None, 1, None, None, options)


def _record_step(build, inputs, input_dtypes, target, optimizer, lr, impl, weight_decay, momentum, steps,
                 amp, checkpoint, zero_grad, build_kwargs, dist, world_size, ddp_kwargs, fsdp_blocks,
                 options):
    build_kwargs = build_kwargs or {}
    parse_target(target)  # before anything is built
    if not isinstance(steps, int) or steps < 1:
        raise UsageError(f"--steps {steps}: record at least 1 step (default 2)")
    input_dtypes = list(input_dtypes or [])
    if len(input_dtypes) > len(inputs):
        raise UsageError(f"--input-dtype: {len(input_dtypes)} dtypes for {len(inputs)} input(s); "
                         f"give one per --input, or one for all")
    while len(input_dtypes) < len(inputs):
        input_dtypes.append(input_dtypes[-1] if input_dtypes else torch.float32)
    if isinstance(amp, str) and amp not in AMP_DTYPES:
        raise UsageError(f"--amp {amp}: one of {', '.join(AMP_DTYPES)}")
    amp_dtype = DTYPES[amp] if isinstance(amp, str) else amp
    # "cuda" in the builder (model.cuda(), torch.arange(..., device="cuda"))
    # goes to meta, as inside the recording.
    with META, CudaToMeta() as to_meta:
        model = build(**build_kwargs)
    if not isinstance(model, nn.Module):
        name = getattr(build, "__name__", "BUILD")
        raise UsageError(f"BUILD: {name}() returned {type(model).__name__}, not an nn.Module: BUILD "
                         f"names the function that builds the model and returns it")
    model.train()
    rec = Recording(auto_phase=False, **options)
    r = rec.recorder
    rec.watch(model)
    meta = rec.meta
    meta.update(model=type(model).__name__, inputs=[list(s) for s in inputs],
                input_dtypes=[str(d).replace("torch.", "") for d in input_dtypes], target=target,
                optimizer=optimizer, optimizer_impl=impl, lr=lr, steps=steps,
                amp=str(amp_dtype).replace("torch.", "") if amp_dtype else None,
                zero_grad=zero_grad)
    if to_meta.mapped:
        meta["cuda_device_mapped"] = to_meta.mapped
    if checkpoint:
        cls, n = checkpoint_blocks(model, checkpoint)
        meta["checkpoint"] = f"{n} x {cls}"
    if dist == "fsdp":
        from . import distributed
        n = distributed.shard(model, fsdp_blocks)
        meta["dist"] = {"kind": "fsdp2", "world_size": world_size, "rank": 0,
                        "units": f"{n} blocks + root",
                        "reshard_after_forward": "fully_shard's default (blocks True, root False)"}
    elif dist == "ddp":
        meta["dist"] = {"kind": "ddp", "world_size": world_size, "rank": 0, **(ddp_kwargs or {})}
    params = []
    with rec:
        # The parameters and buffers, allocated as model.to("cuda") does
        # (one storage each, in module order, in nn.Module._apply).
        _to_empty_once(model, META)
        params = list(model.parameters())
        rec.mark("parameter", params + list(model.buffers()))
        runner = model
        if dist == "ddp":
            from . import distributed
            runner = distributed.wrap_ddp(model, rec, **(ddp_kwargs or {}))
        for n, b in model.named_buffers():
            ev = r.event_of(b)  # category parameter, op "buffer:NAME" (BatchNorm's running
            if ev is not None:  # statistics, a causal mask), as scripts/record_step.py labels them
                ev["label"] = f"buffer:{n}"
        meta["parameters"] = sum(p.numel() for p in params)  # whole (DTensor: logical) sizes
        xs = [torch.empty(s, dtype=d) for s, d in zip(inputs, input_dtypes)]
        rec.mark("input", xs)

        def probe():
            # The output's shape and dtype, from a forward nobody records.
            with rec.recorder.paused(), torch.no_grad():
                ctx = emu.autocast(amp_dtype) if amp_dtype else contextlib.nullcontext()
                with ctx:
                    o = pick_output(first_forward(lambda: model(*xs), rec, inputs, input_dtypes))[0]
                return o.shape, o.dtype

        emu = rec.emulation
        y, loss_fn = make_target(target, xs, probe)
        if y is not None:
            rec.mark("input", [y])
        opt = build_optimizer(optimizer, params, lr, impl, weight_decay, momentum)
        # What was recorded, as torch.optim holds it: momentum (SGD's state),
        # weight decay, foreach / fused change what step() allocates.
        meta["optimizer_options"] = optimizer_options(opt)
        meta["weight_decay"] = opt.defaults.get("weight_decay")
        if "momentum" in opt.defaults:
            meta["momentum"] = opt.defaults["momentum"]

        # The loop's names, out and loss: bound from one step to the next,
        # rebound by the next step's forward and loss, alive at the end. No
        # local name keeps a reference past its step (the picked logits are
        # a tensor of out, or out itself).
        held = {}

        def forward_and_loss(xs):
            """The loop's forward and loss, binding held["out"] (the last
            step's out dropped once the new one exists) and held["loss"]
            (the last loss dropped once the new one exists); returns the
            tensor the loss was taken of."""
            ctx = emu.autocast(amp_dtype) if amp_dtype else contextlib.nullcontext()
            with ctx:
                if r.step == 1:
                    held["out"] = first_forward(lambda: runner(*xs), rec, inputs, input_dtypes)
                else:
                    held["out"] = runner(*xs)
                r.set_phase("loss")
                out = held["out"]
                logits, path = pick_loss(out) if target == "none" else pick_output(out)
                del out
                if "loss_on" not in meta:
                    meta["loss_on"] = f"{path} [{', '.join(map(str, logits.shape))}] {str(logits.dtype)[6:]}"
                held["loss"] = loss_fn(logits, y)
            return logits

        def mark_output(logits):
            rec.mark("output", [logits, held["loss"]]
                     + [t for t in _leaves(held["out"]) if isinstance(t, torch.Tensor)])

        def loop_body(xs):
            r.set_phase("forward")
            logits = forward_and_loss(xs)
            mark_output(logits)
            del logits
            r.hook_graph(held["loss"].grad_fn)
            r.set_phase("backward")
            held["loss"].backward()
            rec.mark("gradient", [p.grad for p in params if p.grad is not None])
            r.set_phase("optimizer")
            opt.step()
            r.set_phase("zero_grad")
            if r.step == steps:
                # What is alive right before the last zero_grad: every model
                # state (vramlab estimate's model_states moment).
                meta["live_before_last_zero_grad"] = live_by_category(r)
            if zero_grad != "keep":
                opt.zero_grad(set_to_none=(zero_grad == "set-to-none"))

        for s in range(steps):
            r.step = s + 1
            loop_body(xs)
            r.set_phase("between")
        rec._keep = (model, opt, xs, y, held)  # alive after the block, as the user's are
        rec._runner = runner  # the DDP wrapper with --dist ddp (else the model)
    if dist is not None:
        meta["dist"].update(_dist_totals(dist, runner, params))
    # state['step']: on the CPU unless fused (then a 4-byte device allocation).
    for p in params:
        st = opt.state.get(p, {}).get("step")
        if st is not None and (st.device.type == "meta") != (impl == "fused"):
            meta["warning"] = f"state['step'] is on {st.device} with --{impl}"
    return rec


def first_forward(call, rec, inputs, input_dtypes):
    """call(), the model's first forward. A shape error PyTorch raises in it
    (on meta: often a decomposition's message, 80 lines down) is most often
    --input not matching the model: it becomes a RecordingError of one line
    with the original message, the --input shapes and the module that was
    running. Errors the user's own code raises keep their traceback."""
    try:
        return call()
    except (RuntimeError, IndexError, ValueError) as e:
        why = _shape_error(e, rec, inputs, input_dtypes)
        if why is None:
            raise
        raise RecordingError(why) from e


_SHAPE_WORDS = ("shape", "size", "dim", "channel", "must match", "expected input", "Expected input")


def _shape_error(e, rec, inputs, input_dtypes):
    if type(e) not in (RuntimeError, IndexError, ValueError) or explain_error(e) is not None:
        return None  # NotImplementedError, the CUDA driver's, ...: explain_error's
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if not any(w in text for w in _SHAPE_WORDS) or not _raised_by_torch(e):
        return None
    mod = None
    tb = e.__traceback__
    while tb is not None:  # the innermost module whose forward was running
        f = tb.tb_frame
        if f.f_code.co_name == "_call_impl" and isinstance(f.f_locals.get("self"), nn.Module):
            mod = f.f_locals["self"]
        tb = tb.tb_next
    shapes = " ".join(f"--input {','.join(map(str, s))} ({str(d).replace('torch.', '')})"
                      for s, d in zip(inputs, input_dtypes))
    name = rec.names.get(mod) if mod is not None else None
    in_mod = f" in module {name!r} ({type(mod).__name__})" if mod is not None else ""
    at = _user_frame(e.__traceback__)
    return (f"the model's first forward failed with {shapes}{in_mod and ','}{in_mod}{f' at {at}' if at else ''}: "
            f"{type(e).__name__}: {text.rstrip('.')}; check --input (and --input-dtype) against what the model's "
            f"forward takes")


def _raised_by_torch(e):
    """Whether PyTorch raised e (its Python code, or a C++ op called from
    anywhere), not a `raise` in the user's code."""
    import linecache
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    fn = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    if "/torch/" in fn:
        return True
    if isinstance(e, ValueError):
        return False  # raised in Python, by the user's code
    return not linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip().startswith("raise")


def _dist_totals(dist, runner, params):
    """What the summary says of a --dist run (after the recording, so the
    meta tensors made here are not in it): DDP's buckets as they are at the
    end (the rebuilt ones from step 2), FSDP2's shards on this rank."""
    if dist == "ddp":
        from . import distributed
        sizes = distributed.bucket_sizes(runner)
        out = {"buckets": len(sizes), "bucket_bytes": sum(sizes), "bucket_sizes": sizes}
        if getattr(runner, "find_unused_parameters", False):
            # The reducer's used-parameter map on the device: an int32 per
            # parameter that gets a gradient.
            out["used_map_bytes"] = 4 * sum(1 for p in params if p.requires_grad)
        return out
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    return {"sharded_parameter_bytes": sum(t.numel() * t.element_size() for t in local),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in params)}


def live_by_category(r):
    """Live bytes by category (roles that distributed.py sets apart, as
    "category/role")."""
    out = {}
    for ev in [e for e, _ in r.live.values()] + list(r.synthetic.values()):
        k = ev.get("category", "temporary") + (f"/{ev['role']}" if ev.get("role") else "")
        out[k] = out.get(k, 0) + ev["size"]
    return dict(sorted(out.items()))


def _to_empty_once(model, device):
    """model.to_empty(device=device), but a tensor reached twice (a tied
    weight: GPT-2's lm_head and wte) gets one storage, as model.to("cuda")
    gives it: there the second visit finds it on the device already and
    allocates nothing, while to_empty would allocate a second storage and
    free the first (a transient copy, and the weight's storage moved to the
    last module's turn)."""
    made = {}

    def fn(t):
        if id(t.untyped_storage()) in made:
            return t.detach()
        new = torch.empty_like(t, device=device)
        made[id(new.untyped_storage())] = new
        return new
    model._apply(fn)
    made.clear()


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        res = []
        for o in out:
            res.extend(_leaves(o))
        return res
    return []
