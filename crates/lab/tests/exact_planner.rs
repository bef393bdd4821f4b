//! The exact planner against the CSV format, its own checker, brute force on
//! small random instances, and MiniMalloc's challenging benchmarks.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use vramlab_lab::exact_planner::{arena_of, fit, greedy, lower_bound, plan, verify};
use vramlab_lab::intervals::{parse_csv, to_csv, Interval};

const NAMES: &str = "ABCDEFGHIJK";

fn fixture(name: char) -> Vec<Interval> {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests/fixtures/minimalloc",
        &format!("{name}.1048576.csv"),
    ]
    .iter()
    .collect();
    let text = std::fs::read_to_string(&path).unwrap();
    parse_csv(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// xorshift64*: deterministic cases without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_instance(rng: &mut Rng) -> Vec<Interval> {
    let n = 2 + rng.below(6) as usize;
    (0..n)
        .map(|k| {
            let lower = rng.below(8) as i64;
            let upper = lower + 1 + rng.below(5) as i64;
            Interval {
                id: k as i64 * 3 - 5,
                lower,
                upper,
                size: 1 + rng.below(6),
            }
        })
        .collect()
}

/// The optimum by exhaustive search over every offset of every buffer.
fn brute_force(v: &[Interval]) -> u64 {
    fn go(v: &[Interval], k: usize, offs: &mut Vec<u64>, top: u64, best: &mut u64) {
        if top >= *best {
            return;
        }
        if k == v.len() {
            *best = top;
            return;
        }
        let mut o = 0;
        while o + v[k].size < *best {
            let free = (0..k).all(|j| {
                !v[j].overlaps_in_time(&v[k])
                    || offs[j] + v[j].size <= o
                    || o + v[k].size <= offs[j]
            });
            if free {
                offs.push(o);
                go(v, k + 1, offs, top.max(o + v[k].size), best);
                offs.pop();
            }
            o += 1;
        }
    }
    let mut best = v.iter().map(|i| i.size).sum::<u64>() + 1;
    go(v, 0, &mut Vec::new(), 0, &mut best);
    best
}

#[test]
fn csv_round_trips_on_every_fixture() {
    for name in NAMES.chars() {
        let v = fixture(name);
        assert_eq!(parse_csv(&to_csv(&v)).unwrap(), v, "{name}");
    }
}

#[test]
fn the_checker_rejects_overlap_and_accepts_greedy() {
    let v = fixture('A');
    let offsets = greedy(&v);
    assert_eq!(verify(&v, &offsets).ok(), Some(arena_of(&v, &offsets)));
    // Two buffers live together, placed at the same offset.
    let (a, b) = (0..v.len())
        .flat_map(|a| (a + 1..v.len()).map(move |b| (a, b)))
        .find(|&(a, b)| v[a].overlaps_in_time(&v[b]))
        .unwrap();
    let mut bad = offsets.clone();
    bad[b] = bad[a];
    let e = verify(&v, &bad).unwrap_err().to_string();
    assert!(e.contains("overlap in memory"), "{e}");
    // Touching in time (half open) may share memory; touching in memory too.
    let t = [
        Interval {
            id: 1,
            lower: 0,
            upper: 5,
            size: 4,
        },
        Interval {
            id: 2,
            lower: 5,
            upper: 9,
            size: 4,
        },
        Interval {
            id: 3,
            lower: 3,
            upper: 7,
            size: 2,
        },
    ];
    assert_eq!(verify(&t, &[0, 0, 4]).ok(), Some(6));
    assert!(verify(&t, &[0, 0, 3]).is_err());
    assert!(verify(&t, &[0, 0]).is_err());
}

#[test]
fn exact_matches_brute_force_on_small_random_instances() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut searched = 0;
    for case in 0..1500 {
        let v = random_instance(&mut rng);
        let want = brute_force(&v);
        searched += usize::from(arena_of(&v, &greedy(&v)) > want);
        let got = plan(&v, Duration::from_secs(10));
        assert_eq!(
            verify(&v, &got.offsets).ok(),
            Some(got.arena),
            "case {case}: {v:?}"
        );
        assert_eq!(got.arena, want, "case {case}: {}", to_csv(&v));
        assert!(
            got.optimal,
            "case {case}: not proven optimal: {}",
            to_csv(&v)
        );
        assert!(got.lower_bound <= want && got.lower_bound >= lower_bound(&v));
        // The decision search proves one byte less impossible, and fits the
        // optimum exactly.
        let below = fit(&v, want - 1, Duration::from_secs(10));
        assert!(
            below.offsets.is_none() && below.exhausted,
            "case {case}: {}",
            to_csv(&v)
        );
        let at = fit(&v, want, Duration::from_secs(10));
        let offsets = at
            .offsets
            .unwrap_or_else(|| panic!("case {case}: {}", to_csv(&v)));
        assert!(verify(&v, &offsets).unwrap() <= want);
    }
    // `plan` must have had to search (beat greedy) in some cases; `fit`
    // searches in every case.
    assert!(searched >= 5, "only {searched} cases beat greedy");
}

/// The optimum by a plain branch and bound over "gravity" plans: buffers
/// placed one by one, each dropped onto the highest placed buffer it
/// overlaps in time, in non-decreasing (offset, index) order. Every plan can
/// be pushed down into a gravity plan without growing, and a gravity plan
/// placed in order of offset is one of these; no pruning rule of the
/// planner's is used, so a wrong one shows.
fn gravity_optimum(v: &[Interval]) -> u64 {
    fn go(
        v: &[Interval],
        offs: &mut [Option<u64>],
        last: (u64, usize),
        top: u64,
        left: usize,
        peak: u64,
        best: &mut u64,
    ) {
        if *best == peak {
            return;
        }
        if left == 0 {
            *best = (*best).min(top);
            return;
        }
        for k in 0..v.len() {
            if offs[k].is_some() {
                continue;
            }
            let o = (0..v.len())
                .filter_map(|j| {
                    offs[j]
                        .filter(|_| v[j].overlaps_in_time(&v[k]))
                        .map(|x| x + v[j].size)
                })
                .max()
                .unwrap_or(0);
            let t = top.max(o + v[k].size);
            if (o, k) < last || t >= *best {
                continue;
            }
            offs[k] = Some(o);
            go(v, offs, (o, k), t, left - 1, peak, best);
            offs[k] = None;
        }
    }
    // Start from the verified greedy plan; stop at the peak bound.
    let g = greedy(v);
    let mut best = verify(v, &g).unwrap();
    let peak = lower_bound(v);
    if best > peak {
        // Only strictly better plans are searched for: none, greedy's stands.
        go(
            v,
            &mut vec![None; v.len()],
            (0, 0),
            0,
            v.len(),
            peak,
            &mut best,
        );
    }
    best
}

#[test]
fn exact_matches_gravity_search_on_larger_random_instances() {
    // Perfect packings with two buffers perturbed (grown, or lived longer),
    // 8-14 buffers, against an independent search: `plan` must reach the
    // optimum and prove it, `fit` must find a plan at the optimum and
    // exhaust one byte below. Instances this small are easy for the search
    // (it rarely backtracks) and almost never have an optimum above the peak
    // bound (none in 20,000 random ones tried, nor in 200 windows of D and
    // J): the pruning under real backtracking is pinned by the challenging
    // instances' node counts below.
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (mut backtracked, cases) = (0, 1000);
    for case in 0..cases {
        let pieces = 8 + rng.below(7) as usize;
        let mut v = perfect_packing(&mut rng, 16, 24, pieces);
        for _ in 0..2 {
            let k = rng.below(v.len() as u64) as usize;
            match rng.below(3) {
                0 => v[k].size += 1 + rng.below(3),
                1 => v[k].lower = (v[k].lower - 1).max(0),
                _ => v[k].upper += 1,
            }
        }
        let want = gravity_optimum(&v);
        let got = plan(&v, Duration::from_secs(10));
        assert_eq!(
            verify(&v, &got.offsets).ok(),
            Some(got.arena),
            "case {case}"
        );
        assert_eq!(got.arena, want, "case {case}: {}", to_csv(&v));
        assert!(got.optimal, "case {case}: {}", to_csv(&v));
        let below = fit(&v, want - 1, Duration::from_secs(10));
        assert!(below.exhausted, "case {case}: {}", to_csv(&v));
        let at = fit(&v, want, Duration::from_secs(10));
        backtracked += usize::from(at.nodes > 2 * v.len() as u64);
        let offsets = at
            .offsets
            .unwrap_or_else(|| panic!("case {case}: {}", to_csv(&v)));
        assert!(verify(&v, &offsets).unwrap() <= want, "case {case}");
    }
    eprintln!("{backtracked} of {cases} searches at the optimum backtracked");
}

#[test]
fn challenging_instances_verify_and_beat_greedy() {
    // Correctness, not quality: each plan verifies, never loses to the
    // greedy incumbent and keeps its budget. How close a minute's search
    // gets is docs/planner.md's (`--release`, 60 s each).
    let budget = Duration::from_secs(2);
    let t = Instant::now();
    for name in NAMES.chars() {
        let v = fixture(name);
        let g = arena_of(&v, &greedy(&v));
        let r = plan(&v, budget);
        assert_eq!(verify(&v, &r.offsets).ok(), Some(r.arena), "{name}");
        assert!(
            r.arena <= g,
            "{name}: exact {} worse than greedy {g}",
            r.arena
        );
        assert!(r.lower_bound <= r.arena && r.lower_bound >= lower_bound(&v));
        assert!(
            r.elapsed <= budget + Duration::from_secs(2),
            "{name}: {:?}",
            r.elapsed
        );
        eprintln!(
            "{name}: greedy {:.4} exact {:.4} lb {:.4} optimal {} in {:.2}s",
            g as f64 / 1048576.0,
            r.arena as f64 / 1048576.0,
            r.lower_bound as f64 / 1048576.0,
            r.optimal,
            r.elapsed.as_secs_f64()
        );
    }
    eprintln!("total {:.1}s", t.elapsed().as_secs_f64());
}

#[test]
fn challenging_instances_fit_one_mib_in_minimallocs_node_counts() {
    // MiniMalloc's own question on its own benchmarks: everything fits in
    // the 1 MiB of the file names. MiniMalloc (WAT, TAW, TWA round robin)
    // answers in 2,046 (J) to 154,625 (E) search nodes; this search visits
    // the same tree, so a node count far above that means the search
    // wanders (e.g. a buffer listed twice in a partition re-explores every
    // failed subtree). Nodes, not seconds: independent of the machine.
    for name in NAMES.chars() {
        let v = fixture(name);
        let f = fit(&v, 1 << 20, Duration::from_secs(60));
        let offsets = f
            .offsets
            .unwrap_or_else(|| panic!("{name}: no plan in 1 MiB after {} nodes", f.nodes));
        let arena = verify(&v, &offsets).unwrap();
        assert!(arena <= 1 << 20, "{name}: {arena}");
        assert!(f.nodes <= 200_000, "{name}: {} nodes", f.nodes);
        eprintln!("{name}: fits 1 MiB (arena {arena}) in {} nodes", f.nodes);
    }
}

/// Cuts the rectangle [0, t) x [0, c) (time x memory) into `pieces`
/// rectangles by random guillotine cuts: a perfect packing, so the
/// optimum equals the peak-live bound `c`.
fn perfect_packing(rng: &mut Rng, t: i64, c: u64, pieces: usize) -> Vec<Interval> {
    let mut rects = vec![(0i64, t, 0u64, c)];
    while rects.len() < pieces {
        let k = rng.below(rects.len() as u64) as usize;
        let (l, u, lo, hi) = rects[k];
        if rng.below(2) == 0 && u - l >= 2 {
            let m = l + 1 + rng.below((u - l - 1) as u64) as i64;
            rects[k] = (l, m, lo, hi);
            rects.push((m, u, lo, hi));
        } else if hi - lo >= 2 {
            let m = lo + 1 + rng.below(hi - lo - 1);
            rects[k] = (l, u, lo, m);
            rects.push((l, u, m, hi));
        }
    }
    rects
        .iter()
        .enumerate()
        .map(|(k, &(lower, upper, lo, hi))| Interval {
            id: k as i64,
            lower,
            upper,
            size: hi - lo,
        })
        .collect()
}

#[test]
fn perfect_packings_are_found() {
    let mut rng = Rng(42);
    for case in 0..60 {
        let pieces = 5 + case / 2;
        let v = perfect_packing(&mut rng, 64, 1 << 12, pieces);
        let lb = lower_bound(&v);
        let f = fit(&v, lb, Duration::from_secs(20));
        eprintln!(
            "case {case}: {} pieces, lb {lb}, found {}, nodes {}",
            v.len(),
            f.offsets.is_some(),
            f.nodes
        );
        assert!(f.offsets.is_some(), "case {case}: {}", to_csv(&v));
    }
}

#[test]
fn long_chains_search_without_overflowing_the_stack() {
    // 5,000 buffers, each overlapping the next 19: the search recurses once
    // per buffer placed until a time boundary has no unplaced buffer left
    // across it, far deeper than a test thread's 2 MiB stack allows; `fit`
    // and `plan` search on a thread of their own.
    let v: Vec<Interval> = (0..5000)
        .map(|k| Interval {
            id: k,
            lower: k,
            upper: k + 20,
            size: 1 + (k as u64 * 7) % 5,
        })
        .collect();
    let g = arena_of(&v, &greedy(&v));
    let f = fit(&v, g, Duration::from_secs(60));
    let offsets = f.offsets.expect("the greedy arena fits");
    assert!(verify(&v, &offsets).unwrap() <= g);
    let r = plan(&v, Duration::from_secs(5));
    assert_eq!(verify(&v, &r.offsets).ok(), Some(r.arena));
    assert!(r.arena <= g);
}
