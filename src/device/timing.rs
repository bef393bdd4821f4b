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

use super::gpu::lock;
use serde::Serialize;
use std::sync::{Arc, Mutex};
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
    resolve: wgpu::Buffer,
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

/// Resolves the pending queries of `timer` and reads them back; the
/// caller has submitted every pass that writes them.
pub(crate) fn read_back(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    timer: &Mutex<Option<Timer>>,
) -> Result<(), String> {
    let mut guard = lock(timer);
    let Some(t) = guard.as_mut() else {
        return Ok(());
    };
    let Some(s) = t.stamps.as_mut() else {
        return Ok(());
    };
    let n = s.pending.len() as u32;
    if n == 0 {
        return Ok(());
    }
    let bytes = n as u64 * 16;
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("vramlab timing readback"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("vramlab timing"),
    });
    enc.resolve_query_set(&s.query_set, 0..n * 2, &s.resolve, 0);
    enc.copy_buffer_to_buffer(&s.resolve, 0, &readback, 0, bytes);
    queue.submit(Some(enc.finish()));
    let (tx, rx) = std::sync::mpsc::channel();
    readback.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;
    rx.recv()
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let ticks: Vec<u64> = {
        let view = readback
            .get_mapped_range(..)
            .map_err(|e| format!("{e:?}"))?;
        view.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect()
    };
    readback.unmap();
    let period = s.period_ns;
    for (i, p) in s.pending.drain(..).enumerate() {
        let (begin, end) = (ticks[2 * i], ticks[2 * i + 1]);
        t.done.push(DispatchTime {
            kernel: p.kernel,
            op: p.op,
            phase: p.phase,
            seconds: end.saturating_sub(begin) as f64 * period * 1e-9,
        });
    }
    Ok(())
}
