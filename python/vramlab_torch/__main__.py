"""python -m vramlab_torch record BUILD [options] --out STEP.pickle"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time
import warnings

NOT_SEEN = """\
What a recording on meta tensors cannot see (not in the file):
  * the CUDA context, cuBLAS/cuDNN handles and loaded kernels: memory the
    driver takes outside the caching allocator, typically 0.3-1 GiB per GPU
    and process (what nvidia-smi shows beyond torch.cuda.memory_reserved());
  * scratch a kernel allocates and frees inside itself: flash /
    memory-efficient / cuDNN attention backward's accumulators,
    embedding backward's sort buffers, LayerNorm backward's partial sums,
    NCCL's own buffers (with --dist, FSDP2's and DDP's buffers are recorded);
  * cudnn_batch_norm's reserve space (CUDA runs BatchNorm through cuDNN;
    meta runs native_batch_norm);
  * ops whose memory depends on values (nonzero, masked_select, unique:
    meta guesses their sizes or refuses);
  * GradScaler's few scalars (torch.amp.GradScaler("cuda") is disabled
    without a GPU; the unscaled step is recorded).
Added by rule (--cublas-workspace, default auto): cuBLAS/cuBLASLt
workspaces, as PyTorch allocates them through the caching allocator
(labelled category "workspace"; the run prints what it added).
Added by a fitted rule (--cudnn-workspace, default auto): cuDNN
convolution workspaces, one per convolution call, freed after it; their
real sizes depend on the algorithm cuDNN picks on the GPU: the rule was
fitted on an H200 (PyTorch 2.11, cuDNN 9.19, fp32).
Emulated: CUDA's SDPA backend choice (--sdpa), CUDA's autocast policy
(--amp, and torch.autocast("cuda") inside record()) and dropout's 1-byte
mask (native_dropout, as CUDA runs nn.Dropout); "cuda" in your code
(device="cuda", .cuda(), .to("cuda")) goes to the recording's meta device.
Recorded as meta runs them, not as CUDA does (the run warns):
nn.MultiheadAttention and the nn.Transformer* layers (their attention
matrix, where CUDA's fused SDPA keeps none), nn.RNN / LSTM / GRU (not
cuDNN's fused RNN)."""


PROG = "python -m vramlab_torch"
# --amp's spellings (step.AMP_DTYPES, without importing PyTorch for --help).
AMP_CHOICES = ("bf16", "bfloat16", "fp16", "f16", "float16", "half")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage is in --help)."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def fail(message, code=2):
    """A usage (2) or runtime (1) error of the command, on one line."""
    sys.stderr.write(f"{PROG} record: error: {message}\n")
    sys.exit(code)


def _positive_int(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, 1 or more")
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: record at least 1 step (default 2)")
    return n


def parse_capability(text):
    """"9.0" -> (9, 0) ("9" -> (9, 0)); None where it is not MAJOR.MINOR."""
    parts = text.strip().split(".")
    if len(parts) > 2 or not all(x.isdigit() for x in parts):
        return None
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)


def parse_args(argv):
    p = _Parser(
        prog=PROG,
        description="Record the GPU memory a PyTorch training step would use, without a GPU, "
                    "as a PyTorch memory snapshot for `vramlab replay` and pytorch.org/memory_viz.",
        epilog=f"{PROG} record --help: the options, and what a recording on meta tensors cannot see.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser(
        "record", help="record training steps of a model built by FILE.py:FUNCTION",
        description="Builds the model with BUILD (FILE.py:FUNCTION or MODULE:FUNCTION; it returns an "
                    "nn.Module and is called under torch.device('meta'), so nothing is allocated), "
                    "then records --steps training steps (forward, loss, backward, optimizer.step(), "
                    "zero_grad) on meta tensors, as a training loop runs them: the loop's out and loss "
                    "are held until the next step rebinds them, and the last ones are alive at the end.",
        epilog=NOT_SEEN, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("build", metavar="BUILD", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    r.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for BUILD (VALUE as JSON if it parses, else a string); repeatable")
    r.add_argument("--input", action="append", required=True, metavar="SHAPE",
                   help="an input's shape, e.g. 32,3,224,224; repeat for several positional inputs")
    r.add_argument("--input-dtype", action="append", default=[], metavar="DTYPE",
                   help="float32 (default), float16 (fp16), bfloat16 (bf16), int64 (token ids), int32, "
                        "bool; one per --input or one for all")
    r.add_argument("--vocab", type=int, help="token inputs: the vocabulary size (recorded in the "
                   "metadata; values are never read on meta)")
    r.add_argument("--target", default="classes",
                   help="classes[:N] (int64 [batch], cross entropy; default; N, if given, is the output's "
                        "last dimension), tokens (int64 shaped like "
                        "the first input, cross entropy over the output's last dimension), same (MSE "
                        "against a tensor shaped like the output) or none (the output's sum)")
    r.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adamw")
    r.add_argument("--lr", type=float, default=1e-3)
    r.add_argument("--weight-decay", type=float, help="default: adamw 0.01, adam and sgd 0")
    r.add_argument("--momentum", type=float, help="--optimizer sgd: momentum (default 0, torch.optim's)")
    impl = r.add_mutually_exclusive_group()
    impl.add_argument("--foreach", dest="impl", action="store_const", const="foreach",
                      help="the optimizer's foreach implementation (default)")
    impl.add_argument("--for-loop", dest="impl", action="store_const", const="for-loop")
    impl.add_argument("--fused", dest="impl", action="store_const", const="fused")
    r.set_defaults(impl="foreach")
    r.add_argument("--steps", type=_positive_int, default=2, help="training steps to record (default 2)")
    r.add_argument("--amp", choices=AMP_CHOICES, metavar="bf16|fp16",
                   help="autocast the forward and loss to this dtype with CUDA's policy (also "
                        "bfloat16, f16, float16, half)")
    r.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing (torch.utils.checkpoint, non-reentrant) on the model's "
                        "repeated blocks (the largest nn.ModuleList / nn.Sequential of one class)")
    r.add_argument("--checkpoint-class", metavar="NAME", help="checkpoint every module of this class instead")
    r.add_argument("--dist", choices=["fsdp", "ddp"],
                   help="record rank 0 of a data-parallel run on a fake process group (no GPU, no "
                        "communication): fsdp = FSDP2's fully_shard on each repeated block (the largest "
                        "nn.ModuleList / nn.Sequential of one class, or --fsdp-blocks) and the root; ddp = "
                        "DistributedDataParallel. The inputs are one rank's (its batch)")
    r.add_argument("--world-size", type=int, help="--dist: the number of ranks (default 8)")
    r.add_argument("--fsdp-blocks", metavar="CLASS",
                   help="--dist fsdp: fully_shard every module of this class (default: the repeated blocks)")
    r.add_argument("--bucket-cap-mb", type=float, help="--dist ddp: DDP's bucket_cap_mb (default 25)")
    r.add_argument("--bucket-view", action="store_true",
                   help="--dist ddp: gradient_as_bucket_view=True")
    r.add_argument("--find-unused", action="store_true",
                   help="--dist ddp: find_unused_parameters=True")
    r.add_argument("--zero-grad", choices=["set-to-none", "zero", "keep"], default="set-to-none")
    r.add_argument("--sdpa", choices=["auto", "cudnn", "flash", "efficient", "math"], default="auto",
                   help="F.scaled_dot_product_attention's backend: auto = what CUDA picks on --capability "
                        "(8.x: flash, else memory-efficient, else math; 9.x and 10.x with PyTorch 2.11 or "
                        "later: cuDNN attention first, as PyTorch does with a cuDNN newer than 9.15); "
                        "math = meta's own")
    r.add_argument("--cublas-workspace", choices=["auto", "per-op", "cached", "off"], default="auto",
                   help="add cuBLAS workspaces by PyTorch's rule: per-op (PyTorch 2.15's default: one "
                        "workspace per GEMM, freed after it), cached (TORCH_CUBLAS_WORKSPACE_CACHE=1 and "
                        "PyTorch before 2.15: one per thread and stream, kept), off; auto picks by the "
                        "installed PyTorch and the environment")
    r.add_argument("--cudnn-workspace", choices=["auto", "fitted-h200", "transform", "off"], default="auto",
                   help="add cuDNN convolution workspaces (allocated before each convolution's kernel, freed "
                        "after it): fitted-h200 = the rule fitted on an H200 with PyTorch 2.11 / cuDNN 9.19 "
                        "(layout copies of input, output and weight, a GEMM path for large 1x1 convolutions, "
                        "split-K partial sums in the weight gradient); transform = the layout copies only; "
                        "off; auto = fitted-h200 unless torch.backends.cudnn.enabled is off")
    r.add_argument("--capability", default="9.0",
                   help="the GPU's compute capability, for the cuBLAS workspace size (default 9.0, "
                        "Hopper: 32 MiB; before 9.0: 8 MiB + 128 KiB) and the SDPA backend")
    r.add_argument("--segments", choices=["simulate", "none"], default="simulate",
                   help="pickle: simulate the caching allocator's segments and addresses (default), or "
                        "give each allocation a fresh address and write no segments")
    r.add_argument("--no-frames", action="store_true", help="leave the Python stacks out (smaller files)")
    r.add_argument("--short-paths", action="store_true",
                   help="frames name files without the machine's part (torch/nn/modules/linear.py, paths "
                        "relative to the working directory): for files to commit or share")
    r.add_argument("--no-inplace-accumulation", action="store_true",
                   help="record autograd's gradient accumulation as PyTorch does it under a dispatch mode "
                        "(always old + new), not as CUDA does")
    r.add_argument("--format", choices=["pickle", "jsonl"],
                   help="pickle: PyTorch memory snapshot (default); jsonl: vramlab's JSON Lines trace "
                        "(default when --out ends in .jsonl)")
    r.add_argument("--out", required=True, metavar="FILE",
                   help="the file to write (its directory must exist)")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return p.parse_args(argv)


def _check_dist(a):
    """--dist's options against --dist: one line, exit 2."""
    if a.world_size is not None:
        if a.world_size < 1:
            fail(f"--world-size {a.world_size}: the number of ranks, 1 or more (default 8)")
        if a.dist is None:
            fail(f"--world-size {a.world_size}: with --dist fsdp or --dist ddp (a run without --dist "
                 f"is one GPU)")
    if a.fsdp_blocks is not None and a.dist != "fsdp":
        fail(f"--fsdp-blocks {a.fsdp_blocks}: with --dist fsdp"
             + (" (DDP wraps the whole model)" if a.dist == "ddp" else ""))
    given = [f for f, on in (("--bucket-cap-mb", a.bucket_cap_mb is not None),
                             ("--bucket-view", a.bucket_view), ("--find-unused", a.find_unused)) if on]
    if given and a.dist != "ddp":
        fail(f"{', '.join(given)}: DDP's options, with --dist ddp"
             + (" (FSDP2 has no buckets)" if a.dist == "fsdp" else ""))
    if a.bucket_cap_mb is not None and not a.bucket_cap_mb > 0:
        fail(f"--bucket-cap-mb {a.bucket_cap_mb:g}: DDP's bucket size cap in MiB, more than 0 (default 25)")
    if a.dist is not None:
        a.world_size = 8 if a.world_size is None else a.world_size
        a.fsdp_blocks = "auto" if a.fsdp_blocks is None else a.fsdp_blocks


def _check_out(path):
    """--out before anything is recorded (a recording can take minutes): a
    file, in a directory that exists (not made: a mistyped path would be
    made silently), writable. Checked without touching the path itself: a
    link is not followed into a new file, a FIFO is not opened."""
    if os.path.isdir(path):
        fail(f"--out {path}: a directory; give the file to write, e.g. --out "
             f"{os.path.join(path, 'step.pickle')}")
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        fail(f"--out {path}: no directory {d}; create it first or give another path")
    if os.path.exists(path):
        # An existing file, device or FIFO (a link followed) is written in place.
        if not os.access(path, os.W_OK):
            fail(f"--out {path}: cannot write it (permission denied); give a path you can write")
        return
    # A new file (or a dangling link's target): one can be made beside it.
    where = os.path.dirname(os.path.realpath(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=".vramlab-torch-check-", dir=where)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        fail(f"--out {path}: cannot write it ({e.strerror or e}); give a path you can write")


def _value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def human(n):
    from .session import human_bytes
    return human_bytes(n)


def main(argv=None):
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    a = parse_args(sys.argv[1:] if argv is None else argv)
    cap = parse_capability(a.capability)
    if cap is None:
        fail(f"--capability {a.capability!r}: the GPU's compute capability as MAJOR.MINOR, e.g. 9.0 "
             f"(H100, H200), 8.0 (A100), 8.6 (RTX 30xx), 8.9 (L4, RTX 40xx), 10.0 (B200)")
    kwargs = {}
    for kv in a.arg:
        if "=" not in kv:
            fail(f"--arg {kv!r}: KEY=VALUE, e.g. --arg width=64")
        k, v = kv.split("=", 1)
        kwargs[k] = _value(v)
    _check_dist(a)
    if a.momentum is not None and a.optimizer != "sgd":
        fail(f"--momentum {a.momentum:g}: SGD's, with --optimizer sgd (Adam and AdamW have betas)")
    _check_out(a.out)

    from . import step as step_mod
    from .session import RecordingWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecordingWarning)  # said in the summary, from the metadata
        return _main(a, step_mod, kwargs, cap)


def _main(a, step_mod, kwargs, cap):
    from .session import RecordingError, UsageError, explain_error
    try:
        inputs = [step_mod.parse_shape(s) for s in a.input]
        step_mod.parse_target(a.target)
        dts = []
        for d in a.input_dtype:
            for x in d.split(","):
                if x not in step_mod.DTYPES:
                    fail(f"--input-dtype {x!r}: one of {', '.join(step_mod.DTYPES)}")
                dts.append(step_mod.DTYPES[x])
        if len(dts) not in (0, 1, len(inputs)):
            fail(f"--input-dtype: {len(dts)} dtypes for {len(inputs)} --input(s); give one per --input, "
                 f"in order, or one for all")
        build = step_mod.load_builder(a.build)
        _check_kwargs(build, a.build, kwargs)
        return _record(a, step_mod, build, kwargs, inputs, dts, cap)
    except UsageError as e:
        fail(str(e), e.exit_code)
    except RecordingError as e:
        fail(str(e), 1)
    except (RuntimeError, AssertionError, NotImplementedError) as e:
        why = explain_error(e)  # outside the recording: the builder
        if why is None:
            if "'indices'" in str(e) and "Long, Int" in str(e):
                # The model's own error, kept whole, and what it most likely means.
                import traceback
                traceback.print_exc()
                fail("an index op (nn.Embedding) got float inputs: token ids are --input-dtype int64", 1)
            raise
        fail(why, 1)


def _check_kwargs(build, spec, kwargs):
    """--arg's keys against BUILD's parameters (before it runs)."""
    import inspect
    try:
        sig = inspect.signature(build)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**kwargs)
    except TypeError as e:
        from .session import UsageError
        given = " ".join(f"--arg {k}=..." for k in kwargs) or "no --arg"
        raise UsageError(f"BUILD {spec}: {e} (given {given}; it takes {sig})")


def _record(a, step_mod, build, kwargs, inputs, dts, cap):
    ddp_kwargs = {}
    if a.bucket_cap_mb is not None:
        ddp_kwargs["bucket_cap_mb"] = a.bucket_cap_mb
    if a.bucket_view:
        ddp_kwargs["gradient_as_bucket_view"] = True
    if a.find_unused:
        ddp_kwargs["find_unused_parameters"] = True
    t0 = time.perf_counter()
    rec = step_mod.record_step(
        build, inputs=inputs, input_dtypes=dts, target=a.target, optimizer=a.optimizer, lr=a.lr,
        impl=a.impl, weight_decay=a.weight_decay, momentum=a.momentum, steps=a.steps, amp=a.amp,
        checkpoint=(a.checkpoint_class or ("auto" if a.checkpoint else None)), zero_grad=a.zero_grad,
        build_kwargs=kwargs, frames=False if a.no_frames else ("short" if a.short_paths else True), cublas_workspace=a.cublas_workspace,
        capability=cap, sdpa=a.sdpa, inplace_accumulation=not a.no_inplace_accumulation,
        segments=a.segments, cudnn_workspace=a.cudnn_workspace, dist=a.dist, world_size=a.world_size,
        ddp_kwargs=ddp_kwargs, fsdp_blocks=a.fsdp_blocks)
    if a.vocab:
        rec.meta["vocab"] = a.vocab
    recorded = time.perf_counter() - t0
    try:
        model_summary = rec.save(a.out, a.format)
    except OSError as e:
        fail(f"--out {a.out}: cannot write it ({e.strerror or e}); the recording is lost: run again "
             f"with a path you can write", 1)
    total = time.perf_counter() - t0
    s = rec.summary()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"out": a.out, "steps_seconds": round(rec.seconds, 3), "record_seconds": round(recorded, 3), "total_seconds": round(total, 3),
           "peak_rss_bytes": rss, **s, "meta": rec.meta}
    if model_summary:
        out["allocator_model"] = model_summary
    notes = rec.warning_lines()
    if a.json:
        out["warnings"] = notes
        print(json.dumps(out, indent=1))
        for line in notes:
            print(f"warning: {line}", file=sys.stderr)
        return 0
    print(f"{a.out}: {s['allocations']} allocations over {a.steps} step(s) of {rec.meta['model']} "
          f"({rec.meta['parameters']:,} parameters): the steps recorded in {rec.seconds:.2f} s, "
          f"{recorded:.2f} s with building and the self-test, written after {total:.2f} s; "
          f"peak RSS {human(rss)}")
    if rec.meta.get("dist"):
        print("  " + dist_line(rec.meta["dist"]))
    if rec.meta.get("loss_on"):
        print(f"  loss ({a.target}) of the model's {rec.meta['loss_on']}")
    print(f"  peak of live tensor bytes: {human(s['peak_live_bytes'])}; at that moment: "
          + ", ".join(f"{k} {human(v)}" for k, v in sorted(s["at_peak"].items(), key=lambda kv: -kv[1])))
    print("  alive at the end: " + ", ".join(f"{k} {human(v)}" for k, v in sorted(s["end_by_category"].items())))
    if model_summary:
        print(f"  caching allocator model (PyTorch defaults): peak allocated {human(model_summary['peak_allocated'])}, "
              f"peak reserved {human(model_summary['peak_reserved'])}, {model_summary['segments']} segments")
    print(f"  {rec.meta['cublas_workspace']}"
          + (f"; {rec.meta['cublas_workspaces_per_op']} per-GEMM workspaces added"
             if rec.meta.get("cublas_workspaces_per_op") else ""))
    if rec.meta.get("cudnn_conv_workspaces"):
        print(f"  {rec.meta['cudnn_workspace']}: {rec.meta['cudnn_conv_workspaces']} added")
    if rec.meta.get("sdpa_choices"):
        print(f"  scaled_dot_product_attention backends: {rec.meta['sdpa_choices']}")
    if rec.meta.get("cuda_device_mapped"):
        print(f"  'cuda' in your code: {rec.meta['cuda_device_mapped']} call(s) (device='cuda', .cuda(), "
              f".to('cuda')) put on the recording's meta device")
    if rec.meta.get("warning"):
        print(f"  warning: {rec.meta['warning']}")
    for line in notes:
        print(f"  warning: {line}")
    print("  not included: the CUDA context, kernel-internal scratch, NCCL buffers "
          "(python -m vramlab_torch record --help)")
    return 0


def dist_line(d):
    """The summary's line for a --dist run (meta["dist"])."""
    ranks = f"rank 0 of {d['world_size']} on a fake process group (no communication)"
    if d["kind"] == "ddp":
        sizes = d.get("bucket_sizes", [])
        shown = ", ".join(human(n) for n in sizes[:6]) + (f", ... ({len(sizes) - 6} more)" if len(sizes) > 6 else "")
        line = (f"distributed: DDP, {ranks}; {d.get('buckets', 0)} gradient bucket(s) at the end, "
                f"{human(d.get('bucket_bytes', 0))} ({shown}; role 'ddp bucket', category workspace)")
        if d.get("used_map_bytes"):
            line += f"; find_unused_parameters' used map {human(d['used_map_bytes'])}"
        return line
    return (f"distributed: FSDP2, {ranks}; {d.get('units', '')} sharded: this rank's parameters "
            f"{human(d.get('sharded_parameter_bytes', 0))} of {human(d.get('parameter_bytes', 0))}")


if __name__ == "__main__":
    sys.exit(main())
