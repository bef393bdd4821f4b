//! One buffer of an offline planning problem: an id, a half-open lifetime
//! and a size, as interval files (intervals.rs) and plans name it.

/// The header interval files start with (`intervals::to_csv` writes it;
/// `parse_csv` takes the columns in any order).
pub const HEADER: &str = "id,lower,upper,size";

/// One buffer: its id, lifetime `[lower, upper)` and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interval {
    /// Arbitrary integer name, unique within a problem.
    pub id: i64,
    /// First time the buffer is live.
    pub lower: i64,
    /// First time the buffer is no longer live (exclusive end).
    pub upper: i64,
    /// Size in bytes, at least 1.
    pub size: u64,
}

impl Interval {
    /// Whether the two lifetimes share a moment (half-open intervals).
    pub fn overlaps_in_time(&self, other: &Interval) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}
