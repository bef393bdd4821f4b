//! Synthetic workloads for the allocator suite, each a known fragmentation
//! pattern: variable-length batches (the documents' NLP case), a batch size
//! that changes mid-run, and inference with a growing sequence length.
//! Seeded, so every run sees the same trace.

use super::workload::{Op, Workload};
use crate::memory::tag::Category;

struct Gen {
    ops: Vec<Op>,
    next: u64,
    state: u64,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            ops: Vec::new(),
            next: 0,
            state: seed,
        }
    }

    fn rand(&mut self, n: u64) -> u64 {
        // SplitMix64.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }

    fn alloc(&mut self, size: u64) -> u64 {
        self.alloc_as(size, Category::Untagged)
    }

    fn alloc_as(&mut self, size: u64, category: Category) -> u64 {
        self.next += 1;
        self.ops.push(Op::Alloc {
            id: self.next,
            size,
            category,
        });
        self.next
    }

    fn free(&mut self, id: u64) {
        self.ops.push(Op::Free { id });
    }

    fn finish(self, name: &str) -> Workload {
        Workload {
            name: name.into(),
            ops: self.ops,
            measure_from: 0,
        }
    }
}

/// A transformer-ish training step: `layers` layers each saving a few
/// activations proportional to tokens × hidden, a temporary per layer in
/// forward and backward, gradients flowing back.
fn training_step(g: &mut Gen, batch: u64, seq: u64, hidden: u64, layers: u64) {
    let act = batch * seq * hidden * 4;
    let mut saved = Vec::new();
    for _ in 0..layers {
        let tmp = g.alloc(act * 4); // MLP hidden
        saved.push(g.alloc(act)); // attention output
        saved.push(g.alloc(batch * seq * seq * 4)); // attention probabilities
        g.free(tmp);
        saved.push(g.alloc(act)); // block output
    }
    let mut grad = g.alloc(act);
    while let Some(s) = saved.pop() {
        let t = g.alloc(act * 2);
        g.free(s);
        let next = g.alloc(act);
        g.free(grad);
        g.free(t);
        grad = next;
    }
    g.free(grad);
}

fn parameters(g: &mut Gen, layers: u64, hidden: u64) -> Vec<u64> {
    (0..layers)
        .flat_map(|_| [4 * hidden * hidden * 4, 8 * hidden * hidden * 4])
        .collect::<Vec<_>>()
        .into_iter()
        .map(|s| g.alloc_as(s, Category::Parameter))
        .collect()
}

/// Batches of 16 sequences whose length varies from 32 to 512 tokens.
pub fn variable_length_batches() -> Workload {
    let mut g = Gen::new(1);
    let params = parameters(&mut g, 6, 256);
    for _ in 0..40 {
        let seq = 32 + g.rand(481);
        training_step(&mut g, 16, seq, 256, 6);
    }
    for p in params {
        g.free(p);
    }
    g.finish("variable-length batches")
}

/// Batch 24 for 15 steps, then batch 40 for 15.
pub fn batch_size_change() -> Workload {
    let mut g = Gen::new(2);
    let params = parameters(&mut g, 6, 256);
    for step in 0..30 {
        let batch = if step < 15 { 24 } else { 40 };
        training_step(&mut g, batch, 128, 256, 6);
    }
    for p in params {
        g.free(p);
    }
    g.finish("batch size change")
}

/// The control for [`variable_length_batches`]: the same 40 steps, every
/// batch at the mean length (272 tokens).
pub fn fixed_length_batches() -> Workload {
    let mut g = Gen::new(1);
    let params = parameters(&mut g, 6, 256);
    for _ in 0..40 {
        training_step(&mut g, 16, 272, 256, 6);
    }
    for p in params {
        g.free(p);
    }
    g.finish("fixed-length batches")
}

/// The control for [`batch_size_change`]: 30 steps at batch 40 throughout.
pub fn fixed_batch_size() -> Workload {
    let mut g = Gen::new(2);
    let params = parameters(&mut g, 6, 256);
    for _ in 0..30 {
        training_step(&mut g, 40, 128, 256, 6);
    }
    for p in params {
        g.free(p);
    }
    g.finish("fixed batch size")
}

/// Generation: the key/value cache grows one token per step (re-allocated
/// each step), with per-step temporaries.
pub fn growing_inference() -> Workload {
    let mut g = Gen::new(3);
    let params = parameters(&mut g, 6, 256);
    let (batch, hidden, layers) = (8u64, 256u64, 6u64);
    let mut cache: Vec<u64> = Vec::new();
    for t in 1..=400u64 {
        let mut next_cache = Vec::new();
        for l in 0..layers as usize {
            let kv = g.alloc(2 * batch * t * hidden * 4);
            if let Some(&old) = cache.get(l) {
                g.free(old);
            }
            let scores = g.alloc(batch * t * 4 * 8);
            let out = g.alloc(batch * hidden * 4);
            g.free(scores);
            g.free(out);
            next_cache.push(kv);
        }
        cache = next_cache;
    }
    for id in cache.into_iter().chain(params) {
        g.free(id);
    }
    g.finish("growing-sequence inference")
}

/// The synthetic part of the suite.
pub fn suite() -> Vec<Workload> {
    vec![
        variable_length_batches(),
        batch_size_change(),
        growing_inference(),
    ]
}
