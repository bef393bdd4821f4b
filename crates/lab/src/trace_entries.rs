//! A snapshot's `device_traces` entries kept compact while the pickle
//! streams: each entry dict becomes a 24-byte record as soon as it is
//! complete (its action, address, size, the free bytes of an `oom`, and what
//! its frames and `user_metadata` say: a category and an origin), and the
//! trace list holds the record's index. A snapshot of millions of entries
//! with deep frames is then held in memory proportional to its entries, not
//! to its text (the frames, a list per entry, are read once per distinct
//! stack).

use super::peak::Origin;
use super::pickle::{DictHook, PyValue};
use crate::memory::tag::Category;
use crate::strategies::IdMap;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A `size` field as the file wrote it (checked where it is used, so the
/// error can say which entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeField {
    Absent,
    Int(i64),
    NotInt,
}

/// One trace entry, in 24 bytes.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Index into the action names ([`Entries::action_name`]).
    action: u8,
    /// From `user_metadata` (a `vramlab_torch` recording), else `None`.
    pub named: Option<Category>,
    /// From the frames (`Untagged` when they do not say).
    pub from_frames: Category,
    /// Which of the trace's CUDA streams (in order of first appearance;
    /// past 255 they share the last).
    pub stream: u8,
    /// Index into [`Entries::origin`]; 0 when the entry says nothing.
    origin: u32,
    /// `addr`; for an `oom` (which has none), `device_free`.
    value: u64,
    /// `size`, with two values no byte count takes for absent and
    /// not-an-integer.
    size: i64,
}

const SIZE_ABSENT: i64 = i64::MIN;
const SIZE_NOT_INT: i64 = i64::MIN + 1;
/// `value` of an entry whose `addr` is absent, negative or not an integer
/// (an address is a non-negative i64, so never this).
const ADDR_MISSING: u64 = u64::MAX;

impl Entry {
    pub fn size(&self) -> SizeField {
        match self.size {
            SIZE_ABSENT => SizeField::Absent,
            SIZE_NOT_INT => SizeField::NotInt,
            n => SizeField::Int(n),
        }
    }

    /// `addr` (0 for an `oom`); `None` where the entry has none that is a
    /// non-negative integer.
    pub fn addr(&self, entries: &Entries) -> Option<u64> {
        if entries.action_name(self) == "oom" {
            Some(0)
        } else {
            (self.value != ADDR_MISSING).then_some(self.value)
        }
    }

    /// An `oom` entry's `device_free` (0 for any other).
    pub fn device_free(&self, entries: &Entries) -> u64 {
        if entries.action_name(self) == "oom" {
            self.value
        } else {
            0
        }
    }
}

/// What a `user_metadata` text says: a category, a module and an op.
type Said = (Option<Category>, Option<Arc<str>>, Option<Arc<str>>);

/// Items of a trace list that are records carry this offset (a value no
/// real trace list holds), so a stray integer is never taken for one.
const INDEX_BASE: i64 = i64::MIN;

/// The records of every trace entry read so far, and the parser hook that
/// makes them.
pub struct Entries {
    records: Vec<Entry>,
    actions: Vec<Arc<str>>,
    /// Stream ids, in order of first appearance.
    streams: Vec<i64>,
    action_ids: HashMap<Arc<str>, u8>,
    origins: Vec<Origin>,
    origin_ids: HashMap<Origin, u32>,
    strings: HashSet<Arc<str>>,
    /// Category and user frame of each distinct frames list, by identity
    /// (the list is held here, so its address is never reused).
    frames: IdMap<usize, (PyValue, Category, Option<Arc<str>>)>,
    /// What each distinct `user_metadata` text says.
    metadata: HashMap<Arc<str>, Said>,
}

impl Default for Entries {
    fn default() -> Self {
        Entries {
            records: Vec::new(),
            actions: Vec::new(),
            streams: Vec::new(),
            action_ids: HashMap::new(),
            origins: vec![Origin::default()],
            origin_ids: HashMap::new(),
            strings: HashSet::new(),
            frames: IdMap::default(),
            metadata: HashMap::new(),
        }
    }
}

impl Entries {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn action_name(&self, e: &Entry) -> &str {
        &self.actions[e.action as usize]
    }

    pub fn origin(&self, e: &Entry) -> &Origin {
        &self.origins[e.origin as usize]
    }

    /// The record a trace list item stands for: its index, or (an entry the
    /// hook did not see, such as one in a tree built by hand) a record made
    /// now.
    pub fn resolve(&mut self, item: &PyValue) -> Entry {
        if let PyValue::Int(i) = item {
            let k = i.wrapping_sub(INDEX_BASE);
            if (0..self.records.len() as i64).contains(&k) {
                return self.records[k as usize];
            }
        }
        let empty = [];
        self.record(item.as_dict().unwrap_or(&empty))
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(k) = self.strings.get(s) {
            return k.clone();
        }
        let k: Arc<str> = Arc::from(s);
        self.strings.insert(k.clone());
        k
    }

    fn record(&mut self, pairs: &[(PyValue, PyValue)]) -> Entry {
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| matches!(k, PyValue::Str(s) if &**s == key))
                .map(|(_, v)| v)
        };
        let name = get("action").and_then(PyValue::as_str).unwrap_or("");
        let action = match self.action_ids.get(name) {
            Some(&i) => i,
            // Past 255 distinct actions (none real), the rest share "?".
            None if self.actions.len() >= u8::MAX as usize => self.action_id("?"),
            None => self.action_id(name),
        };
        let int = |key: &str| {
            (get(key).and_then(PyValue::as_i64).unwrap_or(0).max(0) as u64)
                .min(crate::memory::constants::MAX_BYTES)
        };
        let size = match get("size") {
            None => SIZE_ABSENT,
            Some(v) => match v.as_i64() {
                // Both sentinels are negative: refused as negative sizes.
                Some(n) if n == SIZE_ABSENT || n == SIZE_NOT_INT => -1,
                Some(n) => n,
                None => SIZE_NOT_INT,
            },
        };
        let raw_stream = get("stream").and_then(PyValue::as_i64).unwrap_or(0);
        let stream = match self.streams.iter().position(|&x| x == raw_stream) {
            Some(k) => k as u8,
            None if self.streams.len() < u8::MAX as usize => {
                self.streams.push(raw_stream);
                (self.streams.len() - 1) as u8
            }
            None => u8::MAX,
        };
        let value = if name == "oom" {
            int("device_free")
        } else {
            // Bounded as segment addresses are (2^62), so the two agree.
            match get("addr").and_then(PyValue::as_i64) {
                Some(a) if a >= 0 => (a as u64).min(crate::memory::constants::MAX_BYTES),
                _ => ADDR_MISSING,
            }
        };
        let (named, module, op) = match get("user_metadata").and_then(PyValue::as_str) {
            Some(text) => self.metadata(text),
            None => (None, None, None),
        };
        let (from_frames, frame) = self.frames(get("frames"));
        let origin = Origin { module, frame, op };
        let origin = if origin == Origin::default() {
            0
        } else if let Some(&i) = self.origin_ids.get(&origin) {
            i
        } else {
            self.origins.push(origin.clone());
            let i = (self.origins.len() - 1) as u32;
            self.origin_ids.insert(origin, i);
            i
        };
        Entry {
            action,
            named,
            from_frames,
            stream,
            origin,
            value,
            size,
        }
    }

    fn action_id(&mut self, name: &str) -> u8 {
        if let Some(&i) = self.action_ids.get(name) {
            return i;
        }
        let name: Arc<str> = Arc::from(name);
        self.actions.push(name.clone());
        let i = (self.actions.len() - 1) as u8;
        self.action_ids.insert(name, i);
        i
    }

    fn metadata(&mut self, text: &str) -> Said {
        if let Some(m) = self.metadata.get(text) {
            return m.clone();
        }
        let m = super::frames::metadata_of_text(text);
        let (category, module) = (m.category, m.module.map(|s| self.intern(&s)));
        let op = m.op.map(|o| self.intern(&o));
        let key = self.intern(text);
        self.metadata
            .insert(key, (category, module.clone(), op.clone()));
        (category, module, op)
    }

    fn frames(&mut self, frames: Option<&PyValue>) -> (Category, Option<Arc<str>>) {
        let Some(f) = frames else {
            return (Category::Untagged, None);
        };
        let id = match f {
            PyValue::List(l) | PyValue::Tuple(l) => Some(l.as_ptr() as usize),
            _ => None,
        };
        if let Some((_, c, u)) = id.and_then(|id| self.frames.get(&id)) {
            return (*c, u.clone());
        }
        let category = super::frames::category_from_frames(Some(f));
        let user = super::frames::user_frame(Some(f)).map(|u| self.intern(&u));
        if let Some(id) = id {
            self.frames.insert(id, (f.clone(), category, user.clone()));
        }
        (category, user)
    }
}

impl DictHook for Entries {
    fn dict(&mut self, pairs: Vec<(PyValue, PyValue)>) -> PyValue {
        let is_entry = pairs
            .iter()
            .any(|(k, v)| matches!((k, v), (PyValue::Str(k), PyValue::Str(_)) if &**k == "action"));
        if !is_entry {
            return PyValue::Dict(pairs.into());
        }
        let e = self.record(&pairs);
        self.records.push(e);
        PyValue::Int(INDEX_BASE + (self.records.len() - 1) as i64)
    }
}
