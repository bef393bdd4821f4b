//! One rank's training steps as allocations and frees: what pipeline stage
//! `stage` of a layout allocates, in the order its runtime does, for two
//! steps (the first allocates the optimizer states; the second is the
//! steady state a long run repeats).

use crate::layout::{Layout, Precision, Recompute, Schedule, Sharding};
use crate::model::{Module, Transformer};
use serde::Serialize;

/// What a block of memory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Parameters as the model holds them (16-bit under mixed precision),
    /// whole or this rank's shard.
    Parameters,
    /// ZeRO-3 / FSDP: parameters all-gathered for one module or block.
    Gathered,
    /// Gradients, whole or this rank's shard.
    Gradients,
    /// fp32 master weights, Adam's moments, DeepSpeed's fp32 gradient
    /// partition.
    OptimizerStates,
    /// DDP's flat gradient buckets (and `find_unused_parameters`' map).
    Buckets,
    /// What a transformer layer saves for backward (Korthikanti et al.'s
    /// table 2, term by term).
    Activations,
    /// Saved outside the layers: token ids, the embedding's dropout mask,
    /// the final LayerNorm's input, the logits.
    OuterActivations,
    /// Freed within the step: gradients flowing backward, recomputed
    /// activations, a unit's whole gradients before their reduce-scatter.
    Temporaries,
    /// Sequence parallelism's all-gathered layer inputs and the whole
    /// outputs it reduce-scatters.
    CommBuffers,
}

pub const KINDS: [Kind; 9] = [
    Kind::Parameters,
    Kind::Gathered,
    Kind::Gradients,
    Kind::OptimizerStates,
    Kind::Buckets,
    Kind::Activations,
    Kind::OuterActivations,
    Kind::Temporaries,
    Kind::CommBuffers,
];

impl Kind {
    pub fn index(self) -> usize {
        KINDS.iter().position(|&k| k == self).unwrap_or(0)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Parameters => "parameters",
            Kind::Gathered => "gathered parameters",
            Kind::Gradients => "gradients",
            Kind::OptimizerStates => "optimizer states",
            Kind::Buckets => "DDP buckets",
            Kind::Activations => "layer activations",
            Kind::OuterActivations => "other activations",
            Kind::Temporaries => "temporaries",
            Kind::CommBuffers => "communication buffers",
        }
    }

    /// Whether it counts in the ZeRO paper's model states.
    pub fn model_state(self) -> bool {
        matches!(
            self,
            Kind::Parameters | Kind::Gradients | Kind::OptimizerStates
        )
    }
}

/// One step of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Alloc {
        id: u32,
        bytes: u64,
        kind: Kind,
        label: &'static str,
    },
    Free {
        id: u32,
    },
    /// Right before the last step's `zero_grad`: every model state is live.
    StatesLive,
    /// The start of a forward that a backward follows (1F1B's steady
    /// pairs): where a replay looks for a period it has seen
    /// ([`crate::replay`]). `next` is the id the next allocation takes.
    Pair {
        next: u32,
    },
}

/// One rank's program.
#[derive(Debug, Clone)]
pub struct Program {
    pub stage: u64,
    pub ops: Vec<Op>,
    /// Parameters this rank's stage holds before data-parallel sharding.
    pub stage_params: u64,
    /// Micro-batches whose activations the stage holds at once.
    pub in_flight: u64,
    /// The gradients are views into DDP's buckets (`--bucket-view`): the
    /// buckets count as gradients in the model states.
    pub buckets_are_gradients: bool,
}

/// An activation term of Korthikanti et al.'s table 2.
#[derive(Debug, Clone, Copy)]
struct Term {
    label: &'static str,
    /// Elements in units of s·b·h, or of a·s²·b where `core`.
    count: u64,
    core: bool,
    /// A 1-byte dropout mask (else an activation of the precision's size).
    mask: bool,
    /// Split over the tensor-parallel ranks always (else only with
    /// sequence parallelism).
    tensor_split: bool,
}

impl Term {
    /// Saved only where the model has dropout: the masks, and the
    /// attention's dropout output (without dropout the product with v
    /// takes the softmax output itself).
    fn only_with_dropout(&self) -> bool {
        self.mask || self.label == "attention dropout output"
    }
}

const fn term(label: &'static str, count: u64, core: bool, mask: bool, tensor_split: bool) -> Term {
    Term {
        label,
        count,
        core,
        mask,
        tensor_split,
    }
}

/// One layer's saved tensors, in forward order: attention 11sbh + 5as²b,
/// MLP 19sbh, LayerNorms 4sbh (16-bit activations, 1-byte masks).
const TERMS: [Term; 14] = [
    term("ln_1 input", 1, false, false, false),
    term("qkv input", 1, false, false, false),
    term("q, k", 2, false, false, true),
    term("softmax output", 1, true, false, true),
    term("softmax dropout mask", 1, true, true, true),
    term("attention dropout output", 1, true, false, true),
    term("v", 1, false, false, true),
    term("attention projection input", 1, false, false, true),
    term("attention dropout mask", 1, false, true, false),
    term("ln_2 input", 1, false, false, false),
    term("fc input", 1, false, false, false),
    term("gelu input", 4, false, false, true),
    term("mlp projection input", 4, false, false, true),
    term("mlp dropout mask", 1, false, true, false),
];

struct Builder<'a> {
    model: &'a Transformer,
    l: &'a Layout,
    ops: Vec<Op>,
    next: u32,
    /// FSDP2's last all-gather output, freed at the next all-gather.
    gather_buffer: Option<u32>,
}

impl Builder<'_> {
    fn alloc(&mut self, bytes: u64, kind: Kind, label: &'static str) -> Option<u32> {
        if bytes == 0 {
            return None;
        }
        let id = self.next;
        self.next += 1;
        self.ops.push(Op::Alloc {
            id,
            bytes,
            kind,
            label,
        });
        Some(id)
    }

    fn free(&mut self, id: Option<u32>) {
        if let Some(id) = id {
            self.ops.push(Op::Free { id });
        }
    }

    fn free_all(&mut self, ids: &mut Vec<Option<u32>>) {
        for id in ids.drain(..) {
            self.free(id);
        }
    }

    /// Elements of one activation term of one micro-batch on this rank.
    fn term_bytes(&self, t: &Term) -> u64 {
        let (s, b, h, a) = (
            self.l.seq,
            self.l.micro_batch,
            self.model.hidden,
            self.model.heads,
        );
        let elems = if t.core { a * s * s * b } else { s * b * h } * t.count;
        let split = if t.tensor_split || self.l.sp {
            self.l.tp
        } else {
            1
        };
        let per = if t.mask {
            1
        } else {
            self.l.precision.activation_bytes()
        };
        elems / split * per
    }

    /// s·b·h elements of the residual stream at the activation's size,
    /// over t with sequence parallelism.
    fn stream_bytes(&self) -> u64 {
        let split = if self.l.sp { self.l.tp } else { 1 };
        self.l.seq * self.l.micro_batch * self.model.hidden / split
            * self.l.precision.activation_bytes()
    }

    /// One micro-batch's fp32 logits over this rank's vocabulary share.
    fn logits_bytes(&self) -> u64 {
        self.l.seq * self.l.micro_batch * self.model.vocab.div_ceil(self.l.tp) * 4
    }

    /// A fused attention's log-sum-exp: one fp32 a row of each head.
    fn lse_bytes(&self) -> u64 {
        self.l.seq * self.l.micro_batch * self.model.heads / self.l.tp * 4
    }

    /// The sequence-parallel all-gather of a layer input: the whole s·b·h.
    fn gather_bytes(&self) -> u64 {
        if self.l.sp {
            self.l.seq
                * self.l.micro_batch
                * self.model.hidden
                * self.l.precision.activation_bytes()
        } else {
            0
        }
    }
}

/// A unit of the model in forward order: the embeddings, a block, the head.
#[derive(Debug, Clone)]
struct Unit {
    modules: Vec<Module>,
    block: bool,
    first: bool,
    last: bool,
    /// Elements of a weight the unit uses but another unit owns: the tied
    /// head's token table when one stage holds both ends (ZeRO-3 gathers
    /// it again for the logits and their backward, and the head's gradient
    /// of it waits for the embedding's).
    tied: u64,
}

impl Unit {
    fn tensors(&self) -> impl Iterator<Item = u64> + '_ {
        self.modules.iter().flat_map(|m| m.tensors.iter().copied())
    }
}

/// The order stage `stage` runs its micro-batches: `(forward, index)`.
fn schedule(stage: u64, p: u64, m: u64, s: Schedule) -> Vec<(bool, u64)> {
    match s {
        Schedule::Gpipe => (0..m)
            .map(|i| (true, i))
            .chain((0..m).rev().map(|i| (false, i)))
            .collect(),
        Schedule::OneFOneB => {
            let warm = (p - stage - 1).min(m);
            let mut out: Vec<(bool, u64)> = (0..warm).map(|i| (true, i)).collect();
            for j in 0..m - warm {
                out.push((true, warm + j));
                out.push((false, j));
            }
            out.extend((m - warm..m).map(|i| (false, i)));
            out
        }
    }
}

/// What stage `stage` of `layout` allocates and frees over two steps.
pub fn program(model: &Transformer, layout: &Layout, stage: u64) -> Program {
    program_with(model, layout, stage, None)
}

/// Micro-batches past which a 1F1B stage's steady state only repeats
/// itself: the warm-up's p − stage in flight, and two more pairs of one
/// forward and one backward (the caching allocator reaches the same blocks
/// again by then; `tests/parallel.rs` checks the peaks are the same).
pub fn steady_microbatches(layout: &Layout, stage: u64) -> u64 {
    match layout.schedule {
        Schedule::Gpipe => layout.microbatches,
        Schedule::OneFOneB => layout.microbatches.min(layout.pp - stage + 2),
    }
}

/// As [`program`], running at most `max_microbatches` of the step's
/// micro-batches (the rest repeat what these did).
pub fn program_with(
    model: &Transformer,
    layout: &Layout,
    stage: u64,
    max_microbatches: Option<u64>,
) -> Program {
    let mut l = *layout;
    if let Some(m) = max_microbatches {
        l.microbatches = l.microbatches.min(m.max(1));
    }
    let in_flight_all = crate::formulas::in_flight(
        stage,
        layout.pp,
        layout.microbatches,
        layout.schedule == Schedule::Gpipe,
    );
    let l = &l;
    let (t, p, n) = (l.tp, l.pp, l.dp);
    let zero = l.sharding.stage();
    let mut units = vec![];
    let (first, last) = model.outer_modules(t, stage, p);
    if !first.is_empty() {
        units.push(Unit {
            modules: first,
            block: false,
            first: true,
            last: false,
            tied: 0,
        });
    }
    for _ in 0..model.layers / p {
        units.push(Unit {
            modules: model.block_modules(t),
            block: true,
            first: false,
            last: false,
            tied: 0,
        });
    }
    if !last.is_empty() {
        units.push(Unit {
            modules: last,
            block: false,
            first: false,
            last: true,
            tied: if p == 1 {
                model.vocab.div_ceil(t) * model.hidden
            } else {
                0
            },
        });
    }
    let stage_params = model.stage_params(t, stage, p);
    let mut b = Builder {
        model,
        l,
        ops: vec![],
        next: 0,
        gather_buffer: None,
    };
    let pb = l.precision.param_bytes();
    let mixed = l.precision == Precision::Mixed;
    let shard = |e: u64| if zero >= 1 { e.div_ceil(n) } else { e };
    // Construction: parameters (shards at stage 3), fp32 master weights
    // under mixed precision (shards from stage 1), DeepSpeed's fp32
    // gradient partition, DDP's buckets.
    for u in &units {
        for e in u.tensors() {
            let e = if zero == 3 { e.div_ceil(n) } else { e };
            b.alloc(e * pb, Kind::Parameters, "parameter");
        }
    }
    if mixed {
        for u in &units {
            for e in u.tensors() {
                b.alloc(shard(e) * 4, Kind::OptimizerStates, "fp32 master weight");
            }
        }
    }
    if l.fp32_grad_partition && zero >= 1 {
        let total: u64 = units.iter().flat_map(|u| u.tensors()).map(shard).sum();
        b.alloc(total * 4, Kind::OptimizerStates, "fp32 gradient partition");
    }
    let ddp = l.sharding == Sharding::Ddp && n > 1;
    let all: Vec<u64> = units.iter().flat_map(|u| u.tensors()).collect();
    // DDP's Reducer (PyTorch 2.x): with find_unused_parameters its buckets
    // are 1 MiB then bucket_cap_mb over the parameters in registration
    // order, for good; without it one bucket holds every gradient until
    // the second iteration rebuilds them in the order gradients arrived
    // (reverse registration here), 1 MiB then bucket_cap_mb.
    let cap = (l.ddp.bucket_cap_mb * 1024.0 * 1024.0) as u64;
    let sizes: Vec<u64> = all.iter().map(|e| e * pb).collect();
    let mut buckets = vec![];
    if ddp {
        let first = if l.ddp.find_unused {
            bucket_sizes(sizes.iter().copied(), &[1 << 20, cap])
        } else {
            vec![sizes.iter().sum()]
        };
        buckets = first
            .into_iter()
            .map(|s| b.alloc(s, Kind::Buckets, "ddp bucket"))
            .collect();
        if l.ddp.find_unused {
            b.alloc(
                4 * all.len() as u64,
                Kind::Buckets,
                "find_unused_parameters map",
            );
        }
    }
    let own_grads = !(ddp && l.ddp.bucket_view);
    let gathered = zero == 3;
    let fsdp = l.sharding == Sharding::Fsdp;
    // FSDP's root unit (the embeddings), gathered from its forward to its
    // backward.
    let mut root: Option<Vec<Option<u32>>> = None;
    let in_flight = in_flight_all;

    for step in 0..2 {
        if ddp && step == 1 && !l.ddp.find_unused {
            b.free_all(&mut buckets);
            buckets = bucket_sizes(sizes.iter().rev().copied(), &[1 << 20, cap])
                .into_iter()
                .map(|s| b.alloc(s, Kind::Buckets, "ddp bucket (rebuilt)"))
                .collect();
        }
        // Gradients live from their unit's first backward to zero_grad.
        let mut grads: Vec<Vec<Option<u32>>> = vec![vec![]; units.len()];
        // Saved activations of each micro-batch in flight, per unit.
        let mut saved: Vec<(u64, Vec<Vec<Option<u32>>>)> = vec![];
        let order = schedule(stage, p, l.microbatches, l.schedule);
        for (at, &(forward, mb)) in order.iter().enumerate() {
            if forward && order.get(at + 1).is_some_and(|next| !next.0) {
                b.ops.push(Op::Pair { next: b.next });
            }
            if forward {
                let mut per_unit = vec![];
                let mut prefetched: Option<Vec<Option<u32>>> = None;
                for (ui, u) in units.iter().enumerate() {
                    let mut gath = if !gathered || (ui == 0 && root.is_some()) {
                        vec![]
                    } else {
                        prefetched
                            .take()
                            .unwrap_or_else(|| gather(&mut b, u, l.sharding))
                    };
                    if fsdp {
                        if let Some(next) = units.get(ui + 1) {
                            prefetched = Some(gather(&mut b, next, l.sharding));
                        }
                    }
                    per_unit.push(forward_unit(&mut b, u, mb));
                    if fsdp && u.first && root.is_none() {
                        // FSDP2 leaves the root unit gathered after
                        // forward (reshard_after_forward is off for it).
                        root = Some(gath);
                    } else {
                        b.free_all(&mut gath);
                    }
                }
                saved.push((mb, per_unit));
            } else {
                let at = saved.iter().position(|(i, _)| *i == mb).unwrap_or(0);
                let mut per_unit = saved.remove(at).1;
                // The gradient of the stage's output, then of each unit's
                // input in turn (two live across a unit).
                let mut stream =
                    b.alloc(b.stream_bytes(), Kind::Temporaries, "activation gradient");
                let mut prefetched: Option<Vec<Option<u32>>> = None;
                // The tied head's gradient of the token table (one stage
                // holding both ends): autograd keeps it in the table's
                // InputBuffer from the head's backward until the
                // embedding's adds its own, then it becomes the gradient
                // (the first micro-batch of a step) or is added into it.
                let mut tied_pending: Option<Option<u32>> = None;
                for ui in (0..units.len()).rev() {
                    let u = &units[ui];
                    let kept_root = ui == 0 && root.is_some();
                    let mut gath = if !gathered || kept_root {
                        vec![]
                    } else {
                        prefetched
                            .take()
                            .unwrap_or_else(|| gather(&mut b, u, l.sharding))
                    };
                    // FSDP prefetches the unit backward reaches next.
                    if fsdp && ui > 0 && !(ui == 1 && root.is_some()) {
                        prefetched = Some(gather(&mut b, &units[ui - 1], l.sharding));
                    }
                    let next = b.alloc(b.stream_bytes(), Kind::Temporaries, "activation gradient");
                    let becomes_grad = own_grads && zero < 2 && grads[0].is_empty();
                    let pending = backward_unit(
                        &mut b,
                        u,
                        &mut per_unit[ui],
                        if becomes_grad {
                            Kind::Gradients
                        } else {
                            Kind::Temporaries
                        },
                    );
                    tied_pending = tied_pending.or(pending);
                    // The first unit's first tensor is the token table; its
                    // own gradient (embedding_dense_backward's) is added
                    // into the head's and freed.
                    let mut tied = if ui == 0 { tied_pending.take() } else { None };
                    if tied.is_some() {
                        let own = b.alloc(
                            u.tensors().next().unwrap_or(0) * pb,
                            Kind::Temporaries,
                            "embedding's gradient of the token table",
                        );
                        b.free(own);
                    }
                    // This unit's parameter gradients.
                    if zero >= 2 {
                        let whole: Vec<Option<u32>> = u
                            .tensors()
                            .map(|e| match tied.take() {
                                Some(g) => g,
                                None => b.alloc(
                                    e * pb,
                                    Kind::Temporaries,
                                    "gradient before reduce-scatter",
                                ),
                            })
                            .collect();
                        if grads[ui].is_empty() {
                            grads[ui] = u
                                .tensors()
                                .map(|e| {
                                    b.alloc(e.div_ceil(n) * pb, Kind::Gradients, "gradient shard")
                                })
                                .collect();
                        }
                        let mut whole = whole;
                        b.free_all(&mut whole);
                    } else if own_grads && grads[ui].is_empty() {
                        grads[ui] = u
                            .tensors()
                            .map(|e| match tied.take() {
                                Some(g) => g,
                                None => b.alloc(e * pb, Kind::Gradients, "gradient"),
                            })
                            .collect();
                    }
                    // Added into the gradient (or a bucket) and gone.
                    if let Some(g) = tied {
                        b.free(g);
                    }
                    b.free_all(&mut gath);
                    b.free(stream);
                    stream = next;
                }
                b.free(stream);
                // The root unit is resharded when the micro-batch's
                // backward is done with it.
                if let Some(mut r) = root.take() {
                    b.free_all(&mut r);
                }
            }
        }
        let last = b.gather_buffer.take();
        b.free(last);
        // The optimizer step: Adam's moments on the first (fp32; shards
        // from stage 1).
        if step == 0 {
            for &e in &all {
                b.alloc(shard(e) * 4, Kind::OptimizerStates, "adam exp_avg");
                b.alloc(shard(e) * 4, Kind::OptimizerStates, "adam exp_avg_sq");
            }
        }
        // fp32 runs PyTorch's Adam(foreach=True), whose step holds one
        // fp32 temporary of every parameter at once (sqrt of exp_avg_sq);
        // mixed precision runs a fused Adam (DeepSpeed's, Megatron's).
        if l.precision == Precision::Fp32 {
            let mut temp: Vec<Option<u32>> = all
                .iter()
                .map(|&e| {
                    b.alloc(
                        shard(e) * 4,
                        Kind::Temporaries,
                        "foreach adam: sqrt(exp_avg_sq)",
                    )
                })
                .collect();
            b.free_all(&mut temp);
        }
        if step == 1 {
            b.ops.push(Op::StatesLive);
        }
        // zero_grad(set_to_none=True).
        for mut g in grads {
            b.free_all(&mut g);
        }
    }
    Program {
        stage,
        ops: b.ops,
        stage_params,
        in_flight,
        buckets_are_gradients: ddp && l.ddp.bucket_view,
    }
}

/// DDP's bucket assignment (`compute_bucket_assignment_by_size`): each
/// gradient joins the open bucket, which closes once it reaches its limit;
/// the limits run through `limits`, the last repeating.
fn bucket_sizes(sizes: impl Iterator<Item = u64>, limits: &[u64]) -> Vec<u64> {
    let mut out = vec![];
    let mut fill = 0;
    for s in sizes {
        fill += s;
        if fill >= limits[out.len().min(limits.len() - 1)] {
            out.push(fill);
            fill = 0;
        }
    }
    if fill > 0 {
        out.push(fill);
    }
    out
}

/// ZeRO-3 gathers a unit's modules one at a time (only the largest's size
/// is modelled: one module live), FSDP the whole unit at once.
fn gather(b: &mut Builder, u: &Unit, sharding: Sharding) -> Vec<Option<u32>> {
    let pb = b.l.precision.param_bytes();
    match sharding {
        Sharding::Fsdp => {
            // FSDP2 all-gathers into one flat buffer, copies it out into
            // the parameters, and frees the buffer at the next all-gather.
            let bytes = u.tensors().sum::<u64>() * pb;
            let buffer = b.alloc(bytes, Kind::CommBuffers, "fsdp all-gather output");
            let last = std::mem::replace(&mut b.gather_buffer, buffer);
            b.free(last);
            vec![b.alloc(bytes, Kind::Gathered, "all-gathered block")]
        }
        _ => {
            let largest = u
                .modules
                .iter()
                .map(Module::numel)
                .max()
                .unwrap_or(0)
                .max(u.tied);
            vec![b.alloc(largest * pb, Kind::Gathered, "all-gathered module")]
        }
    }
}

/// A unit's forward for one micro-batch: what it saves.
fn forward_unit(b: &mut Builder, u: &Unit, _mb: u64) -> Vec<Option<u32>> {
    let mut kept = vec![];
    let l = b.l;
    if u.first {
        kept.push(b.alloc(
            l.seq * l.micro_batch * 8,
            Kind::OuterActivations,
            "token ids",
        ));
        if l.dropout {
            let mask = b.stream_bytes() / l.precision.activation_bytes();
            kept.push(b.alloc(mask, Kind::OuterActivations, "embedding dropout mask"));
        }
    }
    if u.block {
        for (i, term) in TERMS.iter().enumerate() {
            // A fused attention never stores the scores; without dropout
            // nothing of dropout's is saved.
            if (term.core && l.flash_attention) || (!l.dropout && term.only_with_dropout()) {
                continue;
            }
            let keep = match l.recompute {
                Recompute::None => true,
                Recompute::Selective => !term.core,
                Recompute::Full => i == 0,
            };
            // Sequence parallelism gathers the LayerNorms' outputs whole
            // before the column-parallel linears.
            let gathered = if matches!(term.label, "qkv input" | "fc input") {
                b.alloc(
                    b.gather_bytes(),
                    Kind::CommBuffers,
                    "sequence-parallel all-gather",
                )
            } else {
                None
            };
            if keep {
                let bytes = b.term_bytes(term);
                kept.push(b.alloc(bytes, Kind::Activations, term.label));
                if l.flash_attention && term.label == "v" {
                    let lse = b.lse_bytes();
                    kept.push(b.alloc(lse, Kind::Activations, "attention log-sum-exp (fp32)"));
                }
            } else {
                let bytes = b.term_bytes(term);
                let tmp = b.alloc(bytes, Kind::Temporaries, "not saved (recomputed)");
                b.free(tmp);
            }
            b.free(gathered);
            // ... and reduce-scatters the row-parallel linears' whole
            // outputs back to sequence shards.
            if matches!(
                term.label,
                "attention projection input" | "mlp projection input"
            ) {
                let whole = b.alloc(
                    b.gather_bytes(),
                    Kind::CommBuffers,
                    "sequence-parallel reduce-scatter input",
                );
                b.free(whole);
            }
        }
    }
    if u.last {
        kept.push(b.alloc(b.stream_bytes(), Kind::OuterActivations, "ln_f input"));
        // PyTorch's F.cross_entropy saves the fp32 logits and their
        // log-probabilities (lesson X01).
        let logits = b.logits_bytes();
        kept.push(b.alloc(logits, Kind::OuterActivations, "logits (fp32 for the loss)"));
        kept.push(b.alloc(logits, Kind::OuterActivations, "log-probabilities"));
    }
    kept
}

/// A unit's backward for one micro-batch: recomputed activations live
/// while it runs, the attention scores' gradient inside it; then its saved
/// tensors go. The head's unit returns the tied head's gradient of the
/// token table where it holds no copy of its own (one stage), allocated as
/// `tied_kind`: it waits for the embedding's.
fn backward_unit(
    b: &mut Builder,
    u: &Unit,
    saved: &mut Vec<Option<u32>>,
    tied_kind: Kind,
) -> Option<Option<u32>> {
    let l = b.l;
    let mut tied = None;
    if u.last {
        // The loss's backward: the log-probabilities' gradient, then the
        // logits' (the first freed once the second exists); the head's
        // weight gradient is made while the logits' gradient lives.
        let bytes = b.logits_bytes();
        let log_probs = b.alloc(bytes, Kind::Temporaries, "log-probabilities' gradient");
        let logits = b.alloc(bytes, Kind::Temporaries, "logits' gradient");
        b.free(log_probs);
        if u.tied > 0 {
            let pb = l.precision.param_bytes();
            tied = Some(b.alloc(
                u.tied * pb,
                tied_kind,
                "tied head's gradient of the token table",
            ));
        }
        b.free(logits);
    }
    if u.block {
        let mut again = vec![];
        for (i, term) in TERMS.iter().enumerate() {
            let redo = match l.recompute {
                Recompute::None => false,
                Recompute::Selective => term.core,
                Recompute::Full => i > 0,
            } && !(term.core && l.flash_attention)
                && (l.dropout || !term.only_with_dropout());
            if redo {
                let bytes = b.term_bytes(term);
                again.push(b.alloc(bytes, Kind::Temporaries, "recomputed activation"));
            }
        }
        let gathered = b.alloc(
            b.gather_bytes(),
            Kind::CommBuffers,
            "sequence-parallel all-gather",
        );
        if !l.flash_attention {
            let scores = TERMS[3];
            let g = b.alloc(
                b.term_bytes(&scores),
                Kind::Temporaries,
                "attention scores' gradient",
            );
            b.free(g);
        }
        b.free(gathered);
        b.free_all(&mut again);
    }
    b.free_all(saved);
    tied
}
