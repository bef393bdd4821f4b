//! What a trace entry's Python frames and `user_metadata` say about an
//! allocation: the user's own frame (`dir/file.py:line function`), a
//! category where PyTorch's frames tell one (an optimizer's `_init_group`
//! makes optimizer state, a module's `__init__` / `reset_parameters` /
//! `_apply` makes parameters), and the category and module `vramlab_torch`
//! wrote. Shared by the snapshot reader and the segment map.

use crate::memory::tag::Category;
use crate::pickle::PyValue;

/// What `vramlab_torch` (or `torch.cuda.memory._set_memory_metadata`)
/// wrote as JSON into a trace entry's `user_metadata`: a category, the
/// module, and the op (the aten op, or vramlab's tensor label); each `None`
/// where the text does not say it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    pub category: Option<Category>,
    pub module: Option<String>,
    pub op: Option<String>,
}

/// The [`Metadata`] of a trace entry.
pub fn metadata_of(entry: &PyValue) -> Metadata {
    entry
        .get("user_metadata")
        .and_then(PyValue::as_str)
        .map(metadata_of_text)
        .unwrap_or_default()
}

/// [`metadata_of`] for the `user_metadata` text itself, parsed once.
pub fn metadata_of_text(text: &str) -> Metadata {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Metadata::default();
    };
    let text_of = |key: &str| {
        m.get(key)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .map(String::from)
    };
    Metadata {
        category: m
            .get("category")
            .and_then(|c| serde_json::from_value::<Category>(c.clone()).ok()),
        module: text_of("module"),
        op: text_of("op"),
    }
}

/// The innermost frame outside PyTorch and Python's own libraries, as
/// `dir/file.py:line function`.
pub fn user_frame(frames: Option<&PyValue>) -> Option<String> {
    frames.and_then(PyValue::as_list)?.iter().find_map(|f| {
        let file = f
            .get("filename")
            .and_then(PyValue::as_str)?
            .replace('\\', "/");
        let library = [
            "/torch/",
            "/site-packages/",
            "/lib/python",
            "/vramlab_torch/",
        ];
        let python = file.ends_with(".py") && !file.starts_with('<');
        let rooted = format!("/{file}");
        if !python || library.iter().any(|l| rooted.contains(l)) {
            return None;
        }
        let short: Vec<&str> = file.rsplit('/').take(2).collect();
        let short: Vec<&str> = short.into_iter().rev().collect();
        let line = f.get("line").and_then(PyValue::as_i64).unwrap_or(0);
        let name = f.get("name").and_then(PyValue::as_str).unwrap_or("?");
        Some(format!("{}:{line} {name}", short.join("/")))
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::tag::CATEGORIES;

    #[test]
    fn a_category_reads_and_writes_by_the_name_reports_print() {
        for c in CATEGORIES {
            let written = serde_json::to_value(c).unwrap();
            assert_eq!(written, c.name(), "{c:?}");
            let text = format!(r#"{{"category": {written}}}"#);
            assert_eq!(metadata_of_text(&text).category, Some(c));
        }
        // Recordings made before the rename still read.
        let old = metadata_of_text(r#"{"category": "cast_cache"}"#);
        assert_eq!(old.category, Some(Category::CastCache));
    }
}
