//! Spreading a 1-D count of workgroups over a 2-D or 3-D grid, because one
//! dimension may hold at most `max_compute_workgroups_per_dimension` (65,535 on
//! most devices): an elementwise op on 20 M floats with 256 threads per group
//! needs 78,125 groups. Kernels rebuild the linear index from `workgroup_id`
//! and `num_workgroups` and skip the few extra groups.

/// How many workgroups a dispatch wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workgroups {
    /// A count to spread over up to three dimensions.
    Linear(u64),
    /// An explicit grid (e.g. matmul tiles × batch).
    Grid([u32; 3]),
}

/// The smallest grid (x, y, z) covering `n` groups with every dimension at
/// most `max_dim`, or `None` if even `max_dim³` is not enough.
pub fn grid_for(n: u64, max_dim: u32) -> Option<[u32; 3]> {
    let m = max_dim.max(1) as u64;
    if n <= m {
        return Some([n as u32, 1, 1]);
    }
    if n <= m * m {
        let y = n.div_ceil(m);
        let x = n.div_ceil(y);
        return Some([x as u32, y as u32, 1]);
    }
    if n <= m * m * m {
        let z = n.div_ceil(m * m);
        let per_z = n.div_ceil(z);
        let y = per_z.div_ceil(m);
        let x = per_z.div_ceil(y);
        return Some([x as u32, y as u32, z as u32]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_and_respects_the_limit() {
        for (n, max) in [
            (1u64, 65535u32),
            (65535, 65535),
            (65536, 65535),
            (78125, 65535),
            (10, 3),
            (27, 3),
            (1_000_000, 100),
        ] {
            let g = grid_for(n, max).unwrap();
            let total: u64 = g.iter().map(|&d| d as u64).product();
            assert!(total >= n, "{n} {max} {g:?}");
            assert!(g.iter().all(|&d| d <= max), "{n} {max} {g:?}");
            // No more than one extra row of waste per dimension.
            assert!(
                total < n + (g[0] as u64) * (g[1] as u64) + g[0] as u64,
                "{n} {g:?}"
            );
        }
        assert_eq!(grid_for(65536, 65535), Some([32768, 2, 1]));
        assert_eq!(grid_for(28, 3), None);
    }
}
