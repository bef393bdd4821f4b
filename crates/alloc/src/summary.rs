//! `torch.cuda.memory_summary()`, line for line: the same metrics, the same
//! columns, the same unit scaling (a row is scaled by its first cell), so the
//! two tables can be read side by side.

use super::stats::{DeviceStats, Stat, StatType};

fn format_size(mut sz: i64, pref: i64) -> String {
    let prefixes = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut prefix = prefixes[0];
    let mut pref = pref as f64;
    for p in &prefixes[1..] {
        if pref < 768.0 * 1024.0 {
            break;
        }
        prefix = p;
        sz /= 1024;
        pref /= 1024.0;
    }
    format!("{sz:6} {prefix}")
}

fn format_count(mut cnt: i64, pref: i64) -> String {
    let prefixes = [" ", "K", "M"];
    let mut prefix = prefixes[0];
    let mut pref = pref as f64;
    for p in &prefixes[1..] {
        if pref < 750.0 * 1000.0 {
            break;
        }
        prefix = p;
        cnt /= 1000;
        pref /= 1000.0;
    }
    format!("{cnt:7} {prefix} ")
}

type Formatter = fn(i64, i64) -> String;

fn row(name: &str, s: &Stat, pref: &Stat, f: Formatter) -> String {
    format!(
        " {:<21} | {} | {} | {} | {} ",
        name,
        f(s.current, pref.current),
        f(s.peak, pref.peak),
        f(s.allocated, pref.allocated),
        f(s.freed, pref.freed)
    )
}

/// Renders the summary table. `device` names the device in the title line.
pub fn memory_summary(stats: &DeviceStats, device: &str, abbreviated: bool) -> String {
    let rule = |c: &str| c.repeat(75);
    let mut lines = vec![
        rule("="),
        format!("{:^75}", format!("vramlab memory summary, {device}")),
        rule("-"),
        format!(
            "{:^37}|{:^37}",
            format!("OOMs: {}", stats.num_ooms),
            format!("device alloc retries: {}", stats.num_alloc_retries)
        ),
        rule("="),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    let metrics: [(&str, &super::stats::StatArray, Formatter); 9] = [
        ("Allocated memory", &stats.allocated_bytes, format_size),
        ("Active memory", &stats.active_bytes, format_size),
        ("Requested memory", &stats.requested_bytes, format_size),
        ("GPU reserved memory", &stats.reserved_bytes, format_size),
        (
            "Non-releasable memory",
            &stats.inactive_split_bytes,
            format_size,
        ),
        ("Allocations", &stats.allocation, format_count),
        ("Active allocs", &stats.active, format_count),
        ("GPU reserved segments", &stats.segment, format_count),
        ("Non-releasable allocs", &stats.inactive_split, format_count),
    ];
    for (name, arr, f) in metrics {
        lines.push(rule("-"));
        let all = arr.get(StatType::Aggregate);
        lines.push(row(name, all, all, f));
        if !abbreviated {
            lines.push(row(
                "      from large pool",
                arr.get(StatType::LargePool),
                all,
                f,
            ));
            lines.push(row(
                "      from small pool",
                arr.get(StatType::SmallPool),
                all,
                f,
            ));
        }
    }
    for (name, s) in [
        ("Oversize allocations", &stats.oversize_allocations),
        ("Oversize GPU segments", &stats.oversize_segments),
    ] {
        lines.push(rule("-"));
        lines.push(row(name, s, s, format_count));
    }
    lines.push(rule("="));
    let mut out = String::new();
    for l in lines {
        out.push('|');
        out.push_str(&l);
        out.push_str("|\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_units_like_pytorch() {
        // From a real torch summary: 184648 KiB current, scaled by its own value.
        assert_eq!(format_size(184648 * 1024, 184648 * 1024), "184648 KiB");
        assert_eq!(format_size(0, 0), "     0 B  ");
        assert_eq!(format_size(72 * 1024, 184648 * 1024), "    72 KiB");
        assert_eq!(format_count(21, 21), "     21   ");
    }

    #[test]
    fn every_line_is_77_wide() {
        let s = memory_summary(&DeviceStats::default(), "simulated", false);
        for l in s.lines() {
            assert_eq!(l.chars().count(), 77, "{l:?}");
        }
        assert!(s.contains("Non-releasable memory"));
    }
}
