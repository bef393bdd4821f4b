//! What an engine notes about the work it runs, apart from the memory
//! itself: the open scopes that tag allocations, op numbers (`relu1`,
//! `relu2`), layer output shapes and the tensors saved for backward, and
//! slots that the layers above fill (the matmul log). Kept out of the
//! engine's device and allocator state so each log is one type's concern.

use crate::device::gpu::lock;
use crate::memory::{BlockHandle, Category};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One tensor saved for backward.
#[derive(Debug, Clone)]
pub struct SavedTensor {
    /// The storage's block: views of one storage share it, so counting
    /// distinct blocks counts each storage once.
    pub block: BlockHandle,
    /// The tensor's bytes (unrounded).
    pub bytes: u64,
    /// Its category before saving (a forward output, a parameter, an input).
    pub category: Category,
    pub label: String,
    /// The op scope it was saved in (`h.0.ln_1.forward`, `softmax1.forward`).
    pub scope: Arc<str>,
}

#[derive(Default)]
pub struct Instruments {
    /// Open scopes, innermost last: allocations take the last one's tags.
    scopes: Mutex<Vec<(Category, Arc<str>)>>,
    /// Each layer's output shape, in call order, while the allocator
    /// records (the per-layer table of `estimate`).
    layer_outputs: Mutex<Vec<(Arc<str>, Vec<usize>)>>,
    /// Tensors saved for backward while on ([`Instruments::start_saved_log`]).
    saved_log: Mutex<Option<Vec<SavedTensor>>>,
    /// How many times each model-level op has run in this forward, so the
    /// two ReLUs of a model are `relu1` and `relu2`.
    op_numbers: Mutex<HashMap<String, usize>>,
    /// Instrumentation the layers above attach: one slot per type, stored
    /// without knowing the types, so the engine depends on none of them.
    extensions: Mutex<HashMap<TypeId, Box<dyn Any + Send>>>,
}

impl Instruments {
    pub fn push_scope(&self, category: Category, op: &str) {
        lock(&self.scopes).push((category, Arc::from(op)));
    }

    pub fn pop_scope(&self) {
        lock(&self.scopes).pop();
    }

    /// The innermost scope (Untagged, "" outside any).
    pub fn current_scope(&self) -> (Category, Arc<str>) {
        lock(&self.scopes)
            .last()
            .cloned()
            .unwrap_or((Category::Untagged, Arc::from("")))
    }

    /// `name` numbered by its occurrences since `reset_op_numbers` ("relu1").
    pub fn numbered(&self, name: &str) -> String {
        let mut n = lock(&self.op_numbers);
        let k = n.entry(name.to_string()).or_default();
        *k += 1;
        format!("{name}{k}")
    }

    pub fn reset_op_numbers(&self) {
        lock(&self.op_numbers).clear();
    }

    pub fn note_layer_output(&self, layer: &Arc<str>, shape: &[usize]) {
        lock(&self.layer_outputs).push((layer.clone(), shape.to_vec()));
    }

    /// The noted layer outputs, emptying the list.
    pub fn take_layer_outputs(&self) -> Vec<(Arc<str>, Vec<usize>)> {
        std::mem::take(&mut *lock(&self.layer_outputs))
    }

    pub fn start_saved_log(&self) {
        *lock(&self.saved_log) = Some(Vec::new());
    }

    /// The saved tensors logged since `start_saved_log`, and stops logging.
    pub fn take_saved_log(&self) -> Vec<SavedTensor> {
        lock(&self.saved_log).take().unwrap_or_default()
    }

    /// Logs a saved tensor when the log is on; `t` is only built then.
    pub fn log_saved(&self, t: impl FnOnce() -> SavedTensor) {
        if let Some(log) = lock(&self.saved_log).as_mut() {
            log.push(t());
        }
    }

    /// Sets (or with `None` clears) the slot for `T`.
    pub fn set_extension<T: Any + Send>(&self, value: Option<T>) {
        let mut slots = lock(&self.extensions);
        match value {
            Some(v) => slots.insert(TypeId::of::<T>(), Box::new(v)),
            None => slots.remove(&TypeId::of::<T>()),
        };
    }

    /// Runs `f` on the slot for `T` (`None` when unset).
    pub fn with_extension<T: Any + Send, R>(&self, f: impl FnOnce(Option<&mut T>) -> R) -> R {
        let mut slots = lock(&self.extensions);
        f(slots
            .get_mut(&TypeId::of::<T>())
            .and_then(|b| b.downcast_mut::<T>()))
    }
}
