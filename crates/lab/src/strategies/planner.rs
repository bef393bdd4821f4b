//! `planner`: offline. Knowing every tensor's size and lifetime in advance,
//! it packs them into one arena with greedy-by-size placement (Pisarchyk &
//! Lee, "Efficient Memory Management for Deep Neural Net Inference",
//! arXiv 2001.03288): largest first, each at the best-fitting gap among the
//! already placed tensors whose lifetimes overlap its own. Its arena is the
//! reference for the online strategies; the lower bound for every strategy
//! is the peak of live requested bytes.

use super::align;
use crate::memory::constants::K_MIN_BLOCK_SIZE;

/// One tensor: size and lifetime [first, last] in operation indices.
#[derive(Debug, Clone, Copy)]
pub struct Lifetime {
    pub size: u64,
    pub first: usize,
    pub last: usize,
}

/// The arena size and each tensor's offset.
pub struct Plan {
    pub arena: u64,
    pub offsets: Vec<u64>,
}

/// Greedy by size (the paper's best on its networks); also greedy in
/// allocation order, which wins on traces whose tensors grow over time
/// (generation with a growing cache) — the smaller arena is kept.
pub fn plan(tensors: &[Lifetime]) -> Plan {
    let mut by_size: Vec<usize> = (0..tensors.len()).collect();
    by_size.sort_by(|&a, &b| {
        tensors[b]
            .size
            .cmp(&tensors[a].size)
            .then(tensors[a].first.cmp(&tensors[b].first))
    });
    let in_order: Vec<usize> = (0..tensors.len()).collect();
    let a = place(tensors, &by_size);
    let b = place(tensors, &in_order);
    if b.arena < a.arena {
        b
    } else {
        a
    }
}

/// Places tensors in `order`, each at the best-fitting gap among placed
/// tensors whose lifetimes overlap its own.
fn place(tensors: &[Lifetime], order: &[usize]) -> Plan {
    let mut offsets = vec![u64::MAX; tensors.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut arena = 0;
    for &t in order {
        let me = tensors[t];
        let size = align(me.size.max(1), K_MIN_BLOCK_SIZE);
        let mut overlapping: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&p| tensors[p].first <= me.last && me.first <= tensors[p].last)
            .map(|&p| (offsets[p], align(tensors[p].size.max(1), K_MIN_BLOCK_SIZE)))
            .collect();
        overlapping.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap, offset)
        let mut prev_end: u64 = 0;
        for &(off, len) in &overlapping {
            // Saturating: an arena past u64 (and past the 2^62 bytes any
            // device holds) is refused by the caller, not wrapped.
            if off >= prev_end.saturating_add(size) {
                let gap = off - prev_end;
                if best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, prev_end));
                }
            }
            prev_end = prev_end.max(off.saturating_add(len));
        }
        let offset = best.map(|(_, o)| o).unwrap_or(prev_end);
        offsets[t] = offset;
        arena = arena.max(offset.saturating_add(size));
        placed.push(t);
    }
    Plan { arena, offsets }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_lifetimes_share_memory_and_overlapping_ones_do_not() {
        let mib = 1 << 20;
        let t = [
            Lifetime {
                size: 4 * mib,
                first: 0,
                last: 1,
            },
            Lifetime {
                size: 4 * mib,
                first: 2,
                last: 3,
            },
            Lifetime {
                size: 2 * mib,
                first: 1,
                last: 2,
            },
        ];
        let p = plan(&t);
        assert_eq!(p.arena, 6 * mib);
        assert_eq!(p.offsets[0], p.offsets[1]);
        for (i, j) in [(0, 2), (1, 2)] {
            let (a, b) = (p.offsets[i], p.offsets[j]);
            assert!(
                a + t[i].size <= b || b + t[j].size <= a,
                "{i} and {j} overlap"
            );
        }
    }
}
