//! `timeline.svg`: memory over the run, stacked by category, with the
//! allocated and reserved lines and the phases marked. The x axis is the
//! event sequence (as memory_viz draws it), so short phases stay visible.

use super::series::Series;
use crate::memory::CATEGORIES;
use std::fmt::Write;

/// One colour per category, in `CATEGORIES` order.
pub const COLORS: [&str; crate::memory::tag::N_CATEGORIES] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#17becf", "#9c755f",
];

const W: f64 = 1100.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;

pub fn render(series: &Series, title: &str) -> String {
    let n = series.allocated.len().max(1);
    let max = series.reserved.iter().copied().max().unwrap_or(1).max(1) as f64;
    let x = |i: usize| LEFT + W * i as f64 / (n.max(2) - 1) as f64;
    let y = |b: f64| TOP + H - H * b / max;
    // At most ~1500 sample points: the max-allocated event of each bucket.
    let step = n.div_ceil(1500).max(1);
    let idx: Vec<usize> = (0..n)
        .step_by(step)
        .map(|s| {
            (s..(s + step).min(n))
                .max_by_key(|&i| series.allocated.get(i).copied().unwrap_or(0))
                .unwrap_or(s)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="22" font-size="15">{}</text>
"##,
        LEFT + W + 190.0,
        TOP + H + 50.0,
        escape(title)
    );
    // Stacked areas, bottom category first.
    let mut lower: Vec<f64> = vec![0.0; idx.len()];
    for (c, color) in CATEGORIES.iter().zip(COLORS) {
        let upper: Vec<f64> = idx
            .iter()
            .zip(&lower)
            .map(|(&i, l)| l + series.by_category.get(i).map_or(0, |t| t[c.index()]) as f64)
            .collect();
        if upper.iter().zip(&lower).all(|(u, l)| u == l) {
            continue;
        }
        let mut pts = String::new();
        for (k, &i) in idx.iter().enumerate() {
            let _ = write!(pts, "{:.1},{:.1} ", x(i), y(upper[k]));
        }
        for (k, &i) in idx.iter().enumerate().rev() {
            let _ = write!(pts, "{:.1},{:.1} ", x(i), y(lower[k]));
        }
        let _ = writeln!(
            out,
            r#"<polygon points="{pts}" fill="{color}" fill-opacity="0.85"><title>{}</title></polygon>"#,
            c.name()
        );
        lower = upper;
    }
    for (vals, color, dash, name) in [
        (&series.allocated, "black", "", "allocated"),
        (&series.reserved, "#d62728", "6,3", "reserved"),
    ] {
        let pts: String = idx
            .iter()
            .map(|&i| format!("{:.1},{:.1} ", x(i), y(vals[i] as f64)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5" stroke-dasharray="{dash}"><title>{name}</title></polyline>"#
        );
    }
    for (i, name) in &series.phases {
        let _ = writeln!(
            out,
            r##"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{1}" stroke="#555" stroke-dasharray="2,3"/><text x="{2:.1}" y="{3}" fill="#333" transform="rotate(-90 {2:.1} {3})">{4}</text>"##,
            x(*i),
            TOP + H,
            x(*i) + 11.0,
            TOP + 60.0,
            escape(name)
        );
    }
    // Axes.
    for k in 0..=5 {
        let b = max * k as f64 / 5.0;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{4:.1} MiB</text>"##,
            y(b),
            LEFT + W,
            LEFT - 5.0,
            y(b) + 4.0,
            b / 1048576.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">allocation events (peak allocated {:.2} MiB at event {})</text>"#,
        LEFT + W / 2.0,
        TOP + H + 30.0,
        series
            .allocated
            .get(series.peak_index)
            .copied()
            .unwrap_or(0) as f64
            / 1048576.0,
        series.peak_index
    );
    // Legend.
    let mut ly = TOP;
    for (c, color) in CATEGORIES.iter().zip(COLORS) {
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{ly}" width="12" height="12" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            LEFT + W + 15.0,
            LEFT + W + 32.0,
            ly + 10.0,
            c.name()
        );
        ly += 18.0;
    }
    let _ = writeln!(
        out,
        r##"<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black" stroke-width="1.5"/><text x="{3}" y="{4}">allocated</text>
<line x1="{0}" y1="{5}" x2="{2}" y2="{5}" stroke="#d62728" stroke-dasharray="6,3" stroke-width="1.5"/><text x="{3}" y="{6}">reserved</text>
</svg>"##,
        LEFT + W + 15.0,
        ly + 6.0,
        LEFT + W + 27.0,
        LEFT + W + 32.0,
        ly + 10.0,
        ly + 24.0,
        ly + 28.0
    );
    out
}

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
