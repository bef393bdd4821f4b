#!/usr/bin/env python3
"""What PyTorch DDP's options cost in GPU memory, measured: the lesson C21
check (`vramlab lesson C21` models it per rank without a GPU).

One process per configuration, world size 1 over NCCL (DDP's Reducer builds the same buckets
as on many ranks), GPT-2 small (vramlab_torch.models:gpt2) in fp32 with
Adam (foreach), two steps of forward, cross-entropy, backward, step and
zero_grad(set_to_none=True), from an emptied cache, for:
  plain model | DDP | DDP find_unused_parameters=True |
  DDP gradient_as_bucket_view=True
at 4 x 1024 tokens (activations set the peak) and 1 x 128 (Adam's step
does). Prints one JSON object: torch.cuda.max_memory_allocated() less what
was allocated before the model, and the bytes allocated right after the
wrapper was built (DDP's buckets), for each.

    PYTHONPATH=python python3 scripts/ddp_check.py > ddp.json
"""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from vramlab_torch.models import gpt2

# Without CUDA (a dry run of the script itself) memory reads as 0.
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
LAYERS = int(os.environ.get("DDP_CHECK_LAYERS", "12"))


def allocated():
    return torch.cuda.memory_allocated() if CUDA else 0


def sync():
    if CUDA:
        torch.cuda.synchronize()


def run(kind, batch, seq):
    torch.manual_seed(0)
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    sync()
    base = allocated()
    model = gpt2(layers=LAYERS).to(DEV)
    after_model = allocated()
    if kind != "plain":
        model = DDP(model, find_unused_parameters=(kind == "find_unused"),
                    gradient_as_bucket_view=(kind == "bucket_view"))
    after_wrap = allocated()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    idx = torch.randint(0, 50257, (batch, seq), device=DEV)
    tgt = torch.randint(0, 50257, (batch, seq), device=DEV)
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        logits = model(idx)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
    sync()
    out = dict(kind=kind, batch=batch, seq=seq,
               model_bytes=after_model - base, wrapper_bytes=after_wrap - after_model,
               peak_bytes=(torch.cuda.max_memory_allocated() if CUDA else 0) - base,
               params=sum(p.numel() for p in model.parameters()),
               tensors=sum(1 for _ in model.parameters()))
    del model, opt, idx, tgt
    gc.collect()
    return out


def one(kind, batch, seq, port):
    """One configuration in this process: nothing of another's is left."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl" if CUDA else "gloo", rank=0, world_size=1)
    if CUDA:
        torch.cuda.set_device(0)
    # cuBLAS's workspace and NCCL's first buffers, before any measurement.
    a = torch.randn(256, 256, device=DEV)
    (a @ a).sum().item()
    print(json.dumps(run(kind, batch, seq)))
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--one":
        return one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), 20000 + os.getpid() % 20000)
    import subprocess
    # Every configuration in its own process, all at once: each process has
    # its own caching allocator and peaks.
    confs = [(kind, b, s) for b, s in ((4, 1024), (1, 128))
             for kind in ("plain", "ddp", "find_unused", "bucket_view")]
    procs = [subprocess.Popen([sys.executable, __file__, "--one", k, str(b), str(s)],
                              stdout=subprocess.PIPE, text=True) for k, b, s in confs]
    rows = []
    for p in procs:
        out, _ = p.communicate()
        rows.append(json.loads(out.strip().splitlines()[-1]))
    name = torch.cuda.get_device_name(0) if CUDA else "cpu (dry run: memory reads 0)"
    print(json.dumps(dict(torch=torch.__version__, device=name, layers=LAYERS, rows=rows), indent=1))
    for r in rows:
        print(f"{r['batch']}x{r['seq']:<5} {r['kind']:<12} wrapper {r['wrapper_bytes'] / 2**20:8.1f} MiB  "
              f"peak {r['peak_bytes'] / 2**20:9.1f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
