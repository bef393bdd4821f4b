//! Kernels compiled ahead, several at once. A driver compiles a product
//! kernel for a few hundred milliseconds, so the tuner, which times each
//! candidate tile after compiling it, spent most of its budget compiling
//! one kernel after another; it now learns which kernels its next
//! candidates run and compiles them together on the host's cores.

use super::{lock, Gpu, Kernel};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

impl Gpu {
    /// Runs `f` with its dispatches collected instead of recorded: the
    /// kernels it would run, as dispatched (windowed variants included), in
    /// order. Nothing reaches the device, so what `f` writes keeps what it
    /// held; what it allocates is allocated.
    pub fn kernels_of<R>(&self, f: impl FnOnce() -> R) -> (R, Vec<Kernel>) {
        let outer = lock(&self.collecting).replace(Vec::new());
        self.collect_on.store(true, Ordering::Relaxed);
        let r = f();
        let mut slot = lock(&self.collecting);
        let kernels = slot.take().unwrap_or_default();
        *slot = outer;
        self.collect_on.store(slot.is_some(), Ordering::Relaxed);
        (r, kernels)
    }

    /// Compiles the kernels not compiled yet, on up to `threads` threads at
    /// once, and says how many it compiled. A kernel that fails to compile
    /// is reported as its dispatch would report it.
    pub fn precompile(&self, kernels: &[Kernel], threads: usize) -> usize {
        let todo: Vec<&Kernel> = {
            let cache = lock(&self.pipelines);
            let mut seen = HashSet::new();
            kernels
                .iter()
                .filter(|k| !cache.contains_key(k.name.as_ref()) && seen.insert(k.name.as_ref()))
                .collect()
        };
        let next = AtomicUsize::new(0);
        let compiled = AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(kernel) = todo.get(i) else { break };
            if let Ok(built) = self.compile(kernel) {
                lock(&self.pipelines)
                    .entry(kernel.name.to_string())
                    .or_insert(built);
                compiled.fetch_add(1, Ordering::Relaxed);
            }
        };
        std::thread::scope(|s| {
            for _ in 1..threads.clamp(1, todo.len().max(1)) {
                s.spawn(work);
            }
            work();
        });
        compiled.into_inner()
    }
}
