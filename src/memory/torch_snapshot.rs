//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()`) as
//! workloads: the `device_traces` history — `alloc` (address, requested
//! size), `free_requested` / `free_completed`, `segment_alloc` /
//! `segment_free` — becomes an allocation trace, and the segment events the
//! snapshot recorded are kept to compare with what the replay does.
//!
//! Each allocation's Python frames (recorded with
//! `_record_memory_history(stacks="python")` or `"all"`) say what some blocks
//! hold: a block made in a `torch.optim` optimizer's `_init_group` is
//! optimizer state, one made while a module is built or moved
//! (`torch/nn/modules` `__init__`, `reset_parameters`, `_apply`) is a
//! parameter. Those categories are the lifetime hints the `vramlab` strategy
//! places by; every other block stays untagged.

use super::caching::round_size;
use super::config::AllocatorConfig;
use super::pickle::{unpickle, PyValue};
use super::tag::Category;
use super::workload::{Op, Workload};
use std::collections::{BTreeMap, HashMap};

pub struct TorchSnapshot {
    pub device: usize,
    pub workload: Workload,
    /// Sizes of the segments PyTorch obtained (`segment_alloc`), in order.
    pub segment_allocs: Vec<u64>,
    pub segment_frees: Vec<u64>,
    /// Peak of allocated bytes implied by the history (requests rounded as
    /// PyTorch rounds them, default settings).
    pub peak_allocated: u64,
    /// Allocations whose frames gave a category, per category.
    pub categories_from_frames: BTreeMap<Category, usize>,
}

/// What an allocation holds, judged from its frames (innermost first, each
/// `{"filename", "line", "name"}`); `Untagged` when they do not say.
pub fn category_from_frames(frames: Option<&PyValue>) -> Category {
    let Some(frames) = frames.and_then(PyValue::as_list) else {
        return Category::Untagged;
    };
    for f in frames {
        let file = f
            .get("filename")
            .and_then(PyValue::as_str)
            .unwrap_or("")
            .replace('\\', "/");
        let name = f.get("name").and_then(PyValue::as_str).unwrap_or("");
        if file.contains("torch/optim/") && name == "_init_group" {
            return Category::OptimizerState;
        }
        if file.contains("torch/nn/modules/")
            && matches!(name, "__init__" | "reset_parameters" | "_apply")
        {
            return Category::Parameter;
        }
    }
    Category::Untagged
}

/// Whether `bytes` look like a pickle (protocol 2+ starts with 0x80).
pub fn is_pickle(bytes: &[u8]) -> bool {
    bytes.first() == Some(&0x80)
}

pub fn read(bytes: &[u8], name: &str) -> Result<TorchSnapshot, String> {
    let root = unpickle(bytes).map_err(|e| format!("{name}: not a readable pickle: {e}"))?;
    let traces = root
        .get("device_traces")
        .and_then(PyValue::as_list)
        .ok_or_else(|| {
            format!("{name}: no device_traces; is it a torch.cuda.memory._dump_snapshot() pickle?")
        })?;
    let (device, trace) = traces
        .iter()
        .enumerate()
        .filter_map(|(d, t)| t.as_list().map(|t| (d, t)))
        .max_by_key(|(_, t)| t.len())
        .filter(|(_, t)| !t.is_empty())
        .ok_or_else(|| {
            format!("{name}: the snapshot has no allocation history; call torch.cuda.memory._record_memory_history() before the code you snapshot")
        })?;
    let action = |e: &PyValue| {
        e.get("action")
            .and_then(PyValue::as_str)
            .unwrap_or("")
            .to_string()
    };
    let has_completed = trace.iter().any(|e| action(e) == "free_completed");
    let free_action = if has_completed {
        "free_completed"
    } else {
        "free_requested"
    };
    let mut ids: HashMap<i64, u64> = HashMap::new();
    let (mut ops, mut seg_a, mut seg_f) = (Vec::new(), Vec::new(), Vec::new());
    let (mut live, mut peak, mut next) = (0u64, 0u64, 0u64);
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    let mut categories = BTreeMap::new();
    let config = AllocatorConfig::default();
    for (i, e) in trace.iter().enumerate() {
        let act = action(e);
        let addr = e.get("addr").and_then(PyValue::as_i64).unwrap_or(0);
        let size = e.get("size").and_then(PyValue::as_i64).unwrap_or(0).max(0) as u64;
        match act.as_str() {
            "alloc" => {
                next += 1;
                ids.insert(addr, next);
                let category = category_from_frames(e.get("frames"));
                if category != Category::Untagged {
                    *categories.entry(category).or_insert(0) += 1;
                }
                ops.push(Op::Alloc {
                    id: next,
                    size,
                    category,
                });
                let r = round_size(size.max(1), &config);
                sizes.insert(next, r);
                live += r;
                peak = peak.max(live);
            }
            a if a == free_action => {
                let id = ids.remove(&addr).ok_or_else(|| {
                    format!(
                        "{name}: trace entry {i} frees address 0x{addr:x}, which is not allocated"
                    )
                })?;
                live -= sizes.remove(&id).unwrap_or(0);
                ops.push(Op::Free { id });
            }
            "segment_alloc" => seg_a.push(size),
            "segment_free" => seg_f.push(size),
            _ => {}
        }
    }
    Ok(TorchSnapshot {
        device,
        workload: Workload {
            name: name.to_string(),
            ops,
        },
        segment_allocs: seg_a,
        segment_frees: seg_f,
        peak_allocated: peak,
        categories_from_frames: categories,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(filename: &str, name: &str) -> PyValue {
        let s = |x: &str| PyValue::Str(x.into());
        PyValue::Dict(vec![
            (s("filename"), s(filename)),
            (s("line"), PyValue::Int(1)),
            (s("name"), s(name)),
        ])
    }

    fn category(frames: &[(&str, &str)]) -> Category {
        let list = PyValue::List(frames.iter().map(|(f, n)| frame(f, n)).collect());
        category_from_frames(Some(&list))
    }

    #[test]
    fn frames_tell_parameters_and_optimizer_state_apart_from_the_rest() {
        let torch = "/opt/conda/lib/python3.11/site-packages/torch";
        let adam = format!("{torch}/optim/adam.py");
        let module = format!("{torch}/nn/modules/module.py");
        let linear = format!("{torch}/nn/modules/linear.py");
        assert_eq!(
            category(&[
                ("??", "c10::cuda::CUDACachingAllocator::malloc"),
                (&adam, "_init_group"),
                (&adam, "step"),
                ("train.py", "<module>"),
            ]),
            Category::OptimizerState
        );
        // Adam's step itself makes temporaries (foreach): not state.
        assert_eq!(
            category(&[(&adam, "_multi_tensor_adam"), (&adam, "step")]),
            Category::Untagged
        );
        assert_eq!(
            category(&[(&module, "convert"), (&module, "_apply")]),
            Category::Parameter
        );
        assert_eq!(
            category(&[(&linear, "__init__"), ("model.py", "__init__")]),
            Category::Parameter
        );
        assert_eq!(
            category(&[(
                r"C:\py\Lib\site-packages\torch\optim\adamw.py",
                "_init_group"
            )]),
            Category::OptimizerState
        );
        // A forward's output: module code, but not building the module.
        assert_eq!(
            category(&[(&linear, "forward"), (&module, "_call_impl")]),
            Category::Untagged
        );
        assert_eq!(category(&[]), Category::Untagged);
        assert_eq!(category_from_frames(None), Category::Untagged);
    }
}
