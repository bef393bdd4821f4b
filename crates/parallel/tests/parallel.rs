//! Per-rank programs against the closed forms: the ZeRO paper's model
//! states, DeepSpeed's estimators (fixtures from
//! scripts/deepspeed_reference.py), Korthikanti et al.'s table 2, the
//! pipeline schedules' micro-batches in flight, DDP's buckets.

use proptest::prelude::*;
use vramlab_alloc::AllocatorConfig;
use vramlab_parallel::formulas::{
    dropout_layer, flash_layer, in_flight, korthikanti_layer, zero_model_states,
};
use vramlab_parallel::rank::{program, program_with, steady_microbatches, Kind};
use vramlab_parallel::replay::{run, RankReport};
use vramlab_parallel::{Ddp, Layout, Precision, Recompute, Schedule, Sharding, Transformer};

fn model(layers: u64, heads: u64, hidden: u64, positions: u64, vocab: u64) -> Transformer {
    Transformer {
        layers,
        heads,
        hidden,
        positions,
        vocab,
    }
}

/// A plan request for a small model under a 10% headroom, 128 tokens, mixed
/// precision, up to 8-way tensor parallelism and PyTorch's allocator.
fn request(
    model: Transformer,
    gpus: u64,
    memory: u64,
    global_batch: u64,
    recompute: Vec<Recompute>,
) -> vramlab_parallel::plan::Request {
    vramlab_parallel::plan::Request {
        model,
        gpus,
        memory,
        headroom: 0.1,
        seq: 128,
        global_batch,
        precision: Precision::Mixed,
        recompute,
        max_tp: 8,
        flash_attention: false,
        dropout: true,
        costs: vramlab_parallel::plan::Costs::default(),
        config: AllocatorConfig::default(),
    }
}

fn replay(m: &Transformer, l: &Layout, stage: u64) -> RankReport {
    run(&program(m, l, stage), None, &AllocatorConfig::default())
}

fn kind(r: &RankReport, k: Kind) -> u64 {
    r.kind_peaks
        .iter()
        .find(|(x, _)| *x == k)
        .map_or(0, |p| p.1)
}

fn sharding(stage: u8) -> Sharding {
    if stage == 0 {
        Sharding::Ddp
    } else {
        Sharding::Zero(stage)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Model states per rank (parameters, gradients, optimizer states, all
    /// live before zero_grad) equal (2 + 2 + K)Ψ, (2 + 2)Ψ + KΨ/N,
    /// 2Ψ + (2 + K)Ψ/N and (2 + 2 + K)Ψ/N, with Ψ the stage's parameters on
    /// a tensor rank; sizes chosen so every tensor splits evenly.
    #[test]
    fn model_states_equal_the_zero_papers_formulas(
        layers in 1u64..5, heads in prop::sample::select(vec![4u64, 8]), k in 1u64..4,
        vocab64 in 1u64..40, dp in prop::sample::select(vec![1u64, 2, 4, 8]),
        tp in prop::sample::select(vec![1u64, 2, 4]), stage in 0u8..4, fp32 in any::<bool>(),
        fsdp in any::<bool>(),
    ) {
        let m = model(layers, heads, 64 * k * 4, 256, 64 * vocab64);
        let precision = if fp32 { Precision::Fp32 } else { Precision::Mixed };
        let mut l = Layout { dp, tp, precision, sharding: sharding(stage), ..Layout::single(1, 32) };
        if stage == 3 && fsdp {
            l.sharding = Sharding::Fsdp;
        }
        l.check(&m).unwrap();
        let r = replay(&m, &l, 0);
        let psi = m.stage_params(tp, 0, 1);
        let want = zero_model_states(psi, dp, l.sharding.stage(), precision);
        prop_assert_eq!(r.model_states as f64, want, "{:?}", l);
    }

    /// Each layer's saved activations equal table 2 of Korthikanti et al.
    /// (16-bit activations, 1-byte masks), for every combination of tensor
    /// and sequence parallelism and recomputation; the saved-activation
    /// peak of one micro-batch is the layers times that.
    #[test]
    fn layer_activations_equal_korthikanti_table_2(
        layers in 1u64..4, heads in prop::sample::select(vec![4u64, 8, 16]), k in 1u64..3,
        seq8 in 1u64..12, b in 1u64..4, tp in prop::sample::select(vec![1u64, 2, 4]),
        sp in any::<bool>(), r in prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Full]),
        dropout in any::<bool>(),
    ) {
        let m = model(layers, heads, 64 * k, 128, 512);
        let sp = sp && tp > 1;
        let l = Layout { tp, sp, recompute: r, dropout, ..Layout::single(b, 8 * seq8) };
        l.check(&m).unwrap();
        // Without dropout, the table less its dropout terms.
        let less = |flash| {
            if dropout {
                0.0
            } else {
                dropout_layer(&Layout { flash_attention: flash, ..l }, m.hidden, m.heads)
            }
        };
        let rep = replay(&m, &l, 0);
        let per_layer = korthikanti_layer(l.seq, b, m.hidden, m.heads, tp, sp, r) - less(false);
        prop_assert_eq!(kind(&rep, Kind::Activations) as f64, layers as f64 * per_layer, "{:?}", l);
        // Fused attention: the scores' terms gone, a log-sum-exp per row.
        let fused = Layout { flash_attention: true, ..l };
        let rep = replay(&m, &fused, 0);
        let per_layer = flash_layer(l.seq, b, m.hidden, m.heads, tp, sp, r) - less(true);
        prop_assert_eq!(kind(&rep, Kind::Activations) as f64, layers as f64 * per_layer, "{:?}", fused);
        prop_assert!(kind(&rep, Kind::Temporaries) <= kind(&replay(&m, &l, 0), Kind::Temporaries));
        // The embedding's mask only with dropout: one byte a token and feature.
        let outer = kind(&replay(&m, &l, 0), Kind::OuterActivations);
        let with = kind(&replay(&m, &Layout { dropout: true, ..l }, 0), Kind::OuterActivations);
        if dropout { prop_assert_eq!(with, outer); } else { prop_assert!(with > outer, "{} {}", with, outer); }
    }

    /// Pipeline stage i holds the activations of min(p − i, m) micro-batches
    /// under 1F1B and of all m under GPipe.
    #[test]
    fn stages_hold_the_micro_batches_their_schedule_keeps_in_flight(
        pp in prop::sample::select(vec![1u64, 2, 4]), per in 1u64..3, mbs in 1u64..9, gpipe in any::<bool>(),
    ) {
        let m = model(pp * per, 4, 64, 64, 256);
        let schedule = if gpipe { Schedule::Gpipe } else { Schedule::OneFOneB };
        let l = Layout { pp, microbatches: mbs, schedule, ..Layout::single(1, 32) };
        l.check(&m).unwrap();
        let one = korthikanti_layer(32, 1, 64, 4, 1, false, Recompute::None) * per as f64;
        for stage in 0..pp {
            let r = replay(&m, &l, stage);
            let n = in_flight(stage, pp, mbs, gpipe);
            prop_assert_eq!(kind(&r, Kind::Activations) as f64, n as f64 * one, "stage {} of {:?}", stage, l);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Under 1F1B, running only the warm-up and two steady pairs of
    /// micro-batches gives the whole step's peak allocated and model
    /// states, and a peak reserved never above the whole step's (more
    /// pairs can fragment the cache further: `plan` screens with it and
    /// replays its answers whole).
    #[test]
    fn a_1f1b_stage_peaks_within_its_first_steady_pairs(
        pp in prop::sample::select(vec![1u64, 2, 4]), per in 1u64..3, mbs in 1u64..24,
        b in 1u64..3, stage_pick in 0u64..4, zero in 0u8..5, tp in prop::sample::select(vec![1u64, 2]),
        r in prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Full]),
        dp in prop::sample::select(vec![1u64, 4]), view in any::<bool>(), flash in any::<bool>(),
    ) {
        let m = model(pp * per, 4, 128, 128, 1000);
        // zero 4 stands for FSDP; DDP runs with buckets where dp is 4.
        let (dp, sharding) = match zero {
            0 => (dp, Sharding::Ddp),
            4 => (4, Sharding::Fsdp),
            z => (4, Sharding::Zero(z)),
        };
        let ddp = Ddp { bucket_view: view, ..Ddp::default() };
        let l = Layout { pp, dp, tp, sp: tp > 1, microbatches: mbs, recompute: r, sharding, ddp, flash_attention: flash, ..Layout::single(b, 64) };
        l.check(&m).unwrap();
        let stage = stage_pick % pp;
        let cfg = AllocatorConfig::default();
        let full = run(&program(&m, &l, stage), None, &cfg);
        let short = run(&program_with(&m, &l, stage, Some(steady_microbatches(&l, stage))), None, &cfg);
        prop_assert_eq!(full.peak_allocated, short.peak_allocated, "{:?}", l);
        // What is live at the peak, by kind, and the blocks' rounding add
        // up to the peak allocated.
        let parts: u64 = full.at_peak.iter().map(|p| p.1).sum::<u64>() + full.block_rounding_at_peak;
        prop_assert_eq!(parts, full.peak_allocated, "{:?}", l);
        prop_assert!(full.peak_reserved >= short.peak_reserved, "{:?}", l);
        prop_assert_eq!(full.model_states, short.model_states);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// A replay that skips the steady pairs repeating the one before gives
    /// the every-op replay's figures, to the byte: peaks, what is live at
    /// them, model states, the out-of-memory under a device size; and it
    /// does skip where the steady state is long.
    #[test]
    fn skipping_repeated_pairs_gives_the_every_op_replay(
        pp in prop::sample::select(vec![1u64, 2, 4]), per in 1u64..3, mbs in 1u64..48,
        b in 1u64..3, stage_pick in 0u64..4, zero in 0u8..5, tp in prop::sample::select(vec![1u64, 2]),
        r in prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Full]),
        dp in prop::sample::select(vec![1u64, 4]), view in any::<bool>(), unused in any::<bool>(),
        flash in any::<bool>(), gpipe in any::<bool>(), conf in 0usize..5, cap_mib in prop::option::of(4u64..96),
        fp32 in any::<bool>(), dropout in any::<bool>(), wide in any::<bool>(),
    ) {
        // Wide: blocks past 1 MiB (max_split_size, large-pool rounding).
        let m = model(pp * per, 4, if wide { 512 } else { 128 }, 128, 1000);
        let (dp, sharding) = match zero {
            0 => (dp, Sharding::Ddp),
            4 => (4, Sharding::Fsdp),
            z => (4, Sharding::Zero(z)),
        };
        let ddp = Ddp { bucket_view: view, find_unused: unused, ..Ddp::default() };
        let schedule = if gpipe { Schedule::Gpipe } else { Schedule::OneFOneB };
        let precision = if fp32 { Precision::Fp32 } else { Precision::Mixed };
        let l = Layout { pp, dp, tp, sp: tp > 1, microbatches: mbs, recompute: r, sharding, ddp, flash_attention: flash, schedule, precision, dropout, ..Layout::single(b, 64) };
        l.check(&m).unwrap();
        // PyTorch's defaults; the smallest max_split_size it takes (its
        // release of oversize blocks under a device size); rounding to
        // quarters of a power of two; a limit with the garbage collector
        // (no skipping: its block ages are state the layout key leaves out).
        let cfg = AllocatorConfig::parse(["", "max_split_size_mb:21", "roundup_power2_divisions:4", "garbage_collection_threshold:0.6", ""][conf]).unwrap();
        // A limit with the garbage collector, and one alone (skipping).
        let cfg = AllocatorConfig { memory_limit: (conf >= 3).then_some(48 << 20), ..cfg };
        let capacity = cap_mib.map(|c| c << 20);
        let p = program(&m, &l, stage_pick % pp);
        let every = vramlab_parallel::replay::run_every_op(&p, capacity, &cfg);
        let fast = run(&p, capacity, &cfg);
        prop_assert_eq!(every.pairs_skipped, 0);
        let fast = RankReport { pairs_skipped: 0, ..fast };
        prop_assert_eq!(serde_json::to_value(&fast).unwrap(), serde_json::to_value(&every).unwrap(), "{:?}", l);
    }
}

/// GPT-2 small's sizes, where the cache of the first stages keeps
/// changing for dozens of pairs (several micro-batches in flight, blocks
/// alternating and fragmenting): skipping waits for a state that repeats,
/// and gives the every-op replay's figures.
#[test]
fn skipping_waits_for_a_state_that_repeats() {
    let m = model(12, 12, 768, 1024, 50257);
    let mut skipped = 0;
    for (pp, mbs, flash) in [(2, 48, false), (4, 40, false), (4, 40, true)] {
        let l = Layout {
            pp,
            microbatches: mbs,
            flash_attention: flash,
            dropout: false,
            ..Layout::single(1, 1024)
        };
        let cfg = AllocatorConfig::default();
        for stage in 0..pp {
            let p = program(&m, &l, stage);
            let fast = run(&p, None, &cfg);
            let every = vramlab_parallel::replay::run_every_op(&p, None, &cfg);
            skipped += fast.pairs_skipped;
            let fast = RankReport {
                pairs_skipped: 0,
                ..fast
            };
            assert_eq!(
                serde_json::to_value(&fast).unwrap(),
                serde_json::to_value(&every).unwrap(),
                "stage {stage} of {l:?}"
            );
        }
    }
    assert!(skipped > 0);
}

/// Pairs whose ops repeat but whose state does not (each keeps a tensor
/// for good: the live set grows) are never skipped: only a state that
/// repeats is.
#[test]
fn pairs_whose_state_grows_are_not_skipped() {
    use vramlab_parallel::rank::{Op, Program};
    let mut ops = vec![];
    let mut id = 0;
    for _ in 0..100 {
        ops.push(Op::Pair { next: id });
        ops.push(Op::Alloc {
            id,
            bytes: 1 << 20,
            kind: Kind::Activations,
            label: "kept",
        });
        ops.push(Op::Alloc {
            id: id + 1,
            bytes: 3 << 20,
            kind: Kind::Temporaries,
            label: "scratch",
        });
        ops.push(Op::Free { id: id + 1 });
        id += 2;
    }
    let p = Program {
        stage: 0,
        ops,
        stage_params: 0,
        in_flight: 1,
        buckets_are_gradients: false,
    };
    let cfg = AllocatorConfig::default();
    let fast = run(&p, None, &cfg);
    assert_eq!(fast.pairs_skipped, 0);
    assert_eq!(
        serde_json::to_value(&fast).unwrap(),
        serde_json::to_value(vramlab_parallel::replay::run_every_op(&p, None, &cfg)).unwrap()
    );
    assert_eq!(
        fast.peak_allocated,
        (100 << 20) + (3 << 20) - (1 << 20) + (1 << 20)
    );
}

/// A long 1F1B steady state is replayed once and skipped after: 64
/// micro-batches on one stage replay a handful of pairs.
#[test]
fn a_long_steady_state_is_skipped() {
    let m = model(2, 4, 128, 128, 1000);
    let l = Layout {
        microbatches: 64,
        ..Layout::single(1, 64)
    };
    let p = program(&m, &l, 0);
    let cfg = AllocatorConfig::default();
    let fast = run(&p, None, &cfg);
    let every = vramlab_parallel::replay::run_every_op(&p, None, &cfg);
    // Two steps of 64 pairs: all but a few of each step's skipped.
    assert!(fast.pairs_skipped >= 100, "{}", fast.pairs_skipped);
    let fast = RankReport {
        pairs_skipped: 0,
        ..fast
    };
    assert_eq!(
        serde_json::to_value(&fast).unwrap(),
        serde_json::to_value(&every).unwrap()
    );
}

/// `plan`'s answers are replayed whole: each listed layout that fits has
/// the figures `estimate` would print, and still fits.
#[test]
fn plans_list_whole_replays() {
    use vramlab_parallel::plan::{search, worst_stage};
    let req = request(
        model(8, 8, 256, 256, 2000),
        8,
        96 << 20,
        32,
        vec![Recompute::None, Recompute::Full],
    );
    let out = search(&req, 5).candidates;
    // The five listed first were replayed whole, and whole replays never
    // reserve less than the screening ones.
    assert!(
        out.len() > 5 && out[..5].iter().all(|c| c.whole),
        "{:?}",
        out.iter().map(|c| c.whole).collect::<Vec<_>>()
    );
    for c in &out[..5] {
        let screened = worst_stage(&req.model, &c.layout, &req.config, None, false);
        assert!(c.worst.peak_reserved >= screened.peak_reserved);
    }
    // Fitting layouts come first, and none after a layout that does not.
    let first_short = out.iter().position(|c| !c.fits).unwrap_or(out.len());
    assert!(out[first_short..].iter().all(|c| !c.fits));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// `search` replays its candidates whole in rounds on every core; the
    /// answer is the one a replay at a time gives: the first `confirm`
    /// whole, then fitting ones in order until `confirm` of them still fit,
    /// stopping at one past the first `confirm` that the screening did not
    /// fit.
    #[test]
    fn whole_replays_in_rounds_answer_as_one_at_a_time(
        layers in prop::sample::select(vec![2u64, 4, 8]), gpus in prop::sample::select(vec![2u64, 4, 8]),
        mib in 24u64..160, batch in prop::sample::select(vec![8u64, 16, 32]), confirm in 1usize..9,
    ) {
        use vramlab_parallel::plan::{layouts, search, worst_stage};
        let req = request(model(layers, 8, 256, 256, 2000), gpus, mib << 20, batch, vec![Recompute::None, Recompute::Full]);
        let got = search(&req, confirm).candidates;
        // The screening's order, rebuilt: every layout screened, sorted
        // as `search` sorts (a stable sort from the enumeration's order).
        let limit = ((mib << 20) as f64 * 0.9) as u64;
        let screened: Vec<(Layout, f64, RankReport)> = layouts(&req)
            .into_iter()
            .filter(|l| l.check(&req.model).is_ok())
            .map(|l| {
                let step = got.iter().find(|c| c.layout == l).map(|c| c.step_seconds);
                (l, step.expect("every checked layout is a candidate"), worst_stage(&req.model, &l, &req.config, None, false))
            })
            .collect();
        prop_assert_eq!(screened.len(), got.len());
        let fits = |r: &RankReport| r.oom.is_none() && r.peak_reserved <= limit;
        let mut order: Vec<&(Layout, f64, RankReport)> = screened.iter().collect();
        order.sort_by(|(_, a, ra), (_, b, rb)| {
            fits(rb)
                .cmp(&fits(ra))
                .then(if fits(ra) {
                    a.total_cmp(b)
                } else {
                    std::cmp::Ordering::Equal
                })
                .then(ra.oom.is_some().cmp(&rb.oom.is_some()))
                .then((limit as i64 - rb.peak_reserved as i64).cmp(&(limit as i64 - ra.peak_reserved as i64)))
        });
        let mut expect_whole = vec![];
        let mut confirmed = 0;
        for (i, (l, _, r)) in order.iter().enumerate() {
            if confirmed == confirm || (i >= confirm && !fits(r)) {
                break;
            }
            let w = worst_stage(&req.model, l, &req.config, None, true);
            confirmed += usize::from(fits(&w));
            expect_whole.push((*l, w.peak_reserved, w.peak_allocated));
        }
        let mut got_whole: Vec<_> = got
            .iter()
            .filter(|c| c.whole)
            .map(|c| (c.layout, c.worst.peak_reserved, c.worst.peak_allocated))
            .collect();
        let key = |x: &(Layout, u64, u64)| format!("{:?}", x);
        got_whole.sort_by_key(key);
        expect_whole.sort_by_key(key);
        prop_assert_eq!(got_whole, expect_whole);
    }
}

/// Layouts whose micro-batches are past the layer passes a program holds
/// are not replayed, and `search` returns them (`plan` names that cap when
/// nothing is left, instead of a divisibility rule every layout met).
#[test]
fn layouts_past_the_layer_pass_cap_are_returned_as_skipped() {
    use vramlab_parallel::plan::{layouts, search};
    // 2^24 sequences over at most 8 ranks × 8 a micro-batch: 262,144
    // micro-batches, past 200,000 layer passes on any stage.
    let mut req = request(
        model(8, 8, 256, 256, 2000),
        8,
        96 << 20,
        1 << 24,
        vec![Recompute::None],
    );
    let out = search(&req, 1);
    assert!(out.candidates.is_empty());
    assert_eq!(out.skipped.len(), layouts(&req).len());
    assert_eq!(out.past_layer_passes(&req.model).count(), out.skipped.len());
    // Under the cap nothing is skipped.
    req.global_batch = 64;
    let out = search(&req, 1);
    assert!(out.skipped.is_empty() && !out.candidates.is_empty());
}

#[derive(serde::Deserialize)]
struct DsCase {
    model: String,
    dims: [u64; 5],
    gpus: u64,
    params: u64,
    largest_layer_params: u64,
    zero2_gpu_bytes: u64,
    zero3_gpu_bytes: u64,
    zero3_largest_layer_bytes: u64,
}

#[derive(serde::Deserialize)]
struct DsFixture {
    cases: Vec<DsCase>,
}

fn ds_cases() -> Vec<DsCase> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/deepspeed_zero.json"
    );
    let text =
        std::fs::read_to_string(path).expect("fixture written by scripts/deepspeed_reference.py");
    serde_json::from_str::<DsFixture>(&text)
        .expect("fixture parses")
        .cases
}

/// DeepSpeed's estimators, run in scripts/deepspeed_reference.py, against
/// the same model's rank with DeepSpeed's fp32 gradient partition:
/// - ZeRO-2: 2Ψ + 18Ψ/N (16-bit parameters whole; 16-bit gradient, fp32
///   gradient, fp32 weight and Adam partitions) equals the program's model
///   states to the byte where N splits every tensor (else within a byte
///   per tensor and rank);
/// - ZeRO-3: the program gathers the largest module (2 bytes a parameter)
///   and makes its whole gradient (2 more): DeepSpeed's
///   `largest_layer_memory` 4·largest; its 18Ψ/N is the program's 20Ψ/N
///   less the 16-bit gradient partition, which the ZeRO paper counts.
#[test]
fn rank_programs_agree_with_deepspeeds_estimators() {
    let cases = ds_cases();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for c in cases.iter().filter(|c| c.dims[2] <= 4096 && c.gpus <= 64) {
        let [layers, heads, hidden, positions, vocab] = c.dims;
        let m = model(layers, heads, hidden, positions, vocab);
        assert_eq!(m.params(), c.params, "{}: parameter count", c.model);
        assert_eq!(m.largest_module(), c.largest_layer_params, "{}", c.model);
        let n = c.gpus;
        let mut l = Layout {
            dp: n,
            sharding: Sharding::Zero(2),
            fp32_grad_partition: true,
            ..Layout::single(1, 8)
        };
        let z2 = replay(&m, &l, 0).model_states;
        let tensors = 16 * layers + 5;
        let slack = if n == 1 { 0 } else { 18 * tensors };
        assert!(
            z2.abs_diff(c.zero2_gpu_bytes) <= slack,
            "{} on {n}: ZeRO-2 {z2} vs DeepSpeed {}",
            c.model,
            c.zero2_gpu_bytes
        );
        l.sharding = Sharding::Zero(3);
        let r = replay(&m, &l, 0);
        assert_eq!(
            2 * kind(&r, Kind::Gathered),
            c.zero3_largest_layer_bytes,
            "{}",
            c.model
        );
        let ours = r.model_states as i64 - (2 * c.params).div_ceil(n) as i64;
        let theirs = (c.zero3_gpu_bytes - c.zero3_largest_layer_bytes) as i64;
        assert!(
            ours.abs_diff(theirs) <= 20 * tensors,
            "{} on {n}: ZeRO-3 {ours} vs DeepSpeed {theirs}",
            c.model
        );
    }
}

/// DDP's buckets hold one more copy of the gradients, unless they are the
/// gradients (gradient_as_bucket_view); find_unused_parameters adds one
/// int32 per parameter tensor.
#[test]
fn ddp_buckets_cost_one_gradient_copy_unless_gradients_are_views() {
    let m = model(4, 8, 512, 256, 4096);
    let base = Layout {
        dp: 8,
        ..Layout::single(2, 64)
    };
    let plain = replay(&m, &base, 0);
    let grads = kind(&plain, Kind::Gradients);
    assert_eq!(grads, 2 * m.params());
    assert_eq!(kind(&plain, Kind::Buckets), grads);
    let view = replay(
        &m,
        &Layout {
            ddp: Ddp {
                bucket_view: true,
                ..Ddp::default()
            },
            ..base
        },
        0,
    );
    assert_eq!(kind(&view, Kind::Gradients), 0);
    assert_eq!(kind(&view, Kind::Buckets), grads);
    // The copy shows in the peak by the gradients' size less what the
    // step without it holds at its own peak beyond the model states
    // (small activations here).
    let small = Layout {
        dp: 8,
        ..Layout::single(1, 8)
    };
    let views = Layout {
        ddp: Ddp {
            bucket_view: true,
            ..Ddp::default()
        },
        ..small
    };
    let (a, b) = (replay(&m, &small, 0), replay(&m, &views, 0));
    let transient: u64 = [Kind::Activations, Kind::OuterActivations, Kind::Temporaries]
        .iter()
        .map(|&k| kind(&b, k))
        .sum();
    let saved = a.peak_allocated - b.peak_allocated;
    assert!(
        saved <= grads && saved + transient >= grads,
        "{saved} of {grads}"
    );
    // With the buckets as the gradients, they count as the gradients.
    assert_eq!(a.model_states, b.model_states);
    assert!(plain.peak_allocated >= view.peak_allocated);
    let unused = replay(
        &m,
        &Layout {
            ddp: Ddp {
                find_unused: true,
                ..Ddp::default()
            },
            ..base
        },
        0,
    );
    let tensors = 16 * 4 + 4;
    assert_eq!(kind(&unused, Kind::Buckets), grads + 4 * tensors);
    // On one rank there is no DDP and no bucket.
    let alone = replay(&m, &Layout::single(2, 64), 0);
    assert_eq!(kind(&alone, Kind::Buckets), 0);
}

/// Layouts the model cannot run are errors that say what to change.
#[test]
fn impossible_layouts_say_what_to_change() {
    let m = model(6, 12, 768, 1024, 50257);
    let err = |l: Layout| l.check(&m).unwrap_err().to_string();
    assert!(err(Layout {
        tp: 5,
        ..Layout::single(1, 1024)
    })
    .contains("divisor"));
    assert!(err(Layout {
        pp: 4,
        ..Layout::single(1, 1024)
    })
    .contains("divisor of 6"));
    assert!(err(Layout {
        sp: true,
        ..Layout::single(1, 1024)
    })
    .contains("--tp"));
    assert!(err(Layout {
        sharding: Sharding::Zero(4),
        ..Layout::single(1, 1024)
    })
    .contains("stages 1, 2 and 3"));
    assert!(err(Layout::single(1, 2048)).contains("positions"));
}

/// DDP's buckets as PyTorch 2.15's Reducer lays them out for GPT-2 small
/// (recorded on fake tensors, docs/recorder_distributed.md): one bucket of
/// every gradient at construction; before the second iteration 9,446,400
/// bytes (ln_f and the last block's MLP projection: the first gradients,
/// past 1 MiB), eleven of 28,351,488 and 176,446,464 (block 0's rest and
/// the embeddings). With find_unused_parameters the construction's split
/// (registration order, 1 MiB then 25 MiB) stays.
#[test]
fn ddp_buckets_are_laid_out_as_pytorchs_reducer_lays_them() {
    let m = model(12, 12, 768, 1024, 50257);
    let buckets = |find_unused| -> Vec<(&'static str, u64)> {
        let l = Layout {
            dp: 8,
            precision: Precision::Fp32,
            ddp: Ddp {
                find_unused,
                ..Ddp::default()
            },
            ..Layout::single(1, 64)
        };
        program(&m, &l, 0)
            .ops
            .iter()
            .filter_map(|op| match *op {
                vramlab_parallel::rank::Op::Alloc {
                    bytes,
                    kind: Kind::Buckets,
                    label,
                    ..
                } => Some((label, bytes)),
                _ => None,
            })
            .collect()
    };
    let plain = buckets(false);
    assert_eq!(plain[0], ("ddp bucket", 497_759_232));
    let rebuilt: Vec<u64> = plain
        .iter()
        .filter(|b| b.0 == "ddp bucket (rebuilt)")
        .map(|b| b.1)
        .collect();
    let mut want = vec![9_446_400];
    want.extend([28_351_488; 11]);
    want.push(176_446_464);
    assert_eq!(rebuilt, want);
    let unused = buckets(true);
    assert_eq!(
        unused[0],
        ("ddp bucket", 154_389_504),
        "wte alone passes 1 MiB"
    );
    assert!(unused.iter().all(|b| b.0 != "ddp bucket (rebuilt)"));
    let total: u64 = unused
        .iter()
        .filter(|b| b.0 == "ddp bucket")
        .map(|b| b.1)
        .sum();
    assert_eq!(total, 497_759_232);
}

/// Allocations labelled `label` in `l`'s stage-0 program, over its two
/// steps.
fn allocs(m: &Transformer, l: &Layout, label: &str) -> u64 {
    program(m, l, 0)
        .ops
        .iter()
        .filter(
            |op| matches!(op, vramlab_parallel::rank::Op::Alloc { label: x, .. } if *x == label),
        )
        .count() as u64
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The step-time cost's data-parallel bytes count the collectives the
    /// replayed program implies: a reduce-scatter wherever it frees a
    /// whole gradient for its shard (every micro-batch under ZeRO-2 and 3),
    /// a gather wherever it gathers a module (each micro-batch's forward and
    /// backward under ZeRO-3), and once a step what it does not model as
    /// memory (DDP's all-reduce, ZeRO-1 and 2's parameter all-gather).
    #[test]
    fn data_parallel_bytes_count_the_collectives_the_replay_implies(
        layers in 1u64..4, m_count in 1u64..6, dp in prop::sample::select(vec![2u64, 4]),
        stage in 0u8..4, pp in prop::sample::select(vec![1u64, 2]),
    ) {
        let m = model(2 * layers, 4, 64, 128, 256);
        let l = Layout { dp, pp, microbatches: m_count, sharding: sharding(stage), ..Layout::single(1, 32) };
        l.check(&m).unwrap();
        let shards = allocs(&m, &l, "gradient shard");
        // One stage's token table waits as the tied head's gradient before
        // its reduce-scatter.
        let wholes = allocs(&m, &l, "gradient before reduce-scatter")
            + allocs(&m, &l, "tied head's gradient of the token table");
        let reduce_scatters = wholes.checked_div(shards).unwrap_or(0);
        // Stage 0's units: its blocks, the embeddings and, alone, the head.
        let units = 2 * layers / pp + if pp == 1 { 2 } else { 1 };
        let gathers = allocs(&m, &l, "all-gathered module") / 2 / units;
        let collectives = match stage {
            0 => 2,
            1 => 2,
            2 => reduce_scatters + 1,
            _ => reduce_scatters + gathers,
        };
        let want_rs = if stage >= 2 { m_count } else { 0 };
        prop_assert_eq!(reduce_scatters, want_rs);
        prop_assert_eq!(gathers, if stage == 3 { 2 * m_count } else { 0 });
        let psi = m.stage_params(1, 0, pp) as f64;
        let ring = (dp as f64 - 1.0) / dp as f64;
        let dp_bytes = vramlab_parallel::plan::comm_bytes(&m, &l)[0];
        prop_assert!((dp_bytes - collectives as f64 * ring * psi * 2.0).abs() < 1e-6 * dp_bytes, "{l:?}: {dp_bytes}");
    }
}

/// With one stage, the tied head's token table lives in the first unit;
/// ZeRO-3 gathers it again for the logits and their backward: a gather of
/// the table's size four times a micro-batch (the embedding's forward, the
/// head's forward and backward, the embedding's backward), not two.
#[test]
fn zero3_gathers_the_tied_head_for_the_logits_on_one_stage() {
    let (vocab, hidden) = (4096u64, 64u64);
    let m = model(2, 4, hidden, 128, vocab);
    let l = Layout {
        dp: 2,
        microbatches: 3,
        sharding: Sharding::Zero(3),
        ..Layout::single(1, 32)
    };
    l.check(&m).unwrap();
    let table = vocab * hidden * 2;
    let gathers = program(&m, &l, 0)
        .ops
        .iter()
        .filter(|op| {
            matches!(op, vramlab_parallel::rank::Op::Alloc { label: "all-gathered module", bytes, .. } if *bytes == table)
        })
        .count();
    // Two steps of three micro-batches.
    assert_eq!(gathers, 4 * 3 * 2);
    // And the peak holds it gathered, as a two-stage layout's last stage does.
    let gathered = kind(&replay(&m, &l, 0), Kind::Gathered);
    assert!(gathered >= table, "gathered {gathered}");
}

/// With one stage the tied head's gradient of the token table exists from
/// the head's backward (autograd's InputBuffer) until the embedding's
/// backward adds its own: it is the table's gradient for a step's first
/// micro-batch (DDP keeps it as `.grad`), a temporary added into it for
/// the others. Two stages hold the head's copy as a parameter of their own.
#[test]
fn the_tied_heads_gradient_waits_for_the_embeddings_on_one_stage() {
    use vramlab_parallel::rank::Op;
    let (vocab, hidden) = (4096u64, 64u64);
    let m = model(2, 4, hidden, 128, vocab);
    let l = Layout {
        dp: 2,
        microbatches: 3,
        ..Layout::single(1, 32)
    };
    l.check(&m).unwrap();
    let ops = program(&m, &l, 0).ops;
    let label = "tied head's gradient of the token table";
    let tied: Vec<(usize, u32, Kind)> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Op::Alloc {
                id,
                kind,
                label: x,
                bytes,
            } if *x == label => {
                assert_eq!(*bytes, vocab * hidden * 2);
                Some((i, *id, *kind))
            }
            _ => None,
        })
        .collect();
    // Two steps of three micro-batches: the first of each step is the
    // gradient, the rest temporaries freed within their backward.
    let kinds: Vec<Kind> = tied.iter().map(|t| t.2).collect();
    let (g, t) = (Kind::Gradients, Kind::Temporaries);
    assert_eq!(kinds, vec![g, t, t, g, t, t]);
    for &(at, id, kind) in &tied {
        let freed = ops
            .iter()
            .skip(at)
            .position(|op| matches!(op, Op::Free { id: x } if *x == id));
        // The first unit's own gradient is allocated after it.
        let grad = ops.iter().skip(at).position(|op| {
            matches!(
                op,
                Op::Alloc {
                    label: "gradient",
                    ..
                }
            )
        });
        if kind == Kind::Gradients {
            assert!(grad.is_some(), "the embedding's other gradients follow");
        } else {
            assert!(freed.is_some(), "a later micro-batch's is added and freed");
        }
    }
    // Made while the logits' gradient lives (the head's weight gradient is
    // grad_logitsᵀ · h), and met by the embedding's own, added and freed.
    for &(at, _, _) in &tied {
        let logits = ops[..at]
            .iter()
            .rev()
            .find_map(|op| match op {
                Op::Alloc {
                    id,
                    label: "logits' gradient",
                    ..
                } => Some(*id),
                _ => None,
            })
            .unwrap();
        assert!(
            ops[at..]
                .iter()
                .any(|op| matches!(op, Op::Free { id } if *id == logits)),
            "the logits' gradient is still live"
        );
    }
    let own = ops
        .iter()
        .filter(|op| {
            matches!(
                op,
                Op::Alloc {
                    label: "embedding's gradient of the token table",
                    ..
                }
            )
        })
        .count();
    assert_eq!(own, tied.len());
    // Under ZeRO-2 it is the table's whole gradient before its
    // reduce-scatter: a temporary every micro-batch, freed each time.
    let z2 = Layout {
        sharding: Sharding::Zero(2),
        ..l
    };
    let ops = program(&m, &z2, 0).ops;
    let ids: Vec<(u32, Kind)> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Alloc {
                id, kind, label: x, ..
            } if *x == label => Some((*id, *kind)),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 6);
    for (id, kind) in ids {
        assert_eq!(kind, Kind::Temporaries);
        assert!(ops
            .iter()
            .any(|op| matches!(op, Op::Free { id: x } if *x == id)));
    }
    let l2 = Layout { pp: 2, ..l };
    l2.check(&m).unwrap();
    assert!(!program(&m, &l2, 1)
        .ops
        .iter()
        .any(|op| matches!(op, Op::Alloc { label: x, .. } if *x == label)));
}

/// Tensor parallelism comes with sequence parallelism where the sequence
/// divides by its size (which only saves memory); where it does not, the
/// plain Megatron layout is still offered (a 127-token sequence on 2 GPUs
/// once had no tensor-parallel layout at all).
#[test]
fn tensor_parallel_layouts_need_no_sequence_that_divides() {
    use vramlab_parallel::plan::layouts;
    let m = model(2, 4, 64, 256, 512);
    for (seq, sp) in [(128u64, true), (127, false)] {
        let r = vramlab_parallel::plan::Request {
            seq,
            ..request(m, 2, 8 << 30, 4, vec![Recompute::None])
        };
        let tp2: Vec<_> = layouts(&r).into_iter().filter(|l| l.tp == 2).collect();
        assert!(!tp2.is_empty(), "seq {seq}: a tensor-parallel layout");
        assert!(tp2.iter().all(|l| l.sp == sp), "seq {seq}");
        for l in &tp2 {
            l.check(&m).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A rank's program frees only what it allocated, each block once
    /// (the replay ignores a second free, so nothing else would notice),
    /// over shardings, DDP's options, stages, micro-batches and
    /// recomputation.
    #[test]
    fn every_block_is_freed_at_most_once_and_only_after_its_allocation(
        layers in 1u64..3, m_count in 1u64..4, dp in prop::sample::select(vec![1u64, 2]),
        stage in 0u8..5, pp in prop::sample::select(vec![1u64, 2]), bucket_view in any::<bool>(),
        r in prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Full]),
    ) {
        use std::collections::HashSet;
        use vramlab_parallel::rank::Op;
        let m = model(2 * layers, 4, 64, 128, 256);
        let sharding = match (dp, stage) {
            (1, _) => Sharding::Ddp,
            (_, 4) => Sharding::Fsdp,
            (_, s) => sharding(s),
        };
        let l = Layout {
            dp,
            pp,
            microbatches: m_count,
            sharding,
            recompute: r,
            ddp: Ddp { bucket_view, ..Ddp::default() },
            ..Layout::single(1, 32)
        };
        l.check(&m).unwrap();
        for s in 0..pp {
            let (mut live, mut seen) = (HashSet::new(), HashSet::new());
            for op in program(&m, &l, s).ops {
                match op {
                    Op::Alloc { id, .. } => {
                        prop_assert!(seen.insert(id), "{l:?}: id {id} allocated twice");
                        live.insert(id);
                    }
                    Op::Free { id } => {
                        prop_assert!(live.remove(&id), "{l:?} stage {s}: id {id} freed but not live");
                    }
                    _ => {}
                }
            }
        }
    }
}
