//! Per-dispatch GPU time, like the "self device time" column of PyTorch's
//! profiler: every kernel dispatch is its own compute pass, so a timestamp
//! at the pass's beginning and end (TIMESTAMP_QUERY) brackets exactly that
//! kernel's work on the device. Where the adapter has no timestamp queries
//! the timer falls back to the host clock around a dispatch that is
//! submitted and waited for alone, and says so: the figure then includes
//! the submit and the wait.
//!
//! Queries are written into a fixed set; when it fills (and at every
//! synchronisation) the set is resolved into a buffer, read back and turned
//! into [`DispatchTime`]s, so a long run needs no unbounded query memory.

use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

/// Dispatches whose times one query set holds before it is read back.
const QUERY_PAIRS: u32 = 2048;

/// How times were measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingSource {
    /// GPU timestamps written at the start and end of each kernel's pass.
    TimestampQueries,
    /// The host clock around a dispatch submitted and waited for alone
    /// (the adapter has no TIMESTAMP_QUERY).
    WallClockSyncPerOp,
}

impl TimingSource {
    pub fn describe(self) -> &'static str {
        match self {
            TimingSource::TimestampQueries => "GPU timestamp queries around each kernel",
            TimingSource::WallClockSyncPerOp => {
                "host clock with a sync per kernel (this adapter has no timestamp queries)"
            }
        }
    }
}

/// One kernel dispatch's device time.
#[derive(Debug, Clone, Serialize)]
pub struct DispatchTime {
    /// The kernel (its pipeline name, variant included).
    pub kernel: String,
    /// The model-level op that issued it (the engine's scope: `conv2`,
    /// `conv2.backward`, `adam.step`, …).
    pub op: Arc<str>,
    /// The training phase (`forward`, `backward`, `optimizer`, or "").
    pub phase: Arc<str>,
    pub seconds: f64,
}

/// A dispatch whose timestamps are written but not yet read.
pub(crate) struct Pending {
    kernel: String,
    op: Arc<str>,
    phase: Arc<str>,
}

pub(crate) struct Timestamps {
    pub query_set: wgpu::QuerySet,
    /// Where the query set is resolved, for reading back.
    pub resolve: wgpu::Buffer,
    period_ns: f64,
    pending: Vec<Pending>,
}

/// The timer of one GPU; off until [`super::Gpu::start_timing`].
pub(crate) struct Timer {
    pub source: TimingSource,
    pub stamps: Option<Timestamps>,
    pub done: Vec<DispatchTime>,
    pub phase: Arc<str>,
    /// Wall-clock mode: the dispatch being timed and when it was recorded.
    pub wall: Option<(Pending, Instant)>,
}

impl Timer {
    /// A timer using timestamp queries where `features` has them and
    /// `prefer_wall_clock` is false, else the host clock.
    pub fn new(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        features: wgpu::Features,
        prefer_wall_clock: bool,
    ) -> Timer {
        let stamps = (features.contains(wgpu::Features::TIMESTAMP_QUERY) && !prefer_wall_clock)
            .then(|| Timestamps {
                query_set: device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("vramlab timing"),
                    ty: wgpu::QueryType::Timestamp,
                    count: QUERY_PAIRS * 2,
                }),
                resolve: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("vramlab timing resolve"),
                    size: QUERY_PAIRS as u64 * 16,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }),
                period_ns: queue.get_timestamp_period() as f64,
                pending: Vec::new(),
            });
        Timer {
            source: if stamps.is_some() {
                TimingSource::TimestampQueries
            } else {
                TimingSource::WallClockSyncPerOp
            },
            stamps,
            done: Vec::new(),
            phase: Arc::from(""),
            wall: None,
        }
    }

    /// The query indices for the next dispatch, or `None` when the set is
    /// full and must be read back first.
    /// Whether the next dispatch must wait first: timestamps whose query
    /// set is full (read back at a wait), or the wall clock (each
    /// dispatch alone between two waits).
    pub fn wants_wait(&self) -> bool {
        self.stamps
            .as_ref()
            .is_none_or(|s| s.pending.len() as u32 >= QUERY_PAIRS)
    }

    pub fn next_pair(&mut self, kernel: &str, op: Arc<str>) -> Option<u32> {
        let phase = self.phase.clone();
        let s = self.stamps.as_mut()?;
        let n = s.pending.len() as u32;
        if n >= QUERY_PAIRS {
            return None;
        }
        s.pending.push(Pending {
            kernel: kernel.to_string(),
            op,
            phase,
        });
        Some(n)
    }

    pub fn start_wall(&mut self, kernel: &str, op: Arc<str>) {
        let phase = self.phase.clone();
        self.wall = Some((
            Pending {
                kernel: kernel.to_string(),
                op,
                phase,
            },
            Instant::now(),
        ));
    }

    /// The pending queries to read back: the set, its resolve buffer and
    /// how many pairs were written; `None` when there are none.
    pub fn to_read(&self) -> Option<(wgpu::QuerySet, wgpu::Buffer, u32)> {
        let s = self.stamps.as_ref()?;
        let n = s.pending.len() as u32;
        (n > 0).then(|| (s.query_set.clone(), s.resolve.clone(), n))
    }

    /// Turns the pending dispatches into times, given their resolved
    /// timestamps (a begin and an end tick per dispatch).
    pub fn resolved(&mut self, ticks: &[u64]) {
        let Some(s) = self.stamps.as_mut() else {
            return;
        };
        let period = s.period_ns;
        for (p, pair) in s.pending.drain(..).zip(ticks.chunks_exact(2)) {
            self.done.push(DispatchTime {
                kernel: p.kernel,
                op: p.op,
                phase: p.phase,
                seconds: pair[1].saturating_sub(pair[0]) as f64 * period * 1e-9,
            });
        }
    }

    pub fn finish_wall(&mut self) {
        if let Some((p, t0)) = self.wall.take() {
            self.done.push(DispatchTime {
                kernel: p.kernel,
                op: p.op,
                phase: p.phase,
                seconds: t0.elapsed().as_secs_f64(),
            });
        }
    }
}
