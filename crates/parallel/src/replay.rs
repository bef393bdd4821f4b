//! A rank's program through vramlab-alloc's PyTorch caching allocator:
//! peak allocated and reserved, what each kind holds at the peak, and the
//! model states when they are all live.

use crate::periods::{Live, Periods};
use crate::rank::{Kind, Op, Program, KINDS};
use serde::Serialize;
use vramlab_alloc::{AllocatorConfig, CachingAllocator, Category, SimulatedSource};

/// What a rank's two steps need.
#[derive(Debug, Clone, Serialize)]
pub struct RankReport {
    pub stage: u64,
    pub stage_params: u64,
    pub in_flight: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Requested bytes of each kind (in [`KINDS`] order) when allocated
    /// bytes peaked.
    pub at_peak: Vec<(Kind, u64)>,
    /// What the blocks held beyond those requests at the peak: the 512 B
    /// rounding, and the tail of a large block too small to split off
    /// (under 1 MiB), which PyTorch counts as allocated. With `at_peak` it
    /// sums to `peak_allocated`.
    pub block_rounding_at_peak: u64,
    /// The highest requested bytes each kind reached on its own.
    pub kind_peaks: Vec<(Kind, u64)>,
    /// Parameters, gradients and optimizer states right before the last
    /// step's `zero_grad` (all live): the ZeRO paper's model states (DDP's
    /// buckets counted where they are the gradients). 0 when the replay
    /// ran out of memory before that moment.
    pub model_states: u64,
    /// The allocation that did not fit the capacity, if one did not.
    pub oom: Option<String>,
    /// Steady pairs not replayed because they repeat the ones before
    /// (the figures are the same as with every op replayed).
    pub pairs_skipped: u64,
}

fn category(k: Kind) -> Category {
    match k {
        Kind::Parameters | Kind::Gathered => Category::Parameter,
        Kind::Gradients => Category::Gradient,
        Kind::OptimizerStates => Category::OptimizerState,
        Kind::Activations | Kind::OuterActivations => Category::Activation,
        Kind::Temporaries | Kind::CommBuffers => Category::Temporary,
        Kind::Buckets => Category::Workspace,
    }
}

/// Replays `program` on a device of `capacity` bytes (unlimited if
/// `None`) under `config`. A run of 1F1B's steady pairs whose allocator
/// state repeats is replayed once and skipped after ([`Periods`]): the
/// figures are the every-op replay's ([`run_every_op`]), to the byte.
pub fn run(program: &Program, capacity: Option<u64>, config: &AllocatorConfig) -> RankReport {
    replay(program, capacity, config, true)
}

/// [`run`] without skipping repeated periods: every op through the
/// allocator (what a property test holds `run` to).
pub fn run_every_op(
    program: &Program,
    capacity: Option<u64>,
    config: &AllocatorConfig,
) -> RankReport {
    replay(program, capacity, config, false)
}

fn replay(
    program: &Program,
    capacity: Option<u64>,
    config: &AllocatorConfig,
    skip: bool,
) -> RankReport {
    let source = match capacity {
        Some(c) => SimulatedSource::new(c),
        None => SimulatedSource::unlimited(),
    };
    let mut alloc = CachingAllocator::new(source, config.clone());
    let mut live: Vec<Live> = vec![];
    let mut by_kind = [0u64; KINDS.len()];
    let mut kind_peaks = [0u64; KINDS.len()];
    let mut at_peak = by_kind;
    let mut rounding_at_peak = 0u64;
    let mut peak = 0i64;
    let mut model_states = 0;
    let mut oom = None;
    let mut periods = Periods::new(program.in_flight + 2);
    let ops = &program.ops;
    let mut i = 0;
    while i < ops.len() {
        match ops[i] {
            Op::Alloc {
                id,
                bytes,
                kind,
                label,
            } => {
                match alloc.malloc_tagged(bytes, label, category(kind), None) {
                    Ok(a) => {
                        let id = id as usize;
                        if live.len() <= id {
                            live.resize(id + 1, None);
                        }
                        live[id] = Some((a.handle, bytes, kind, a.address));
                        periods.born(id as u32);
                        let k = kind.index();
                        by_kind[k] += bytes;
                        kind_peaks[k] = kind_peaks[k].max(by_kind[k]);
                    }
                    Err(e) => {
                        oom = Some(format!("{label} ({}): {e}", kind.name()));
                        break;
                    }
                }
                let now = alloc.stats().allocated_bytes.0[0].current;
                if now > peak {
                    peak = now;
                    at_peak = by_kind;
                    rounding_at_peak = (now as u64).saturating_sub(by_kind.iter().sum());
                }
            }
            Op::Free { id } => {
                periods.died(id);
                if let Some((h, bytes, kind, _)) = live.get_mut(id as usize).and_then(Option::take)
                {
                    by_kind[kind.index()] -= bytes;
                    // A handle from this allocator, freed once: cannot fail.
                    let _ = alloc.free(h);
                }
            }
            Op::StatesLive => {
                model_states = KINDS
                    .iter()
                    .filter(|k| {
                        k.model_state() || (program.buckets_are_gradients && **k == Kind::Buckets)
                    })
                    .map(|k| by_kind[k.index()])
                    .sum();
            }
            Op::Pair { next } => {
                if skip {
                    if let Some(to) = periods.at_pair(ops, i, next, &alloc, &mut live) {
                        i = to;
                        continue;
                    }
                }
            }
        }
        i += 1;
    }
    let s = alloc.stats();
    RankReport {
        stage: program.stage,
        stage_params: program.stage_params,
        in_flight: program.in_flight,
        peak_allocated: s.allocated_bytes.0[0].peak.max(0) as u64,
        peak_reserved: s.reserved_bytes.0[0].peak.max(0) as u64,
        at_peak: KINDS.iter().map(|&k| (k, at_peak[k.index()])).collect(),
        block_rounding_at_peak: rounding_at_peak,
        kind_peaks: KINDS.iter().map(|&k| (k, kind_peaks[k.index()])).collect(),
        model_states,
        oom,
        pairs_skipped: periods.skipped(),
    }
}
