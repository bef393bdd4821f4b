//! Data integrity under block reuse, on a real wgpu device (PyTorch's
//! test_allocator_fuzz, scaled to a software GPU): thousands of random
//! allocations and frees of random sizes, each tensor written with a known
//! pattern, every live tensor checked to still hold its pattern.
//!
//! The hazard it hunts: a block freed while queued GPU work still reads it is
//! handed to a new tensor at once. If the new tensor's data jumped ahead of
//! that queued work, the work would read the new data. So "derive" steps read a
//! tensor on the GPU, drop it before any submit, and immediately write a new
//! tensor that likely reuses its block.

use crate::common;
use common::*;
use vramlab::ops::{elementwise, fill};
use vramlab::tensor::Tensor;

fn pattern(id: u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (id % 997) as f32 + (i % 8) as f32 * 0.25)
        .collect()
}

fn random_len(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => 1 + rng.below(400_000) as usize, // large pool
        1..=3 => 1 + rng.below(40_000) as usize,
        _ => 1 + rng.below(2_000) as usize, // small pool, shared segments
    }
}

#[test]
fn live_tensors_keep_their_data_under_random_reuse() {
    let e = engine();
    let mut rng = Rng::new(0xF022);
    let mut live: Vec<(Tensor, Vec<f32>)> = Vec::new();
    let mut next_id = 0u64;
    let (mut derived, mut reused_immediately) = (0, 0);
    for step in 0..3000 {
        match rng.below(20) {
            0..=7 => {
                let n = random_len(&mut rng);
                next_id += 1;
                if rng.below(2) == 0 {
                    let p = pattern(next_id, n);
                    live.push((Tensor::from_slice(&e, &p, &[n], "up").unwrap(), p));
                } else {
                    let v = (next_id % 1000) as f32;
                    live.push((fill::full(&e, &[n], v, "fill").unwrap(), vec![v; n]));
                }
            }
            8..=10 if !live.is_empty() => {
                // Read x on the GPU, drop x before submitting, write a new
                // tensor of the same size straight away.
                let k = rng.below(live.len() as u64) as usize;
                let (x, px) = live.swap_remove(k);
                let y = elementwise::add(&x, &x).unwrap();
                let n = x.numel();
                let offset_before = x.storage().allocation().offset;
                let seg_before = x.storage().allocation().segment;
                drop(x);
                next_id += 1;
                let p = pattern(next_id, n);
                let z = Tensor::from_slice(&e, &p, &[n], "z").unwrap();
                if z.storage().allocation().offset == offset_before
                    && z.storage().allocation().segment == seg_before
                {
                    reused_immediately += 1;
                }
                live.push((y, px.iter().map(|v| v * 2.0).collect()));
                live.push((z, p));
                derived += 1;
            }
            _ if !live.is_empty() => {
                let k = rng.below(live.len() as u64) as usize;
                live.swap_remove(k);
            }
            _ => {}
        }
        if step % 250 == 249 {
            for (t, want) in &live {
                assert_eq!(
                    &t.to_vec().unwrap(),
                    want,
                    "tensor corrupted by step {step}"
                );
            }
            e.allocator().check_invariants().unwrap();
        }
    }
    for (t, want) in &live {
        assert_eq!(&t.to_vec().unwrap(), want);
    }
    assert!(derived > 300, "the hazard path ran {derived} times");
    assert!(
        reused_immediately > 100,
        "blocks were reused at once only {reused_immediately} times"
    );
    let a = e.allocator();
    assert!(
        a.stats().num_device_alloc < 200,
        "the cache did its job: {} device allocations",
        a.stats().num_device_alloc
    );
    a.check_invariants().unwrap();
    eprintln!(
        "{derived} read-drop-rewrite steps, {reused_immediately} reused the freed block at once; {} segments allocated",
        a.stats().num_device_alloc
    );
}
