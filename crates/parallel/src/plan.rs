//! The layouts of a GPU count that fit a memory size, each with the
//! per-rank peak of its worst pipeline stage and a stated cost.

use crate::layout::{Ddp, Layout, Precision, Recompute, Schedule, Sharding};
use crate::model::Transformer;
use crate::pool;
use crate::rank::{program_with, steady_microbatches};
use crate::replay::{run, RankReport};
use serde::Serialize;
use vramlab_alloc::AllocatorConfig;

/// What to search.
#[derive(Debug, Clone)]
pub struct Request {
    pub model: Transformer,
    pub gpus: u64,
    /// Bytes a GPU gives the process.
    pub memory: u64,
    /// Fraction of `memory` to leave free (0.1: use at most 90%).
    pub headroom: f64,
    pub seq: u64,
    pub global_batch: u64,
    pub precision: Precision,
    /// Recomputation choices to consider.
    pub recompute: Vec<Recompute>,
    /// Largest tensor-parallel size (GPUs a node: NVLink).
    pub max_tp: u64,
    /// Fused attention in every layout ([`Layout::flash_attention`]).
    pub flash_attention: bool,
    /// Dropout in the model ([`Layout::dropout`]).
    pub dropout: bool,
    pub costs: Costs,
    pub config: AllocatorConfig,
}

impl Request {
    /// What a layout's peak reserved must stay under: `memory` less the
    /// headroom, or the allocator's own limit (`--memory-limit`) where that
    /// is less; and whether that limit is the one that binds.
    pub fn limit(&self) -> (u64, bool) {
        let room = (self.memory as f64 * (1.0 - self.headroom)) as u64;
        match self.config.memory_limit {
            Some(cap) if cap < room => (cap, true),
            _ => (room, false),
        }
    }
}

/// The cost model's rates.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Costs {
    /// Achieved 16-bit matrix FLOP/s a GPU.
    pub flops: f64,
    /// Bytes/s a GPU inside a node (tensor parallelism).
    pub intra_bw: f64,
    /// Bytes/s a GPU between nodes (data and pipeline parallelism).
    pub inter_bw: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            flops: 400e12,
            intra_bw: 450e9,
            inter_bw: 50e9,
        }
    }
}

/// One layout and what it needs.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub layout: Layout,
    /// The stage with the highest peak reserved.
    pub worst: RankReport,
    /// Whether every stage's whole step was replayed (else the screening
    /// replays of [`worst_stage`]).
    pub whole: bool,
    pub fits: bool,
    /// `memory` less the headroom, minus the worst stage's peak reserved
    /// (negative: short by that much).
    pub memory_left: i64,
    /// Bytes a GPU sends per step: data parallel, tensor parallel, pipeline
    /// (in JSON an object naming each).
    #[serde(serialize_with = "comm_named")]
    pub comm_bytes: [f64; 3],
    /// Idle fraction of a pipeline step: (p − 1)/(m + p − 1).
    pub bubble: f64,
    /// compute / (1 − bubble) + communication, in seconds (no overlap).
    pub step_seconds: f64,
}

/// The divisors of `n` up to `most` (at most the model's heads or layers:
/// a few hundred numbers, whatever `n` is).
fn divisors_to(n: u64, most: u64) -> Vec<u64> {
    (1..=most.min(n)).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Every layout of `r.gpus` GPUs (tensor ≤ `max_tp`, with sequence
/// parallelism where the sequence divides by it, which only saves memory,
/// plain Megatron tensor parallelism otherwise; pipeline under 1F1B; data
/// parallel with DDP, ZeRO 1–3 or FSDP; each recomputation; micro-batches
/// of 1, 2, 4 and 8), evaluated.
pub fn layouts(r: &Request) -> Vec<Layout> {
    let m = &r.model;
    let mut out = vec![];
    for tp in divisors_to(r.gpus, r.max_tp.min(m.heads)) {
        if !m.heads.is_multiple_of(tp) || !m.hidden.is_multiple_of(tp) {
            continue;
        }
        let sp = tp > 1 && r.seq.is_multiple_of(tp);
        for pp in divisors_to(r.gpus / tp, m.layers) {
            if !m.layers.is_multiple_of(pp) {
                continue;
            }
            let dp = r.gpus / tp / pp;
            let shardings: &[Sharding] = if dp == 1 {
                &[Sharding::Ddp]
            } else {
                &[
                    Sharding::Ddp,
                    Sharding::Zero(1),
                    Sharding::Zero(2),
                    Sharding::Zero(3),
                    Sharding::Fsdp,
                ]
            };
            for &sharding in shardings {
                for &recompute in &r.recompute {
                    for mb in [1, 2, 4, 8] {
                        if !r.global_batch.is_multiple_of(dp * mb) {
                            continue;
                        }
                        out.push(Layout {
                            dp,
                            tp,
                            sp,
                            pp,
                            sharding,
                            ddp: Ddp::default(),
                            micro_batch: mb,
                            microbatches: r.global_batch / (dp * mb),
                            seq: r.seq,
                            schedule: Schedule::OneFOneB,
                            recompute,
                            precision: r.precision,
                            fp32_grad_partition: false,
                            flash_attention: r.flash_attention,
                            dropout: r.dropout,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The stage that reserves most. Screening (`whole` false) replays the
/// first stage (most micro-batches in flight, the embeddings) and the last
/// (the head, the logits), running 1F1B's repeating steady state only for
/// two pairs past the warm-up ([`steady_microbatches`]): allocated comes
/// out the same and reserved never higher than the whole step's (a property
/// test checks both). `whole` replays every stage's whole step (the first,
/// second and last past 16 stages), as `estimate` does.
pub fn worst_stage(
    model: &Transformer,
    l: &Layout,
    config: &AllocatorConfig,
    capacity: Option<u64>,
    whole: bool,
) -> RankReport {
    worst_of(
        replayed_stages(l, whole)
            .into_iter()
            .map(|s| replay_stage(model, l, s, config, capacity, whole)),
    )
}

/// The stages [`worst_stage`] replays.
fn replayed_stages(l: &Layout, whole: bool) -> Vec<u64> {
    match (whole, l.pp) {
        (true, p) => whole_stages(p),
        (false, 1) => vec![0],
        (false, p) => vec![0, p - 1],
    }
}

/// One stage's replay as [`worst_stage`] runs it.
fn replay_stage(
    model: &Transformer,
    l: &Layout,
    stage: u64,
    config: &AllocatorConfig,
    capacity: Option<u64>,
    whole: bool,
) -> RankReport {
    let most = (!whole).then(|| steady_microbatches(l, stage));
    run(&program_with(model, l, stage, most), capacity, config)
}

/// The worst of a layout's stage replays, given in stage order.
fn worst_of(reports: impl Iterator<Item = RankReport>) -> RankReport {
    reports
        // A stage that ran out of memory is the worst whatever its peak
        // (it stopped early, so its peak is lower than a whole one's).
        .max_by_key(|r| (r.oom.is_some(), r.peak_reserved))
        .expect("at least one stage")
}

/// The stages whose whole steps `estimate` and `plan`'s answers replay:
/// every one up to 16, else the first, the second and the last (the rest
/// hold fewer micro-batches than the second and the same layers).
pub fn whole_stages(pp: u64) -> Vec<u64> {
    if pp <= 16 {
        (0..pp).collect()
    } else {
        vec![0, 1, pp - 1]
    }
}

/// `comm_bytes` in JSON: each figure named.
fn comm_named<S: serde::Serializer>(c: &[f64; 3], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(3))?;
    m.serialize_entry("data_parallel", &c[0])?;
    m.serialize_entry("tensor_parallel", &c[1])?;
    m.serialize_entry("pipeline", &c[2])?;
    m.end()
}

/// Communication bytes a GPU sends per step, by kind, each collective a
/// ring's (N−1)/N of what it moves. Data parallel: DDP and ZeRO-1 reduce
/// the gradients once a step and (ZeRO-1) gather the parameters once, two
/// collectives; ZeRO-2 keeps only its gradient shard, so it
/// reduce-scatters after every micro-batch's backward (as the replay
/// frees the whole gradient there), m + 1; ZeRO-3 and FSDP also gather the
/// parameters for each micro-batch's forward and backward, 3m. Tensor
/// parallel: four all-reduces (or all-gathers and reduce-scatters) of a
/// layer's s·b·h a micro-batch, six under full recomputation (its forward
/// runs twice). Pipeline: a micro-batch's s·b·h forward and back across
/// each stage boundary.
pub fn comm_bytes(model: &Transformer, l: &Layout) -> [f64; 3] {
    let ab = l.precision.activation_bytes() as f64;
    let pb = l.precision.param_bytes() as f64;
    let psi = model.stage_params(l.tp, 0, l.pp) as f64;
    let (n, t, m) = (l.dp as f64, l.tp as f64, l.microbatches as f64);
    let ring = (n - 1.0) / n;
    let collectives = match l.sharding.stage() {
        3 => 3.0 * m,
        2 => m + 1.0,
        _ => 2.0,
    };
    let dp = collectives * ring * psi * pb;
    let sbh = l.seq as f64 * l.micro_batch as f64 * model.hidden as f64 * ab;
    let layers = (model.layers / l.pp) as f64;
    let passes = match l.recompute {
        Recompute::Full => 6.0,
        _ => 4.0,
    };
    let tp = passes * 2.0 * (t - 1.0) / t * sbh * layers * m;
    let split = if l.sp { t } else { 1.0 };
    let pp = if l.pp > 1 { 2.0 * sbh / split * m } else { 0.0 };
    [dp, tp, pp]
}

/// What [`search`] evaluated, and the layouts it enumerated but could not
/// model (so a search that finds nothing can say why).
#[derive(Debug, Clone)]
pub struct Searched {
    /// Fitting ones first by estimated step time, then the others by how
    /// far they are from fitting.
    pub candidates: Vec<Candidate>,
    /// Enumerated layouts [`Layout::check`] refused, with its reason: past
    /// [`crate::layout::MAX_LAYER_PASSES`], or sizes too large to model.
    pub skipped: Vec<(Layout, crate::layout::LayoutError)>,
}

impl Searched {
    /// The skipped layouts whose micro-batches were too many to replay
    /// ([`Layout::past_layer_passes`]).
    pub fn past_layer_passes<'a>(
        &'a self,
        model: &'a Transformer,
    ) -> impl Iterator<Item = &'a Layout> + 'a {
        self.skipped
            .iter()
            .map(|(l, _)| l)
            .filter(move |l| l.past_layer_passes(model))
    }
}

/// Evaluates every layout with the screening replays, then replays whole
/// the `confirm` best that fit, in order, until that many still fit (each
/// one's figures are then `estimate`'s); fitting ones first by estimated
/// step time, then the others by how far they are from fitting.
pub fn search(r: &Request, confirm: usize) -> Searched {
    let (mut all, mut skipped) = (vec![], vec![]);
    for l in layouts(r) {
        match l.check(&r.model) {
            Ok(()) => all.push(l),
            Err(e) => skipped.push((l, e)),
        }
    }
    let (limit, _) = r.limit();
    let mut out = pool::map(&all, |l| {
        candidate(
            r,
            l,
            limit,
            false,
            worst_stage(&r.model, l, &r.config, None, false),
        )
    });
    sort(&mut out);
    // Whole replays never reserve less: a layout that fitted may not, one
    // that did not still does not. The first `confirm` are replayed whole
    // whatever they are (what is listed), then fitting ones until
    // `confirm` of them still fit.
    // They go in rounds, each on every core: a round takes the candidates
    // that rule reaches next whatever the replays say (up to `confirm` −
    // confirmed, and past the first `confirm` none from one the screening
    // did not fit), so the answer is the one-at-a-time answer.
    let (mut confirmed, mut i) = (0, 0);
    while confirmed < confirm && i < out.len() {
        let mut end = i;
        while end < out.len() && end - i < confirm - confirmed && (end < confirm || out[end].fits) {
            end += 1;
        }
        if end == i {
            break;
        }
        let jobs: Vec<(usize, u64)> = (i..end)
            .flat_map(|c| {
                replayed_stages(&out[c].layout, true)
                    .into_iter()
                    .map(move |s| (c, s))
            })
            .collect();
        let mut reports = pool::map(&jobs, |&(c, s)| {
            replay_stage(&r.model, &out[c].layout, s, &r.config, None, true)
        })
        .into_iter();
        for c in &mut out[i..end] {
            let n = replayed_stages(&c.layout, true).len();
            let worst = worst_of(reports.by_ref().take(n));
            *c = candidate(r, &c.layout, limit, true, worst);
            confirmed += usize::from(c.fits);
        }
        i = end;
    }
    sort(&mut out);
    Searched {
        candidates: out,
        skipped,
    }
}

fn sort(out: &mut [Candidate]) {
    out.sort_by(|a, b| {
        b.fits
            .cmp(&a.fits)
            .then(b.whole.cmp(&a.whole))
            .then(if a.fits {
                a.step_seconds.total_cmp(&b.step_seconds)
            } else {
                std::cmp::Ordering::Equal
            })
            // Of those that do not fit, the ones that ran out of memory
            // come last: their peak is where they stopped, not a need.
            .then(a.worst.oom.is_some().cmp(&b.worst.oom.is_some()))
            .then(b.memory_left.cmp(&a.memory_left))
    });
}

/// A layout's figures from its worst stage's replay.
fn candidate(r: &Request, l: &Layout, limit: u64, whole: bool, worst: RankReport) -> Candidate {
    // A replay stopped by out-of-memory peaked where it stopped: no fit.
    let fits = worst.oom.is_none() && worst.peak_reserved <= limit;
    let comm = comm_bytes(&r.model, l);
    let (p, m) = (l.pp as f64, l.microbatches as f64);
    let bubble = (p - 1.0) / (m + p - 1.0);
    let tokens = l.global_batch() as f64 * l.seq as f64;
    let redo = match l.recompute {
        Recompute::Full => 4.0 / 3.0,
        _ => 1.0,
    };
    let compute = 6.0 * r.model.params() as f64 * tokens / r.gpus as f64 * redo / r.costs.flops;
    let step_seconds = compute / (1.0 - bubble)
        + (comm[0] + comm[2]) / r.costs.inter_bw
        + comm[1] / r.costs.intra_bw;
    Candidate {
        layout: *l,
        whole,
        memory_left: limit as i64 - worst.peak_reserved as i64,
        worst,
        fits,
        comm_bytes: comm,
        bubble,
        step_seconds,
    }
}
