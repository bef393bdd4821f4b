#!/usr/bin/env python3
"""Records the device-memory allocations and frees of PyTorch's own training
step, as a JSON Lines trace that `vramlab replay TRACE` runs through its copy
of the CUDA caching allocator. No GPU and no memory: the tensors are on
PyTorch's meta device (shapes, no data), so gpt2-xl records in seconds.

    python scripts/record_step.py gpt --preset gpt2 --batch 8 --seq-len 512 \\
        --optimizer adamw --optimizer-impl foreach --steps 2 --out FILE
    python scripts/record_step.py gpt --layers 2 --heads 2 --dim 64 --vocab 1000 \\
        --seq-len 32 --batch 2 --optimizer adam --weight-decay 0.01 --out FILE
    python scripts/record_step.py mlp|simple-cnn|resnet-mini|attention|resnet50 ...

Trace lines: {"op":"alloc","id":7,"size":1200,"label":"aten.mm.default",
"category":"activation","phase":"forward","step":1,"where":"h.0.attn.q_proj"}
and {"op":"free","id":7}. size is the storage's nbytes (what the caching
allocator is asked for); label the aten op whose output it is (or
"parameter", "buffer:NAME", "input"). phase, step and where are for reading
(replay ignores them): phase is setup, forward, loss, backward, optimizer or
zero_grad; where is the module whose forward ran the op, or in
backward the autograd node running (torch._C._current_autograd_node()).
category: parameter; input; output (the logits and the loss, which the user
holds); activation (any other forward/loss allocation alive when backward
starts); gradient (a backward allocation that ends as some p.grad);
optimizer_state (an optimizer-step allocation alive after the step);
temporary (the rest).

The step, exactly the PyTorch user's training loop:

    for step in range(steps):                      # --steps (default 2)
        logits = model(x)                          # the last step's logits freed here
        loss = F.cross_entropy(logits.view(-1, V), y.view(-1))   # the last loss freed here
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    # logits and loss are still bound

The loop's names hold logits and loss from one step to the next: the old
logits die where `logits = model(x)` rebinds the name, after the new ones
exist (in the next step's forward), the old loss where the new one is bound,
and the last step's are alive at the end of the trace. This is the step
vramlab's trainer runs (crates/engine/src/train/step.rs); a function
`def train_step(x, y)` would free them at its return instead, lowering what
is alive between steps and at the end by their size. With --loss
chunked[:ROWS] (gpt) the first two lines are instead

        h = model.features(x)                      # ln_f's output, held likewise
        loss = F.linear_cross_entropy(h, model.wte.weight, y.view(-1),
            options=torch.nn.LinearCrossEntropyOptions(batch_chunk_size=ROWS))

(the old h freed after model.features returns, the old loss after the new
one exists; both lines are the forward phase: the head runs in the loss).

PyTorch 2.15's chunked path, a custom op: on meta it would run its fake
kernel (four empty outputs), so the recorder runs its Python body instead,
as CUDA does, and records every aten op of it. Before the first step the trace allocates
the parameters (model.parameters() order), the buffers (the GPT's causal
mask, [1, 1, P, P] f32; --skip-buffers leaves them out), then x and y. The
model is built on the meta device before recording, so its init ops are not
recorded. What is alive after the last step (parameters, buffers, inputs,
optimizer state, the loop's logits and loss) is left alive: the trace ends
without freeing it. The recorder binds the loop's names as items of a dict
(`held["logits"] = model(x)`: the old value is dropped after the new one
exists, as a name's rebinding drops it), and nothing else keeps a reference
to them.

How. The recorder is vramlab_torch's (python/vramlab_torch/recorder.py,
imported from python/ in this repository: no install needed), without
its CUDA emulation (no autocast, SDPA choice or cuBLAS / cuDNN workspaces:
these traces are the storages PyTorch's own step asks for). A
TorchDispatchMode sees every aten op below autograd (composite ops
already decomposed, as on CUDA). After an op returns, each output tensor's
untyped_storage() not seen before is an allocation; views and in-place ops
return known storages and allocate nothing. A weakref on the storage's
Python object (PyTorch keeps one per StorageImpl, alive exactly as long as
it) emits the free when the storage dies, which under CPython's reference
counting is the moment its last tensor goes; the recorder holds only ids,
sizes and weakrefs. Cyclic gc is off while recording (a gc.collect() at the
end checks that nothing waited on a cycle). Zero-byte storages are left out:
the allocator is never asked for them.

CUDA-vs-meta rules (the trace is what CUDA would allocate):
  * Device = meta, host = CPU. The model, x, y and everything created under
    the step's `with torch.device("meta")` are meta (as a CUDA user's would
    be CUDA); tensors PyTorch deliberately puts on the CPU stay real CPU
    tensors and are not written: without fused=True (capturable=False),
    Adam/AdamW's state['step'] (`torch.tensor(0.0, device="cpu")`) and the
    `torch.tensor(1.0, device="cpu")` _multi_tensor_adam adds to it. With
    fused=True the step is `torch.zeros((), device=p.device)`: a 4-byte
    device allocation, kept. The run checks each state['step'] against this.
    PyTorch lists no fused kernels for meta, so "meta" is added to
    torch.optim's fused-device list; _fused_adam(w)_ have meta kernels,
    _fused_sgd_ has none and is skipped (it only mutates its arguments).
  * Gradient accumulation in autograd's InputBuffer (several gradients for
    one tensor, e.g. at each residual branch): CUDA adds the new gradient in
    place into the buffered one when that is dense and nothing else holds it
    or its storage, else allocates old + new. PyTorch refuses the in-place
    path for any tensor "subclass-like", which meta tensors and every tensor
    while a dispatch mode is active are (at::isTensorSubclassLike). The
    recorder restores CUDA's choice: an aten.add.Tensor that the engine runs
    between two nodes (node pre/post hooks mark the nodes' own ops) is done
    in place when CUDA's conditions hold. The reference counts are judged
    relative to a self-test at start-up that compares, on real CPU tensors
    without any mode, PyTorch's own choice in three cases (in place; a
    gradient held twice; a gradient that is a view); the run stops if they
    disagree. --no-inplace-accumulation records PyTorch's behaviour under a
    mode instead (always old + new: one extra allocation per accumulation).
  * Only op outputs are seen, not scratch a kernel allocates and frees
    inside itself on CUDA: cuBLAS's workspace (allocated through the caching
    allocator once per handle and stream and kept), cuDNN convolution
    workspaces, embedding_dense_backward's sort buffers, LayerNorm
    backward's partial sums for large inputs.
  * Composite ops that choose by device: dropout (the GPT calls
    native_dropout itself, as CUDA runs it) and BatchNorm (here
    native_batch_norm: output, save_mean, save_invstd; CUDA with cuDNN runs
    cudnn_batch_norm, which also returns a reserve-space tensor, not
    modelled). A multi-output op's outputs are allocated in output order
    (convolution_backward: grad_input, grad_weight, grad_bias; cuDNN's
    order is not checked).
  * Token ids: x is int64 [B, S] by default (the PyTorch user's ids; the
    model's x.long() is then a no-op); --x-dtype float32 gives vramlab's
    f32 ids, and x.long() then copies them to int64 in the forward. Labels y
    are int64 [B*S] (gpt) or [B].

Checked: --check-cpu runs the same steps on real CPU tensors with no mode
and compares the CPU allocator's events (torch.profiler, profile_memory)
with the trace: equal, event for event, for gpt (with dropout and f32 ids
too), mlp and attention under every optimizer and implementation, once the
CPU kernels' own scratch and the 8-byte-or-smaller events are set aside.
Convolutions differ on the CPU (mkldnn) and cannot be checked this way.
"""

import argparse
import gc
import importlib.util
import json
import os
import sys
import time
import types
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# The recorder: vramlab_torch, from this repository's python/.
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
if importlib.util.find_spec("safetensors") is None:
    # The reference scripts import it at the top; nothing here uses it.
    _st = types.ModuleType("safetensors")
    _st.torch = types.ModuleType("safetensors.torch")
    for _n in ("save_file", "load_file", "safe_open"):
        setattr(_st.torch, _n, None)
    _st.safe_open = None
    sys.modules["safetensors"] = _st
    sys.modules["safetensors.torch"] = _st.torch

import gpt_reference  # noqa: E402
import resnet_reference  # noqa: E402
import torch_reference  # noqa: E402
import vramlab_torch.step as step_module  # noqa: E402
from vramlab_torch.recorder import META, Recorder, allow_fused_on_meta, self_test  # noqa: E402

torch.set_default_dtype(torch.float32)

# vramlab's GPT presets (crates/engine/src/nn/gpt.rs): layers, heads, dim, positions, vocab.
GPT_PRESETS = {
    "tiny": (2, 4, 64, 64, 96),
    "gpt2": (12, 12, 768, 1024, 50257),
    "gpt2-medium": (24, 16, 1024, 1024, 50257),
    "gpt2-large": (36, 20, 1280, 1024, 50257),
    "gpt2-xl": (48, 25, 1600, 1024, 50257),
}

import torch.nn.modules.linear_cross_entropy  # noqa: E402,F401  (registers the chunked op)

CHUNKED_LCE = torch.ops.torch_nn._linear_cross_entropy_batch_chunked.default


class StepRecorder(Recorder):
    """vramlab_torch's recorder (frames off, no workspaces), plus PyTorch
    2.15's chunked linear_cross_entropy run as CUDA runs it."""

    def __init__(self, accumulate):
        super().__init__(accumulate, frames=False)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is CHUNKED_LCE:
            return self.chunked_lce(args, kwargs or {})
        return super().__torch_dispatch__(func, types, args, kwargs)

    def chunked_lce(self, args, kwargs):
        """The chunked linear_cross_entropy custom op. On meta it would run
        its fake kernel (four empty outputs); on CUDA it runs its Python
        body, whose allocations are the point: run that body here, under
        this mode, so each of its aten ops is recorded. The CUDA-only
        branches of that body (mixed-dtype casts) differ from meta only for
        16-bit inputs; the GPT's head input and weight are f32."""
        import torch.nn.modules.linear_cross_entropy as lce
        if kwargs or any(isinstance(t, torch.Tensor) and t.dtype != torch.float32 for t in args[:2]):
            raise SystemExit("the chunked linear_cross_entropy is recorded for f32 inputs, positional arguments only")
        with self:
            lce._check_batch_chunked_grad_flags(*args[:4], *args[12:15])
            return lce._linear_cross_entropy_batch_chunked_accumulator(*args[:11], *args[12:15])


# -- the models -----------------------------------------------------------------

def build_model(a):
    """(model, x, y, sizes), created on the current default device."""
    if a.model == "gpt":
        layers, heads, dim, positions, vocab = GPT_PRESETS[a.preset or "tiny"]
        layers = a.layers or layers
        heads = a.heads or heads
        dim = a.dim or dim
        vocab = a.vocab or vocab
        seq = a.seq_len or positions
        positions = a.positions or (positions if a.preset else seq)
        if seq > positions:
            raise SystemExit(f"--seq-len {seq} is more than the {positions} positions")
        net = gpt_reference.Gpt(layers, heads, dim, positions, vocab, a.dropout)
        dtype = torch.int64 if a.x_dtype == "int64" else torch.float32
        x = torch.empty(a.batch, seq, dtype=dtype)
        y = torch.empty(a.batch * seq, dtype=torch.int64)
        return net, x, y, dict(layers=layers, heads=heads, dim=dim, positions=positions, vocab=vocab, seq=seq)
    if a.model == "resnet50":
        width, r, classes = a.width or 64, a.resolution or 224, a.classes or 1000
        net = resnet_reference.Resnet(50, width, classes)
        x = torch.empty(a.batch, 3, r, r)
        y = torch.empty(a.batch, dtype=torch.int64)
        return net, x, y, dict(width=width, resolution=r, classes=classes)
    cfg = dict(torch_reference.SMALL[a.model])
    net, input_shape, classes = torch_reference.build(a.model, cfg)
    x = torch.empty(a.batch, *input_shape)
    y = torch.empty(a.batch, dtype=torch.int64)
    return net, x, y, {k: v for k, v in cfg.items() if k not in ("batch", "lr_scale")}


def build_optimizer(a, params):
    """(the optimizer, its weight decay): vramlab_torch's, with torch.optim's
    defaults (AdamW 0.01, Adam and SGD 0)."""
    wd = a.weight_decay if a.weight_decay is not None else 0.01 if a.optimizer == "adamw" else 0.0
    return step_module.build_optimizer(a.optimizer, params, a.lr, a.optimizer_impl, wd, a.momentum), wd


def parse_loss(text):
    """--loss: (name, rows); rows None is PyTorch's own chunk size."""
    if text == "cross-entropy":
        return "cross-entropy", None
    if text == "chunked":
        return "chunked", None
    if text.startswith("chunked:") and text[8:].isdigit() and int(text[8:]) > 0:
        return "chunked", int(text[8:])
    raise argparse.ArgumentTypeError(f"--loss {text!r}: cross-entropy, chunked or chunked:ROWS (ROWS >= 1)")


def forward_and_loss(a, model, x, y, held, phase=None):
    """The loop's first two statements, binding its names as items of
    `held`: held["logits"] = model(x), then held["loss"] =
    F.cross_entropy(...); or with --loss chunked held["h"] (the head's
    input) and PyTorch 2.15's chunked F.linear_cross_entropy over the tied
    head. An item's assignment drops the last step's value after the new
    one exists, where the loop's rebinding of the name drops it; no local
    name keeps a reference. phase("loss") is called between the two
    (cross-entropy only: the chunked loss runs the head)."""
    name, rows = a.loss
    if name == "chunked":
        if a.model != "gpt":
            raise SystemExit("--loss chunked needs gpt (its head is the bias-free tied embedding)")
        held["h"] = model.features(x)
        opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=rows)
        held["loss"] = F.linear_cross_entropy(held["h"], model.wte.weight, y.view(-1), options=opts)
        return
    held["logits"] = model(x)
    if phase is not None:
        phase("loss")
    held["loss"] = F.cross_entropy(held["logits"].view(-1, held["logits"].shape[-1]), y.view(-1))


def record(a, accumulate):
    allow_fused_on_meta()
    with META:
        model, x, y, sizes = build_model(a)
    model.train()
    opt, wd = build_optimizer(a, model.parameters())
    rec = StepRecorder(accumulate)
    names = {m: n for n, m in model.named_modules()}
    params = list(model.parameters())

    for p in params:
        rec.add(p.untyped_storage(), "parameter", "parameter")
    for n, b in model.named_buffers():
        if a.skip_buffers:
            rec.add_quiet(b.untyped_storage())
        elif not rec.known(b.untyped_storage()):
            rec.add(b.untyped_storage(), f"buffer:{n}", "parameter")
    rec.add(x.untyped_storage(), "input", "input")
    rec.add(y.untyped_storage(), "input", "input")

    # Categories of what the ending phase allocated, by what is alive now
    # (Recorder.set_phase), and set by hand (Recorder.mark).
    phase, mark = rec.set_phase, rec.mark

    # The loop's names, logits (or h) and loss: bound from one step to the
    # next, rebound by the next step's forward and loss, alive at the end.
    held = {}

    def loop_body():
        phase("forward")
        forward_and_loss(a, model, x, y, held, phase)
        mark("output", list(held.values()))
        rec.hook_graph(held["loss"].grad_fn)
        phase("backward")
        held["loss"].backward()
        mark("gradient", [p.grad for p in params if p.grad is not None])
        phase("optimizer")
        opt.step()
        phase("zero_grad")
        opt.zero_grad(set_to_none=True)

    def pre(mod, _args):
        rec.modules.append(names.get(mod) or type(mod).__name__)

    def post(mod, _args, _out):
        rec.modules.pop()

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(post)
    gc.collect()
    gc.disable()
    t0 = time.perf_counter()
    try:
        with META, rec:
            for s in range(a.steps):
                rec.step = s + 1
                loop_body()
                phase("between")
    finally:
        gc.enable()
        h1.remove()
        h2.remove()
    seconds = time.perf_counter() - t0
    n_events = len(rec.events)
    gc.collect()
    if len(rec.events) != n_events:
        raise SystemExit(f"{len(rec.events) - n_events} storages were freed only by the cyclic garbage collector")
    rec.on = False
    for ev in rec.events:
        if ev["op"] == "alloc":
            ev.setdefault("category", "temporary")

    # state['step']: on the CPU unless fused (then a 4-byte device allocation).
    for p in params:
        step = opt.state.get(p, {}).get("step")
        if step is not None and (step.device.type == "meta") != (a.optimizer_impl == "fused"):
            raise SystemExit(f"state['step'] is on {step.device} with --optimizer-impl {a.optimizer_impl}")
    meta = dict(model=a.model, batch=a.batch, loss=a.loss[0] + (f":{a.loss[1]}" if a.loss[1] else ""),
                optimizer=a.optimizer, optimizer_impl=a.optimizer_impl,
                lr=a.lr, weight_decay=wd, steps=a.steps, torch=torch.__version__, **sizes)
    if a.optimizer == "sgd":
        meta["momentum"] = a.momentum
    inplace = sum(1 for ok, _ in rec.accumulations if ok)
    meta["accumulations"] = f"{inplace} of {len(rec.accumulations)} in place"
    return rec.events, seconds, meta


def check_cpu(a, events):
    """The same steps on real CPU tensors, no mode, under torch.profiler's
    memory events (the CPU allocator's allocations and frees, in order).
    Left out of the CPU's list: kernel scratch (freed inside the op that
    allocated it; an empty/resize_ called by an op counts as that op).
    Left out of both: events of 8 bytes or less (the CPU's host scalars,
    which a CUDA run keeps on the CPU too, can't be told from the trace's
    4-byte tensors). The rest must be equal, event for event (alloc/free
    and bytes). A model with convolutions cannot pass (the CPU's mkldnn
    convolutions allocate otherwise). Returns (ok, a line to print)."""
    import difflib

    import torch.profiler as profiler
    from torch._C._profiler import _EventType
    torch.manual_seed(0)
    model, x, y, _ = build_model(a)
    if x.dtype == torch.int64:
        x.random_(0, 2)
    else:
        x.normal_()
    y.random_(0, 2)
    model.train()
    opt, _ = build_optimizer(a, model.parameters())

    # The same loop: logits (or h) and loss held across steps, and still
    # alive when the profiler stops (the trace does not free them either).
    held = {}
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(a.steps):
            forward_and_loss(a, model, x, y, held)
            held["loss"].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    factories = ("aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_")

    def op(e, alloc):  # the innermost aten op around an allocation event
        e = e.parent
        while e is not None and not e.name.startswith("aten::"):
            e = e.parent
        while alloc and e is not None and e.name in factories and e.parent is not None \
                and e.parent.name.startswith("aten::"):
            e = e.parent
        return None if e is None else (e.name, e.start_time_ns)

    found, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        e = todo.pop()
        if e.typed[0] == _EventType.Allocation:
            size = e.extra_fields.alloc_size
            found.append((e.start_time_ns, e.extra_fields.ptr, size, op(e, size > 0)))
        todo.extend(e.children)
    cpu, live = [], {}
    for _, ptr, size, where in sorted(found, key=lambda f: f[0]):
        if size > 0:
            live[ptr] = len(cpu)
            cpu.append(["alloc", size, where, False])
        elif ptr in live:
            alloc = cpu[live.pop(ptr)]
            scratch = where is not None and where == alloc[2]
            alloc[3] = scratch
            cpu.append(["free", alloc[1], where, scratch])
    cpu = [f"{c[0]} {c[1]}" for c in cpu if not c[3]]
    sizes, ours = {}, []
    for ev in events:
        if ev["op"] == "alloc":
            sizes[ev["id"]] = (ev["size"], ev["phase"])
        size, phase = sizes[ev["id"]]
        if phase != "setup":
            ours.append(f"{ev['op']} {size}")
    # Host scalars: 8 bytes or less, left out of both lists (the trace's
    # 4-byte device tensors, the loss and such, with them).
    cpu = [e for e in cpu if int(e.split()[1]) > 8]
    ours = [e for e in ours if int(e.split()[1]) > 8]
    if cpu != ours:
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, cpu, ours, autojunk=False).get_opcodes():
            if tag != "equal":
                return False, (f"check-cpu: differs from the CPU run at the trace's event {j1} (after setup, "
                               f"over 8 bytes): trace {ours[j1:j2][:6]}, CPU {cpu[i1:i2][:6]}")
    return True, (f"check-cpu: ok, the trace's {len(ours)} events over 8 bytes (after setup) are "
                  f"the CPU run's, less its kernel scratch")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=["gpt", "resnet50"] + list(torch_reference.SMALL))
    p.add_argument("--preset", choices=list(GPT_PRESETS), help="gpt: vramlab's GPT sizes (default: tiny's)")
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--dim", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--seq-len", type=int, help="gpt: tokens per sample (default: the positions)")
    p.add_argument("--positions", type=int,
                   help="gpt: rows of wpe and of the mask (default: the preset's, else --seq-len)")
    p.add_argument("--dropout", type=float, default=0.0, help="gpt: dropout probability (native_dropout)")
    p.add_argument("--x-dtype", choices=["int64", "float32"], default="int64", help="gpt: the token ids' dtype")
    p.add_argument("--width", type=int, help="resnet50: stem width (64)")
    p.add_argument("--resolution", type=int, help="resnet50: image side (224)")
    p.add_argument("--classes", type=int, help="resnet50: classes (1000)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adamw")
    p.add_argument("--optimizer-impl", choices=["foreach", "for-loop", "fused"], default="foreach")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, help="default: adamw 0.01, adam and sgd 0")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd")
    p.add_argument("--loss", type=parse_loss, default=("cross-entropy", None),
                   help="cross-entropy (F.cross_entropy over the logits, the default), chunked or "
                        "chunked:ROWS (gpt: F.linear_cross_entropy over the tied head with "
                        "LinearCrossEntropyOptions(batch_chunk_size=ROWS))")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--skip-buffers", action="store_true", help="leave the model's buffers out of the trace")
    p.add_argument("--no-inplace-accumulation", action="store_true",
                   help="record autograd's gradient accumulation as PyTorch does it under a mode "
                        "(always old + new), not as CUDA does")
    p.add_argument("--check-cpu", action="store_true",
                   help="also run the steps on real CPU tensors without any mode and check the trace "
                        "against the CPU allocator's events (small models only: it computes)")
    p.add_argument("--out", required=True, help="the trace (JSON Lines)")
    a = p.parse_args()
    if a.model != "gpt" and (a.preset or a.layers or a.heads or a.dim or a.vocab or a.seq_len):
        raise SystemExit("--preset/--layers/--heads/--dim/--vocab/--seq-len are gpt's")
    accumulate = (-1, -1) if a.no_inplace_accumulation else self_test()
    events, seconds, meta = record(a, accumulate)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        for ev in events:
            f.write(json.dumps(ev, separators=(",", ":")) + "\n")
    allocs = sum(1 for e in events if e["op"] == "alloc")
    print(f"{a.out}: {len(events)} events ({allocs} allocations), recorded in {seconds:.2f} s; {json.dumps(meta)}")
    if a.check_cpu:
        ok, line = check_cpu(a, events)
        print(line)
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
