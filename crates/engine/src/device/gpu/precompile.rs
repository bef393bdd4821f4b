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
    /// held; what it allocates is allocated. A collection around this one
    /// does not see these kernels; should `f` panic, dispatches are
    /// recorded again.
    pub fn kernels_of<R>(&self, f: impl FnOnce() -> R) -> (R, Vec<Kernel>) {
        /// Puts back the collection around this one, however `f` ends.
        struct Restore<'a> {
            gpu: &'a Gpu,
            outer: Option<Vec<Kernel>>,
        }
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                let mut slot = lock(&self.gpu.collecting);
                *slot = self.outer.take();
                self.gpu.collect_on.store(slot.is_some(), Ordering::Relaxed);
            }
        }
        let restore = Restore {
            gpu: self,
            outer: lock(&self.collecting).replace(Vec::new()),
        };
        self.collect_on.store(true, Ordering::Relaxed);
        let r = f();
        let kernels = lock(&self.collecting).take().unwrap_or_default();
        drop(restore);
        (r, kernels)
    }

    /// Compiles the kernels not compiled yet, on up to `threads` threads at
    /// once, and says how many it compiled. Errors cannot be told apart
    /// between threads, so where any compile fails none is kept and the
    /// errors are dropped: each kernel then compiles at its dispatch, which
    /// reports its own.
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
        if self.take_errors().is_err() {
            let mut cache = lock(&self.pipelines);
            for k in &todo {
                cache.remove(k.name.as_ref());
            }
            return 0;
        }
        compiled.into_inner()
    }
}
