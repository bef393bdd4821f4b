//! Tensors' bind groups are made once and reused: a repeated training step
//! creates none, and a segment the allocator releases leaves the cache, so
//! that its memory goes back to the driver.

use crate::common;
use common::*;
use vramlab::estimate::Plan;
use vramlab::memory::AllocatorConfig;
use vramlab::ops::fill;
use vramlab::tensor::{DType, Tensor};
use vramlab::train::{Mode, OptimizerConfig, OptimizerKind};

#[test]
fn a_repeated_step_creates_no_bind_groups() {
    let e = engine();
    for (name, batch, amp) in [
        ("simple-cnn", 2, None),
        ("mlp", 5, None),
        ("mlp", 3, Some(DType::F16)),
    ] {
        let plan = Plan {
            model: small(name),
            batch,
            optimizer: OptimizerConfig::new(OptimizerKind::Adam, None, None, None),
            mode: Mode::Train,
            amp,
            dtype: DType::F32,
            loss: Default::default(),
            config: AllocatorConfig::default(),
        };
        let (mut t, b) = plan.trainer(&e, 3).unwrap();
        // The first step makes the optimizer's state. The last step's
        // logits and loss stay bound until the next forward rebinds them,
        // so each step's outputs land beside the last's, and the cache's
        // blocks settle into a repeating layout within six steps (on
        // llvmpipe, simple-cnn: 49, 85, 108, 127, 140, then 140 bind groups
        // made; mlp one step later).
        for _ in 0..6 {
            t.step(&b).unwrap();
        }
        let cache = e.gpu().unwrap().bind_groups();
        let (made, reused) = cache.counts();
        // Two more steps: the held outputs alternate between two places.
        t.step(&b).unwrap();
        t.step(&b).unwrap();
        let (made_after, reused_after) = cache.counts();
        assert_eq!(
            made_after, made,
            "{name} {amp:?}: steps past the sixth made bind groups"
        );
        assert!(reused_after > reused, "{name} {amp:?}: nothing reused");
    }
}

#[test]
fn a_released_segment_leaves_the_cache_and_the_driver() {
    let e = engine();
    let Some(before) = e.gpu().unwrap().allocator_report() else {
        // Backends without a driver report (Metal, GL) cannot show it.
        panic!("this test needs the driver's allocator report (Vulkan or DX12)");
    };
    let cache = e.gpu().unwrap().bind_groups();
    // 24 MiB: a segment of its own.
    let n = 6 << 20;
    let t = Tensor::empty(&e, &[n], DType::F32, "big").unwrap();
    fill::fill(&t, 2.0).unwrap();
    e.synchronize().unwrap();
    let held = cache.held();
    assert!(held >= 1);
    drop(t);
    e.allocator().empty_cache();
    e.synchronize().unwrap();
    assert_eq!(
        cache.held(),
        held - 1,
        "the segment's bind group is still held"
    );
    let after = e.gpu().unwrap().allocator_report().unwrap();
    assert!(
        after.total_allocated_bytes < before.total_allocated_bytes + (4 << 20),
        "the driver still holds the released segment: {} → {} bytes",
        before.total_allocated_bytes,
        after.total_allocated_bytes
    );
}
