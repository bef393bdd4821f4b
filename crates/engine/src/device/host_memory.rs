//! The host's memory, from /proc/meminfo where there is one: a CPU
//! adapter's (lavapipe's) device memory is the host's.

/// `MemTotal`: what a CPU adapter's buffers can hold at most.
pub fn total() -> Option<u64> {
    field("MemTotal:")
}

/// `MemAvailable`: what can be had now without swapping.
pub fn available() -> Option<u64> {
    field("MemAvailable:")
}

fn field(name: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
