//! `--record 'COMMAND'` for `max-batch` and `sweep`: your own PyTorch step,
//! recorded at each batch size by COMMAND (the recorder in python/:
//! `python -m vramlab_torch record model.py:build --input {batch},3,224,224`)
//! on fake tensors, and replayed through the caching allocator on a
//! simulated device. No GPU, and no memory but the recorder's.

use crate::lab::torch_snapshot::{read_all, replay_from_state};
use crate::memory::AllocatorConfig;
use anyhow::Context;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The user's recorder command, with `{batch}` where the batch size goes
/// and, optionally, `{out}` where the snapshot is written (else
/// `--out PATH` is appended).
pub struct Recorder {
    template: String,
    dir: PathBuf,
    /// The folder, removed on an interrupt as on drop (dropped after it).
    _on_interrupt: crate::io::interrupt::Pending,
}

/// One recorded batch size, replayed.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    pub batch: usize,
    /// The recorder's wall time.
    pub record_seconds: f64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Allocations the simulated device refused.
    pub ooms: u64,
    pub fits: bool,
}

impl Recorder {
    /// The recorder for `template`; a zoo model's size flags in `model` are
    /// refused, since the command decides the model and its sizes.
    pub fn new(template: &str, model: &super::args::ModelArgs) -> anyhow::Result<Recorder> {
        if let Some(flag) = model.size_flags_given().first() {
            anyhow::bail!(
                "--{flag} sizes a zoo model; with --record the model and its sizes are the recorder command's"
            );
        }
        if !template.contains("{batch}") {
            anyhow::bail!(
                "--record {template:?} has no {{batch}}: write where the batch size goes, e.g. --record 'python -m vramlab_torch record model.py:build --input {{batch}},3,224,224 --optimizer sgd'"
            );
        }
        let dir = std::env::temp_dir().join(format!("vramlab-record-{}", std::process::id()));
        // Registered first: an interrupt right after the folder is made
        // still removes it.
        let on_interrupt = crate::io::interrupt::register(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the recordings' folder {}", dir.display()))?;
        Ok(Recorder {
            template: template.to_string(),
            _on_interrupt: on_interrupt,
            dir,
        })
    }

    /// The command line for `batch`, writing to `out`.
    pub fn command_for(&self, batch: usize, out: &Path) -> String {
        let quoted = format!("'{}'", out.display().to_string().replace('\'', r"'\''"));
        let cmd = self.template.replace("{batch}", &batch.to_string());
        if cmd.contains("{out}") {
            cmd.replace("{out}", &quoted)
        } else {
            format!("{cmd} --out {quoted}")
        }
    }

    /// Records `batch` and replays it on a device of `capacity` bytes
    /// (unlimited: `None`) under `config`, or the recording's own settings
    /// when `config` is `None`.
    pub fn probe(
        &self,
        batch: usize,
        config: Option<&AllocatorConfig>,
        capacity: Option<u64>,
    ) -> anyhow::Result<Probe> {
        let out = self.dir.join(format!("batch-{batch}.pickle"));
        // An interrupt while the recorder runs removes what it wrote.
        let _on_interrupt = crate::io::interrupt::register(&out);
        let cmd = self.command_for(batch, &out);
        let start = Instant::now();
        let run = shell(&cmd)
            .output()
            .with_context(|| format!("running the recorder: {cmd}"))?;
        let record_seconds = start.elapsed().as_secs_f64();
        if !run.status.success() {
            let err = String::from_utf8_lossy(&run.stderr);
            let tail: Vec<&str> = err.lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            anyhow::bail!(
                "the recorder failed for batch {batch} ({}):\n  {cmd}\n{}",
                run.status,
                tail.join("\n")
            );
        }
        let bytes = std::fs::read(&out).with_context(|| {
            format!(
                "the recorder exited without writing {} (does the command write its snapshot to {{out}} or --out?)",
                out.display()
            )
        })?;
        let _ = std::fs::remove_file(&out);
        let name = format!("batch {batch}");
        let file = read_all(&bytes, &name)?;
        let config = config
            .cloned()
            .or_else(|| file.settings.clone())
            .unwrap_or_default();
        let (mut alloc, mut reserved, mut ooms) = (0, 0, 0);
        for snap in &file.devices {
            let r = replay_from_state(snap, config.clone(), capacity)?;
            alloc = alloc.max(r.peak_allocated_bytes);
            reserved = reserved.max(r.peak_reserved_bytes);
            ooms += r.ooms;
        }
        Ok(Probe {
            batch,
            record_seconds,
            peak_allocated_bytes: alloc,
            peak_reserved_bytes: reserved,
            ooms,
            fits: ooms == 0,
        })
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn shell(cmd: &str) -> std::process::Command {
    if cfg!(windows) {
        let mut c = std::process::Command::new("cmd");
        c.args(["/C", cmd]);
        c
    } else {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", cmd]);
        c
    }
}

/// What a recording on fake tensors leaves out, for the commands to say.
pub const UNSEEN: &str = "on fake tensors: the CUDA context, kernels' internal scratch, cuDNN BatchNorm's reserve space and NCCL's own buffers are not in it; cuBLAS and cuDNN convolution workspaces are added by rule (python/README.md)";
