//! Device time per op, per kernel and per phase, from the timed dispatches
//! of a run: the "self device time" table of PyTorch's profiler, in
//! vramlab's words (an op is the model-level scope that issued the kernels:
//! `conv2`, `conv2.backward`, `adam.step`).

use crate::device::{DispatchTime, TimingSource};
use serde::Serialize;
use std::collections::HashMap;

/// One row of a table: a name, dispatches, device seconds, share of total.
#[derive(Debug, Clone, Serialize)]
pub struct TimeRow {
    pub name: String,
    pub calls: usize,
    pub seconds: f64,
    pub share: f64,
}

/// Times of one run, grouped three ways.
#[derive(Debug, Clone, Serialize)]
pub struct OpTimes {
    pub source: TimingSource,
    pub source_description: &'static str,
    pub total_seconds: f64,
    pub dispatches: usize,
    /// forward, backward, optimizer, in order of first appearance.
    pub phases: Vec<TimeRow>,
    /// Model-level ops, most time first.
    pub ops: Vec<TimeRow>,
    /// Kernels (variant included), most time first.
    pub kernels: Vec<TimeRow>,
}

fn group<'a>(
    times: &'a [DispatchTime],
    key: impl Fn(&'a DispatchTime) -> &'a str,
    total: f64,
    keep_order: bool,
) -> Vec<TimeRow> {
    let mut rows: Vec<TimeRow> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for t in times {
        let k = key(t);
        let i = *index.entry(k).or_insert_with(|| {
            rows.push(TimeRow {
                name: if k.is_empty() {
                    "(outside any op)".into()
                } else {
                    k.to_string()
                },
                calls: 0,
                seconds: 0.0,
                share: 0.0,
            });
            rows.len() - 1
        });
        rows[i].calls += 1;
        rows[i].seconds += t.seconds;
    }
    for r in &mut rows {
        r.share = if total > 0.0 { r.seconds / total } else { 0.0 };
    }
    if !keep_order {
        rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    }
    rows
}

impl OpTimes {
    pub fn of(source: TimingSource, times: &[DispatchTime]) -> OpTimes {
        let total: f64 = times.iter().map(|t| t.seconds).sum();
        OpTimes {
            source,
            source_description: source.describe(),
            total_seconds: total,
            dispatches: times.len(),
            phases: group(times, |t| &t.phase, total, true),
            ops: group(times, |t| &t.op, total, false),
            kernels: group(times, |t| &t.kernel, total, false),
        }
    }

    /// The per-op table (and the phase line), for a terminal.
    pub fn table(&self, rows: usize) -> String {
        let mut s = format!(
            "device time per op ({}; {} dispatches, {:.1} ms in all)\n",
            self.source_description,
            self.dispatches,
            self.total_seconds * 1e3
        );
        s.push_str("  phases: ");
        let phases: Vec<String> = self
            .phases
            .iter()
            .map(|p| format!("{} {:.1} ms", p.name, p.seconds * 1e3))
            .collect();
        s.push_str(&phases.join(", "));
        s.push('\n');
        // The name column fits the longest name shown, so no row shifts.
        let width = self
            .ops
            .iter()
            .take(rows)
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(28);
        s.push_str(&format!(
            "  {:<width$} {:>6} {:>11} {:>7}\n",
            "op", "calls", "device ms", "share"
        ));
        for r in self.ops.iter().take(rows) {
            s.push_str(&format!(
                "  {:<width$} {:>6} {:>11.2} {:>6.1}%\n",
                r.name,
                r.calls,
                r.seconds * 1e3,
                r.share * 100.0
            ));
        }
        if self.ops.len() > rows {
            s.push_str(&format!("  … {} more ops\n", self.ops.len() - rows));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn t(kernel: &str, op: &str, phase: &str, s: f64) -> DispatchTime {
        DispatchTime {
            kernel: kernel.into(),
            op: Arc::from(op),
            phase: Arc::from(phase),
            seconds: s,
        }
    }

    #[test]
    fn groups_by_op_kernel_and_phase() {
        let times = [
            t("matmul", "conv1", "forward", 1.0),
            t("relu", "relu1", "forward", 0.5),
            t("matmul", "conv1.backward", "backward", 2.0),
            t("matmul", "conv1", "forward", 1.0),
            t("adam", "adam.step", "optimizer", 0.5),
        ];
        let o = OpTimes::of(TimingSource::TimestampQueries, &times);
        assert_eq!(o.total_seconds, 5.0);
        let names: Vec<&str> = o.phases.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["forward", "backward", "optimizer"]);
        assert_eq!(o.phases[0].seconds, 2.5);
        assert_eq!(o.ops[0].name, "conv1");
        assert_eq!((o.ops[0].calls, o.ops[0].seconds), (2, 2.0));
        assert_eq!(o.kernels[0].name, "matmul");
        assert_eq!(o.kernels[0].calls, 3);
        assert!((o.ops.iter().map(|r| r.share).sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(o.table(10).contains("conv1.backward"));
    }
}
