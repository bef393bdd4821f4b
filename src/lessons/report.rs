//! The lessons as one self-contained HTML page: a verdict table, then each
//! lesson with its claim, experiment, figures and, where it has one, a plot
//! drawn as inline SVG (no external files, so the page opens anywhere,
//! offline; one small script only checks that everything was drawn).

use super::{Lesson, Outcome, Series};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Tableau's ten, so a plot's lines (X01 has six) each get their own.
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// A line plot of `s` as SVG, its legend below the axes (off the data).
pub fn svg(s: &Series) -> String {
    let (w, h, l, r, t, b) = (560.0, 300.0, 70.0, 20.0, 30.0, 50.0);
    let pts: Vec<(f64, f64)> = s
        .lines
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    if pts.is_empty() {
        return String::new();
    }
    let (x0, x1) = pts
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y1 = pts.iter().fold(0.0f64, |m, p| m.max(p.1)) * 1.08;
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let y1 = if y1 > 0.0 { y1 } else { 1.0 };
    let sx = |x: f64| l + (x - x0) / (x1 - x0) * (w - l - r);
    let sy = |y: f64| h - b - y / y1 * (h - t - b);
    // The legend's rows go below the plot.
    let total_h = h + 14.0 * s.lines.len() as f64;
    // Ticks at each x where there are few (categories, sizes tried), else
    // five, at whole numbers where every x is one (layers, events).
    let whole = pts.iter().all(|p| p.0.fract() == 0.0);
    let mut xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let x_ticks: Vec<f64> = if xs.len() <= 8 {
        xs
    } else {
        (0..=4)
            .map(|k| x0 + (x1 - x0) * k as f64 / 4.0)
            .map(|x| if whole { x.round() } else { x })
            .collect()
    };
    let mut o = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{total_h}" viewBox="0 0 {w} {total_h}" role="img" aria-label="{}">"#,
        esc(&s.title)
    );
    o += &format!(
        r#"<text x="{}" y="18" font-size="13" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(&s.title)
    );
    o += &format!(
        r##"<line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="#444"/><line x1="{l}" y1="{t}" x2="{l}" y2="{}" stroke="#444"/>"##,
        h - b,
        w - r,
        h - b,
        h - b
    );
    for k in 0..=4 {
        let y = y1 * k as f64 / 4.0;
        o += &format!(
            r##"<text x="{}" y="{}" font-size="10" text-anchor="end">{}</text><line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="#eee"/>"##,
            l - 5.0,
            sy(y) + 3.0,
            short(y),
            sy(y),
            w - r,
            sy(y)
        );
    }
    for &x in &x_ticks {
        o += &format!(
            r#"<text x="{}" y="{}" font-size="10" text-anchor="middle">{}</text>"#,
            sx(x),
            h - b + 14.0,
            short(x)
        );
    }
    o += &format!(
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
        (l + w - r) / 2.0,
        h - 12.0,
        esc(&s.x_label)
    );
    o += &format!(
        r#"<text x="14" y="{}" font-size="11" text-anchor="middle" transform="rotate(-90 14 {})">{}</text>"#,
        (t + h - b) / 2.0,
        (t + h - b) / 2.0,
        esc(&s.y_label)
    );
    let n = s.lines.len();
    for (i, (name, p)) in s.lines.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = p
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        // Earlier lines wider, so one a later line covers still shows.
        let width = 2.0 + (n - 1 - i).min(3) as f64;
        o += &format!(
            r#"<polyline fill="none" stroke="{c}" stroke-width="{width}" stroke-opacity="0.85" points="{}"/>"#,
            path.join(" ")
        );
        if p.len() <= 40 {
            for &(x, y) in p {
                o += &format!(
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                    sx(x),
                    sy(y)
                );
            }
        }
        let ly = h + 14.0 * i as f64 + 4.0;
        o += &format!(
            r#"<line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}" font-size="11" fill="{c}">{}</text>"#,
            ly - 4.0,
            l + 18.0,
            ly - 4.0,
            l + 24.0,
            ly,
            esc(name)
        );
    }
    o + "</svg>"
}

fn short(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The page for every lesson's outcome (or the error that stopped it).
pub fn html(results: &[(&Lesson, Result<Outcome, String>)], source: &str) -> String {
    let mut o = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>vramlab lessons</title><style>\
body{font:14px/1.45 system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\
.holds{color:#1a7f37}.wrong{color:#b42318}.partly{color:#9a6700}.scope{color:#555}\
blockquote{margin:.4em 0;padding:.2em .8em;border-left:3px solid #bbb;color:#444}section{margin:2em 0}\
</style></head><body><h1>vramlab: the documents' claims, measured</h1>",
    );
    o += &format!("<p>Each claim of the five articles (docs/claims.md in vramlab's repository) as an experiment; figures from a {}. Verdicts follow from the figures.</p>", esc(source));
    o += "<table id=\"verdicts\"><tr><th>claim</th><th>verdict</th><th>what the figures say</th></tr>";
    for (l, r) in results {
        let (class, word, why) = match r {
            // The verdict's own detail where it has one, else why it holds.
            Ok(out) => (
                class_of(out),
                out.verdict.word().to_string(),
                out.verdict.detail().unwrap_or(&out.reason).to_string(),
            ),
            Err(e) => ("wrong", "error".to_string(), e.clone()),
        };
        o += &format!(
            "<tr><td><a href=\"#{id}\">{id}</a></td><td class=\"{class}\">{}</td><td>{}</td></tr>",
            esc(&word),
            esc(&why),
            id = l.id
        );
    }
    o += "</table>";
    for (l, r) in results {
        o += &format!(
            "<section id=\"{}\"><h2>{} <small>({})</small></h2>",
            l.id,
            l.id,
            l.origin()
        );
        o += &format!(
            "<blockquote>{}</blockquote><p><b>Experiment:</b> {}</p>",
            esc(l.claim),
            esc(l.experiment)
        );
        match r {
            Ok(out) => {
                if !out.figures.is_empty() {
                    o += "<table>";
                    for f in &out.figures {
                        o += &format!(
                            "<tr><td>{}</td><td>{} {}</td></tr>",
                            esc(&f.name),
                            short(f.value),
                            f.unit
                        );
                    }
                    o += "</table>";
                }
                let detail = out
                    .verdict
                    .detail()
                    .map_or(String::new(), |d| format!(": {}", esc(d)));
                o += &format!(
                    "<p class=\"{}\"><b>{}</b>{detail}</p><p>{}</p>",
                    class_of(out),
                    out.verdict.word(),
                    esc(&out.reason)
                );
                for s in out.series.iter().chain(&out.extra_series) {
                    o += &svg(s);
                }
            }
            Err(e) => o += &format!("<p class=\"wrong\">error: {}</p>", esc(e)),
        }
        o += "</section>";
    }
    // The page checks itself: every lesson has a section and every plot a
    // line; a test loads it in headless Chromium and reads this mark.
    o += &format!(
        "<script>(function(){{var s=document.querySelectorAll('section').length;\
var p=document.querySelectorAll('svg').length,l=document.querySelectorAll('svg polyline').length;\
document.body.dataset.status=(s=={} && l>=p)?'ok':'incomplete';document.body.dataset.plots=p;}})();</script>",
        results.len()
    );
    o + "</body></html>\n"
}

fn class_of(o: &Outcome) -> &'static str {
    match o.verdict {
        super::Verdict::Holds => "holds",
        super::Verdict::Wrong(_) => "wrong",
        super::Verdict::Partly(_) => "partly",
        super::Verdict::OutOfScope(_) => "scope",
    }
}
