"""One rank of FSDP2 or DDP, recorded on the meta device with a fake
process group (torch.testing._internal.distributed.fake_pg: every
collective returns at once and moves no data; this process is rank 0).

    with vramlab_torch.distributed.fake_world(8):   # process group + patches
        with torch.device("meta"):
            model = build()
        vramlab_torch.distributed.shard(model)      # fully_shard per block, then the root
        with vramlab_torch.record() as rec:
            model.to_empty(device="meta")           # this rank's shards
            ...                                     # the training loop, as on CUDA

or `python -m vramlab_torch record ... --dist fsdp|ddp --world-size N`.

What PyTorch refuses on meta, and what `fake_world` changes (only while it
is entered):

FSDP2 (torch.distributed.fsdp.fully_shard)
  * the mesh's device is the device FSDP allocates on: a CPU mesh (no GPU)
    would put the all-gather buffers on the CPU, so `_get_device_from_mesh`
    answers meta, and meta's "device handle" (streams, events) is torch.cpu's
    dummy one;
  * `lazy_init` refuses parameters on meta (`_validate_no_meta_params`):
    skipped;
  * `record_grad_output_stream` wants a real stream: skipped on meta (a
    no-op on CUDA unless a backend registers it);
  * FSDP2 frees and re-allocates an unsharded parameter by resizing its
    storage (`storage.resize_(0)` / `resize_(n)`), which no dispatch mode
    sees: `alloc_storage` / `free_storage` tell the recorder.
  Allocations inside FSDP's all-gather, copy-out and reduce-scatter carry a
  role in `user_metadata`: "fsdp all-gather buffer" (category temporary),
  "fsdp unsharded parameter" (category parameter: the gathered copies),
  "fsdp reduce-scatter" (its input, temporary, and its output, whose views
  are the sharded gradients: gradient).

DDP (torch.nn.parallel.DistributedDataParallel)
  * `_verify_param_shape_across_processes` reads the gathered shapes back
    (`.item()` on meta): skipped;
  * the fake process group's allreduce future holds no tensor, which DDP's
    built-in hook refuses ("expected the hook result is either a Tensor or
    a TensorList found None", also on the CPU): a Python comm hook does
    what the built-in one does (divide in place, allreduce the bucket) and
    returns the bucket;
  * PyTorch 2.15's DDP builds ONE bucket of all the parameters at
    construction (without find_unused_parameters or static_graph its first
    bucketing is off) and rebuilds them before the second forward, in the
    order the gradients arrived (bucket_cap_mb, 1 MiB for the first): the
    rebuild broadcasts rank 0's bucket indices and copies them back to the
    host, a copy out of meta, which fails; while it runs the recorder keeps
    the host tensor as it is (rank 0's own indices, what the broadcast
    gives rank 0).
  * with find_unused_parameters the reducer keeps a used-parameter map on
    the host (made in the constructor; PyTorch's own, so not reported as a
    tensor the user made on the CPU) and one on the device (in the
    recording, 4 bytes per parameter); in the backward, when a parameter
    was unused, it copies the device map back to the host after its
    allreduce, a copy out of meta: the recorder keeps the host map as it is
    (rank 0's own, which the allreduce sums to the same zeros);
  * DDP's logger times iterations on CPU and CUDA only and warns on stderr
    ("Time stats are currently only collected for CPU and CUDA devices")
    at the first forward on meta: its `set_runtime_stats_and_log` is
    skipped.
  The buckets (alive after the constructor, and the rebuilt ones) carry the
  role "ddp bucket", category "workspace"; what the constructor allocates
  and frees (the broadcast of the parameters from rank 0, flattened) "ddp
  construction", category "temporary".
"""

import contextlib

import torch
import torch.nn as nn

ROLE_GATHER = "fsdp all-gather buffer"
ROLE_UNSHARDED = "fsdp unsharded parameter"
ROLE_REDUCE = "fsdp reduce-scatter"
ROLE_BUCKET = "ddp bucket"
ROLE_DDP_INIT = "ddp construction"


def available():
    """(True, "") or (False, why): a fake process group and FSDP2 here."""
    try:
        import torch.distributed as dist
        if not dist.is_available():
            return False, "torch.distributed is not available in this PyTorch build"
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        import torch.distributed.fsdp._fully_shard._fsdp_param_group  # noqa: F401
    except Exception as e:  # ImportError, or a layout this module does not know
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def _recorder():
    """The vramlab recorder on the dispatch mode stack, if any."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    from .recorder import Recorder
    for m in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(m, Recorder):
            return m
    return None


# The category each role's allocations get (None: the recorder's rules;
# FSDP's sharded gradients, views of the reduce-scatter's output, become
# "gradient" at optimizer.step()).
ROLE_CATEGORY = {ROLE_GATHER: "temporary", ROLE_UNSHARDED: "parameter", ROLE_REDUCE: None,
                 ROLE_BUCKET: "workspace", ROLE_DDP_INIT: "temporary"}


@contextlib.contextmanager
def _role(name):
    rec = _recorder()
    if rec is None:
        yield
        return
    was = rec.role, rec.role_category
    rec.role, rec.role_category = name, ROLE_CATEGORY[name]
    try:
        yield
    finally:
        rec.role, rec.role_category = was


def _with_role(fn, name):
    def wrapped(*a, **k):
        with _role(name):
            return fn(*a, **k)
    wrapped.__wrapped__ = fn
    return wrapped


@contextlib.contextmanager
def _patched(patches):
    """patches: (object, attribute, new value); restored at exit."""
    saved = [(o, n, getattr(o, n)) for o, n, _ in patches]
    try:
        for o, n, v in patches:
            setattr(o, n, v)
        yield
    finally:
        for o, n, v in reversed(saved):
            setattr(o, n, v)


def _fsdp_patches():
    import torch.distributed.fsdp._fully_shard._fsdp_collectives as fc
    import torch.distributed.fsdp._fully_shard._fsdp_init as fi
    import torch.distributed.fsdp._fully_shard._fsdp_param as fp
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as fpg
    import torch.distributed.fsdp._fully_shard._fsdp_state as fst
    import torch.distributed.fsdp._fully_shard._fully_shard as ffs

    get_handle = fpg._get_device_handle

    def handle(device_type):
        return torch.cpu if device_type == "meta" else get_handle(device_type)

    get_device = ffs._get_device_from_mesh

    def device_from_mesh(mesh):
        return torch.device("meta") if mesh.device_type == "cpu" else get_device(mesh)

    orig_record = fc.record_grad_output_stream

    def record_grad_output_stream(buffer, stream):
        if buffer.device.type == "meta":
            return None
        return orig_record(buffer, stream)

    orig_alloc, orig_free = fp.alloc_storage, fp.free_storage

    def alloc_storage(tensor):
        orig_alloc(tensor)
        rec = _recorder()
        if rec is not None:
            with _role(ROLE_UNSHARDED):
                rec.storage_resized(tensor.untyped_storage(), "fsdp alloc_storage")

    def free_storage(tensor):
        orig_free(tensor)
        rec = _recorder()
        if rec is not None:
            rec.storage_resized(tensor.untyped_storage(), "fsdp free_storage")

    return [
        (ffs, "_get_device_from_mesh", device_from_mesh),
        *[(m, "_get_device_handle", handle) for m in (fc, fi, fpg, fst)],
        (fpg.FSDPParamGroup, "_validate_no_meta_params", lambda self: None),
        (fc, "record_grad_output_stream", record_grad_output_stream),
        (fp, "alloc_storage", alloc_storage),
        (fp, "free_storage", free_storage),
        (fpg, "alloc_storage", alloc_storage),
        (fpg, "foreach_all_gather", _with_role(fpg.foreach_all_gather, ROLE_GATHER)),
        (fpg, "foreach_all_gather_copy_out",
         _with_role(fpg.foreach_all_gather_copy_out, ROLE_UNSHARDED)),
        (fpg, "foreach_reduce", _with_role(fpg.foreach_reduce, ROLE_REDUCE)),
    ]


def _ddp_patches():
    import torch.nn.parallel.distributed as dd
    return [(dd, "_verify_param_shape_across_processes", lambda *a, **k: None)]


@contextlib.contextmanager
def fake_world(world_size, rank=0):
    """A fake process group of `world_size` ranks (this process is `rank`)
    and the patches above, for as long as the block runs."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    mine = not dist.is_initialized()
    if mine:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    elif dist.get_world_size() != world_size:
        raise RuntimeError(f"a process group of {dist.get_world_size()} ranks is already "
                           f"initialised (asked for {world_size})")
    try:
        with _patched(_fsdp_patches() + _ddp_patches()):
            yield
    finally:
        if mine:
            dist.destroy_process_group()


def model_classes(model):
    from .step import model_classes as classes
    return classes(model)


def find_blocks(model, which="auto"):
    """The blocks `shard` wraps (`step.find_blocks`), or an error that says
    how to name them."""
    from .step import find_blocks as found
    blocks = found(model, which)
    from .session import UsageError
    if not blocks and which == "auto":
        raise UsageError("--dist fsdp: no nn.ModuleList / nn.Sequential of two or more blocks of one "
                         "class found; name the class to shard with --fsdp-blocks CLASS "
                         f"(the model's classes: {model_classes(model)})")
    if not blocks:
        raise UsageError(f"--fsdp-blocks {which}: no module of that class in the model "
                         f"(its classes: {model_classes(model)})")
    return blocks


def shard(model, blocks="auto", reshard_after_forward=None, mp_policy=None):
    """FSDP2 as its examples apply it: fully_shard on each block, then on the
    root (whose group holds the rest: embeddings, final norm, head). Call it
    inside `fake_world`, on the model built on meta, before `to_empty`.
    reshard_after_forward: fully_shard's (None, its default: True for the
    blocks, False for the root, which then keeps its gathered parameters
    from its forward to the end of its backward). Returns the number of
    blocks."""
    from torch.distributed.fsdp import fully_shard
    kw = {}
    if reshard_after_forward is not None:
        kw["reshard_after_forward"] = reshard_after_forward
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    bs = find_blocks(model, blocks)
    for b in bs:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    return len(bs)


def allreduce_hook(process_group, bucket):
    """DDP's built-in allreduce hook in Python (divide by the world size in
    place, allreduce, the bucket back): it allocates nothing more, and it
    returns the bucket where the fake group's future holds None."""
    import torch.distributed as dist
    t = bucket.buffer()
    t.div_(dist.get_world_size(process_group))
    dist.all_reduce(t, group=process_group)
    fut = torch.futures.Future()
    fut.set_result(t)
    return fut


class _Reducer:
    """DDP's reducer, whose `_rebuild_buckets` (before the second forward:
    the buckets again, in the order the gradients arrived) runs with the
    recorder keeping host copies: the rebuild broadcasts rank 0's bucket
    indices and copies them back to the host, which on meta has no data,
    and rank 0 keeps its own indices. Without a recorder: not rebuilt."""

    def __init__(self, reducer):
        object.__setattr__(self, "_reducer", reducer)

    def _rebuild_buckets(self):
        rec = _recorder()
        if rec is None:
            return False
        was = rec.host_copies_keep
        rec.host_copies_keep = True
        try:
            with _role(ROLE_BUCKET):
                return self._reducer._rebuild_buckets()
        finally:
            rec.host_copies_keep = was

    def __getattr__(self, name):
        return getattr(self._reducer, name)


class _Logger:
    """DDP's C++ logger, whose `set_runtime_stats_and_log` (called at each
    forward) times the iterations on CPU and CUDA only: on meta it warns
    "Time stats are currently only collected for CPU and CUDA devices" on
    stderr (C++'s warning, outside Python's warnings) and records nothing.
    Skipped; the rest (`_get_ddp_logging_data`, ...) is the logger's."""

    def __init__(self, logger):
        object.__setattr__(self, "_logger", logger)

    def set_runtime_stats_and_log(self):
        return None

    def __getattr__(self, name):
        return getattr(self._logger, name)


def bucket_sizes(ddp):
    """The bytes of each of DDP's gradient buckets now (after the rebuild
    before the second forward: the rebuilt ones), in the reducer's order.
    Call it outside a recording (it makes meta tensors shaped like the
    buckets)."""
    return [b.buffer().numel() * b.buffer().element_size()
            for b in ddp.reducer._get_zeros_like_grad_buckets()]


def wrap_ddp(model, recording=None, **ddp_kwargs):
    """DistributedDataParallel(model, **ddp_kwargs) on meta, inside
    `fake_world`, its buckets labelled when `recording` (a Recording)
    records it. What the constructor allocates and frees (the broadcast of
    the parameters from rank 0, flattened) becomes a temporary."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    rec = recording.recorder if recording is not None else None
    first = rec.next_id if rec is not None else 0
    if rec is not None:
        rec.library_host += 1
    try:
        ddp = DDP(model, **ddp_kwargs)
    finally:
        if rec is not None:
            rec.library_host -= 1
    ddp.register_comm_hook(None, allreduce_hook)
    ddp.reducer = _Reducer(ddp.reducer)
    ddp.logger = _Logger(ddp.logger)
    if rec is not None:
        alive = {ev["id"] for ev, _ in rec.live.values()}
        for ev in rec.events:
            if ev["op"] == "alloc" and ev["id"] >= first:
                if ev["id"] in alive:
                    ev["role"], ev["category"] = ROLE_BUCKET, ROLE_CATEGORY[ROLE_BUCKET]
                else:
                    ev["role"], ev["category"] = ROLE_DDP_INIT, "temporary"
    return ddp
