"""python -m vramlab_torch record BUILD [options] --out STEP.pickle"""

import argparse
import json
import resource
import sys
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
Emulated: CUDA's SDPA backend choice (--sdpa) and CUDA's autocast policy
(--amp, and torch.autocast("cuda") inside record())."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m vramlab_torch",
        description="Record the GPU memory a PyTorch training step would use, without a GPU, "
                    "as a PyTorch memory snapshot for `vramlab replay` and pytorch.org/memory_viz.",
        epilog=NOT_SEEN, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "record", help="record training steps of a model built by FILE.py:FUNCTION",
        description="Builds the model with BUILD (FILE.py:FUNCTION or MODULE:FUNCTION; it returns an "
                    "nn.Module and is called under torch.device('meta'), so nothing is allocated), "
                    "then records --steps training steps (forward, loss, backward, optimizer.step(), "
                    "zero_grad) on meta tensors.",
        epilog=NOT_SEEN, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("build", metavar="BUILD", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    r.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for BUILD (VALUE as JSON if it parses, else a string); repeatable")
    r.add_argument("--input", action="append", required=True, metavar="SHAPE",
                   help="an input's shape, e.g. 32,3,224,224; repeat for several positional inputs")
    r.add_argument("--input-dtype", action="append", default=[], metavar="DTYPE",
                   help="float32 (default), float16, bfloat16, int64 (token ids), ...; one per --input "
                        "or one for all")
    r.add_argument("--vocab", type=int, help="token inputs: the vocabulary size (recorded in the "
                   "metadata; values are never read on meta)")
    r.add_argument("--target", default="classes",
                   help="classes[:N] (int64 [batch], cross entropy; default), tokens (int64 shaped like "
                        "the first input, cross entropy over the output's last dimension), same (MSE "
                        "against a tensor shaped like the output) or none (the output's sum)")
    r.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="adamw")
    r.add_argument("--lr", type=float, default=1e-3)
    r.add_argument("--weight-decay", type=float, help="default: adamw 0.01, adam and sgd 0")
    r.add_argument("--momentum", type=float, default=0.9, help="sgd (default 0.9)")
    impl = r.add_mutually_exclusive_group()
    impl.add_argument("--foreach", dest="impl", action="store_const", const="foreach",
                      help="the optimizer's foreach implementation (default)")
    impl.add_argument("--for-loop", dest="impl", action="store_const", const="for-loop")
    impl.add_argument("--fused", dest="impl", action="store_const", const="fused")
    r.set_defaults(impl="foreach")
    r.add_argument("--steps", type=int, default=2)
    r.add_argument("--amp", choices=["bf16", "f16", "bfloat16", "float16"],
                   help="autocast the forward and loss to this dtype with CUDA's policy")
    r.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing (torch.utils.checkpoint, non-reentrant) on the model's "
                        "repeated blocks (the largest nn.ModuleList / nn.Sequential of one class)")
    r.add_argument("--checkpoint-class", metavar="NAME", help="checkpoint every module of this class instead")
    r.add_argument("--dist", choices=["fsdp", "ddp"],
                   help="record rank 0 of a data-parallel run on a fake process group (no GPU, no "
                        "communication): fsdp = FSDP2's fully_shard on each repeated block (the largest "
                        "nn.ModuleList / nn.Sequential of one class, or --fsdp-blocks) and the root; ddp = "
                        "DistributedDataParallel. The inputs are one rank's (its batch)")
    r.add_argument("--world-size", type=int, default=8, help="--dist: the number of ranks (default 8)")
    r.add_argument("--fsdp-blocks", default="auto", metavar="CLASS",
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
    r.add_argument("--out", required=True)
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return p.parse_args(argv)


def _value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def mib(n):
    return f"{n / 2**20:,.1f} MiB"


def main(argv=None):
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    a = parse_args(sys.argv[1:] if argv is None else argv)
    from . import step as step_mod

    build = step_mod.load_builder(a.build)
    kwargs = {}
    for kv in a.arg:
        if "=" not in kv:
            raise SystemExit(f"--arg {kv!r}: KEY=VALUE")
        k, v = kv.split("=", 1)
        kwargs[k] = _value(v)
    inputs = [step_mod.parse_shape(s) for s in a.input]
    dts = []
    for d in a.input_dtype:
        for x in d.split(","):
            if x not in step_mod.DTYPES:
                raise SystemExit(f"--input-dtype {x!r}: one of {', '.join(step_mod.DTYPES)}")
            dts.append(step_mod.DTYPES[x])
    cap = tuple(int(x) for x in a.capability.split("."))
    ddp_kwargs = {}
    if a.bucket_cap_mb is not None:
        ddp_kwargs["bucket_cap_mb"] = a.bucket_cap_mb
    if a.bucket_view:
        ddp_kwargs["gradient_as_bucket_view"] = True
    if a.find_unused:
        ddp_kwargs["find_unused_parameters"] = True
    if ddp_kwargs and a.dist != "ddp":
        raise SystemExit("--bucket-cap-mb, --bucket-view, --find-unused: with --dist ddp")
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
    model_summary = rec.save(a.out, a.format)
    total = time.perf_counter() - t0
    s = rec.summary()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"out": a.out, "steps_seconds": round(rec.seconds, 3), "record_seconds": round(recorded, 3), "total_seconds": round(total, 3),
           "peak_rss_bytes": rss, **s, "meta": rec.meta}
    if model_summary:
        out["allocator_model"] = model_summary
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{a.out}: {s['allocations']} allocations over {a.steps} step(s) of {rec.meta['model']} "
          f"({rec.meta['parameters']:,} parameters): the steps recorded in {rec.seconds:.2f} s, "
          f"{recorded:.2f} s with building and the self-test, written after {total:.2f} s; "
          f"peak RSS {mib(rss)}")
    print(f"  peak of live tensor bytes: {mib(s['peak_live_bytes'])}; at that moment: "
          + ", ".join(f"{k} {mib(v)}" for k, v in sorted(s["at_peak"].items(), key=lambda kv: -kv[1])))
    print("  alive at the end: " + ", ".join(f"{k} {mib(v)}" for k, v in sorted(s["end_by_category"].items())))
    if model_summary:
        print(f"  caching allocator model (PyTorch defaults): peak allocated {mib(model_summary['peak_allocated'])}, "
              f"peak reserved {mib(model_summary['peak_reserved'])}, {model_summary['segments']} segments")
    print(f"  {rec.meta['cublas_workspace']}"
          + (f"; {rec.meta['cublas_workspaces_per_op']} per-GEMM workspaces added"
             if rec.meta.get("cublas_workspaces_per_op") else ""))
    if rec.meta.get("cudnn_conv_workspaces"):
        print(f"  {rec.meta['cudnn_workspace']}: {rec.meta['cudnn_conv_workspaces']} added")
    if rec.meta.get("sdpa_choices"):
        print(f"  scaled_dot_product_attention backends: {rec.meta['sdpa_choices']}")
    if rec.meta.get("warning"):
        print(f"  warning: {rec.meta['warning']}")
    print("  not included: the CUDA context, kernel-internal scratch, NCCL buffers "
          "(python -m vramlab_torch record --help)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
