"""Recorded events as a PyTorch memory snapshot: the dict that
``torch.cuda.memory._snapshot()`` returns and ``_dump_snapshot()`` pickles.

The recorder sees requests (each storage's nbytes, in order) and frees. A
real snapshot also holds what the CUDA caching allocator did with them:
which segment (cudaMalloc) each block lies in, at which address, and the
segments at the end. With ``segments="simulate"`` (the default) those come
from a small model of PyTorch's caching allocator under its default
settings (what ``PYTORCH_CUDA_ALLOC_CONF`` unset gives): requests rounded
to 512 bytes, blocks of at most 1 MiB from 2 MiB segments (the small
pool), larger ones from 20 MiB segments (requests under 10 MiB) or
segments of their own size rounded to 2 MiB, best fit by (size, address),
a block split when the rest is at least 512 bytes (small pool) or more than
1 MiB (large pool), freed blocks merged with free neighbours, nothing given
back to the device (no empty_cache). One stream, no expandable segments,
no garbage collection threshold, no memory limit. The trace then carries
``segment_alloc`` entries and ``segments`` the end state, as a recording on
a GPU would; `vramlab replay` rebuilds the same state with its own copy of
the allocator and says whether its end state matches.

With ``segments="none"`` every allocation gets a fresh address (never
reused), the trace has only alloc / free entries and ``segments`` is empty:
the allocator decisions are left entirely to the reader.

Standard library only.
"""

import bisect
import json

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20
BASE_ADDRESS = 0x7F0000000000


def round_size(size):
    """PyTorch's round_size under the default settings."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def allocation_size(size):
    """PyTorch's get_allocation_size: the segment a rounded request gets."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


class _Block:
    __slots__ = ("addr", "size", "segment", "prev", "next", "allocated", "requested", "small", "ev")

    def __init__(self, addr, size, segment, small):
        self.addr, self.size, self.segment, self.small = addr, size, segment, small
        self.prev = self.next = None
        self.allocated = False
        self.requested = 0
        self.ev = None


class CachingAllocatorModel:
    """PyTorch's CUDA caching allocator, default settings, one stream,
    unlimited memory: enough to give every request the address and segment
    a real run would give it."""

    def __init__(self):
        self.pools = {True: [], False: []}  # small? -> sorted [(size, addr)]
        self.free = {}  # addr -> free block
        self.next_addr = BASE_ADDRESS
        self.segments = []  # [(addr, size, small)]
        self.heads = []  # each segment's lowest block

    def _insert(self, b):
        bisect.insort(self.pools[b.small], (b.size, b.addr))
        self.free[b.addr] = b

    def _remove(self, b):
        pool = self.pools[b.small]
        i = bisect.bisect_left(pool, (b.size, b.addr))
        del pool[i]
        del self.free[b.addr]

    def malloc(self, requested):
        """(block, segment_alloc entry or None)."""
        size = round_size(requested)
        small = size <= K_SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, 0))
        seg_entry = None
        if i < len(pool):
            b = self.free[pool[i][1]]
            self._remove(b)
        else:
            seg = allocation_size(size)
            addr = self.next_addr
            self.next_addr += (seg + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE + K_ROUND_LARGE
            b = _Block(addr, seg, len(self.segments), small)
            self.segments.append((addr, seg, small))
            self.heads.append(b)
            seg_entry = (addr, seg)
        remaining = b.size - size
        if (remaining >= K_MIN_BLOCK) if small else (remaining > K_SMALL_SIZE):
            rest = _Block(b.addr + size, remaining, b.segment, small)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = size
            self._insert(rest)
        b.allocated = True
        b.requested = requested
        return b, seg_entry

    def release(self, b):
        b.allocated = False
        b.requested = 0
        b.ev = None
        for nb in (b.prev, b.next):
            if nb is not None and not nb.allocated:
                self._remove(nb)
                if nb is b.prev:
                    if self.heads[b.segment] is nb:
                        self.heads[b.segment] = b
                    b.addr = nb.addr
                    b.prev = nb.prev
                    if nb.prev is not None:
                        nb.prev.next = b
                else:
                    b.next = nb.next
                    if nb.next is not None:
                        nb.next.prev = b
                b.size += nb.size
        self._insert(b)



class _Interner:
    """One shared object per distinct frame and stack, as PyTorch shares
    them: pickle's memo then writes each once."""

    def __init__(self):
        self.frames = {}
        self.stacks = {}

    def frame(self, f):
        d = self.frames.get(f)
        if d is None:
            d = self.frames[f] = {"filename": f[0], "line": f[1], "name": f[2]}
        return d

    def stack(self, frames):
        key = tuple(frames)
        s = self.stacks.get(key)
        if s is None:
            s = self.stacks[key] = [self.frame(f) for f in frames]
        return s


def metadata_of(ev):
    """The allocation's labels as the JSON string that trace entries carry
    in ``user_metadata`` (what ``torch.cuda.memory._set_memory_metadata``
    sets and pytorch.org/memory_viz shows)."""
    m = {"category": ev.get("category", "temporary")}
    for k in ("where", "phase", "step", "label", "role"):
        if ev.get(k) not in (None, ""):
            m[{"where": "module", "label": "op"}.get(k, k)] = ev[k]
    return json.dumps(m, separators=(",", ":"))


def allocator_settings():
    """What ``_snapshot()`` reports with PYTORCH_CUDA_ALLOC_CONF unset."""
    return {
        "PYTORCH_CUDA_ALLOC_CONF": None,
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": False,
        "pinned_num_register_threads": 1,
        "release_lock_on_malloc": False,
        "pinned_use_host_register": False,
        "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
    }


def to_snapshot(events, segments="simulate", meta=None):
    """The snapshot dict for `events` (the recorder's list: alloc events
    with id, size, frames, labels; free events with id). Returns (snapshot,
    summary) where summary has the peaks the simulation saw."""
    if segments not in ("simulate", "none"):
        raise ValueError(f"segments={segments!r}: simulate or none")
    intern = _Interner()
    model = CachingAllocatorModel() if segments == "simulate" else None
    trace = []
    live = {}  # id -> (block or addr, size, entry metadata, frames)
    next_addr = BASE_ADDRESS
    t = 0
    allocated = reserved = peak_allocated = peak_reserved = 0
    peak_requested = requested = 0
    empty = []

    def entry(action, addr, size, frames, md):
        nonlocal t
        t += 1
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
             "frames": frames if frames is not None else empty}
        if md is not None:
            e["user_metadata"] = md
        trace.append(e)

    for ev in events:
        if ev["op"] == "alloc":
            size = ev["size"]
            frames = intern.stack(ev.get("frames") or ())
            md = metadata_of(ev)
            if model is not None:
                b, seg = model.malloc(size)
                if seg is not None:
                    entry("segment_alloc", seg[0], seg[1], frames, md)
                    reserved += seg[1]
                b.ev = (frames, md)
                addr, block = b.addr, b
                allocated += b.size
            else:
                addr, block = next_addr, None
                next_addr += round_size(size)
                allocated += round_size(size)
                reserved = allocated
            requested += size
            live[ev["id"]] = (block, addr, size, frames, md)
            entry("alloc", addr, size, frames, md)
            peak_allocated = max(peak_allocated, allocated)
            peak_reserved = max(peak_reserved, reserved)
            peak_requested = max(peak_requested, requested)
        elif ev["op"] == "free":
            block, addr, size, frames, md = live.pop(ev["id"])
            entry("free_requested", addr, size, frames, md)
            entry("free_completed", addr, size, frames, md)
            requested -= size
            if model is not None:
                allocated -= block.size
                model.release(block)
            else:
                allocated -= round_size(size)
                reserved = allocated
        else:
            raise ValueError(f"unknown event {ev!r}")

    segs = []
    if model is not None:
        for i, (addr, size, small) in enumerate(model.segments):
            segs.append(_segment_state(model.heads[i], addr, size, small))
    snapshot = {
        "segments": segs,
        "device_traces": [trace],
        "allocator_settings": allocator_settings(),
    }
    if meta:
        # Not a key PyTorch writes; readers that don't know it ignore it.
        snapshot["vramlab_torch"] = json.loads(json.dumps(meta, default=str))
    summary = dict(peak_allocated=peak_allocated, peak_reserved=peak_reserved,
                   peak_requested=peak_requested, end_allocated=allocated, end_reserved=reserved,
                   end_requested=requested, segments=len(segs))
    return snapshot, summary


def _segment_state(first, addr, size, small):
    """One segment of the end state, tiled by its blocks in address order."""
    blocks, alloc_size, req_size = [], 0, 0
    b = first
    while b is not None:
        if b.allocated:
            frames, md = b.ev if b.ev else ([], None)
            blk = {"address": b.addr, "size": b.size, "requested_size": b.requested,
                   "state": "active_allocated", "frames": frames}
            alloc_size += b.size
            req_size += b.requested
        else:
            blk = {"address": b.addr, "size": b.size, "requested_size": 0,
                   "state": "inactive", "frames": []}
        blocks.append(blk)
        b = b.next
    return {"device": 0, "address": addr, "total_size": size, "stream": 0,
            "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
            "allocated_size": alloc_size, "active_size": alloc_size, "requested_size": req_size,
            "is_expandable": False, "blocks": blocks}
