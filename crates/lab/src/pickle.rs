//! A small unpickler: enough of Python's pickle (protocols 2–5) to read the
//! memory snapshots `torch.cuda.memory._dump_snapshot()` writes — dicts,
//! lists, tuples, sets, strings, bytes, ints, floats, booleans and None,
//! with the memo. Anything else (class instances, globals) is an error that
//! names the opcode and its byte offset, rather than code execution as in
//! Python.
//!
//! Shared references: Python memoizes a list or dict as soon as it is
//! created, *empty*, and fills it afterwards, and a later BINGET must see it
//! filled (PyTorch's snapshots share every frame this way). So a container
//! stays open while it is filled and completes when it is put into another
//! (or returned): the memo then holds the finished, reference-counted value,
//! and a shared object is one node however often it is referenced. Lists of
//! shared objects are also shared by content (PyTorch writes each trace
//! entry's frames as a new list of shared frames), and a [`DictHook`] may
//! turn each dict into something smaller as it completes — so a snapshot is
//! read as a stream, in memory that follows what it holds, not its size.
//!
//! Hostile input costs bounded work: every declared length is checked
//! against the bytes left before anything is allocated, each opcode adds at
//! most one object, nesting is limited to [`MAX_DEPTH`], and a structure
//! that contains itself is an error.

use crate::error::LabError;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufRead, Read};
use std::rc::Rc;

/// Deepest nesting of containers accepted.
pub const MAX_DEPTH: usize = 1000;

#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(Rc<[PyValue]>),
    Tuple(Rc<[PyValue]>),
    Dict(Rc<[(PyValue, PyValue)]>),
}

impl PyValue {
    pub fn str(s: &str) -> PyValue {
        PyValue::Str(s.into())
    }

    pub fn list(items: Vec<PyValue>) -> PyValue {
        PyValue::List(items.into())
    }

    pub fn dict(items: Vec<(PyValue, PyValue)>) -> PyValue {
        PyValue::Dict(items.into())
    }

    /// `d[key]` for a dict with string keys.
    pub fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            PyValue::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, PyValue::Str(s) if &**s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_list(&self) -> Option<&[PyValue]> {
        match self {
            PyValue::List(v) | PyValue::Tuple(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_dict(&self) -> Option<&[(PyValue, PyValue)]> {
        match self {
            PyValue::Dict(d) => Some(d),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            PyValue::Int(i) => Some(*i),
            PyValue::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            PyValue::Float(f) => Some(*f),
            PyValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            PyValue::Bool(b) => Some(*b),
            PyValue::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
}

/// What the parser does with each dict as it completes: the default keeps
/// it; a reader of one format can turn it into something smaller (the
/// snapshot reader keeps a trace entry as a compact record and returns its
/// index), so a file of millions of entries never holds them as dicts.
pub trait DictHook {
    fn dict(&mut self, pairs: Vec<(PyValue, PyValue)>) -> PyValue {
        PyValue::Dict(pairs.into())
    }
}

/// Keeps every dict as a dict.
pub struct KeepDicts;

impl DictHook for KeepDicts {}

/// A container still being filled: memoized empty, then appended to.
#[derive(Default)]
struct Slot {
    kind: Kind,
    /// Items; a dict's keys and values alternate.
    items: Vec<PyValue>,
    /// Deepest nesting below and including this container.
    depth: u16,
    /// Memo keys that refer to it (updated when it completes).
    memo_keys: Vec<u64>,
    /// Stack entries that refer to it.
    refs: u32,
    /// Set once it completed (was put into another container).
    frozen: Option<PyValue>,
}

#[derive(Default, Clone, Copy, PartialEq)]
enum Kind {
    #[default]
    List,
    Dict,
}

enum Item {
    Mark,
    /// A complete value and its nesting depth.
    Val(PyValue, u16),
    /// A container still open for appends (index into the slots).
    Open(u32),
}

/// A memo entry: a complete value, or a container still open.
enum Memo {
    Val(PyValue),
    Open(u32),
}

struct Reader<R> {
    inner: R,
    pos: usize,
    total: usize,
    scratch: Vec<u8>,
}

impl<R: BufRead> Reader<R> {
    fn left(&self) -> u64 {
        self.total.saturating_sub(self.pos) as u64
    }

    /// The next `n` bytes; refused before allocating when the file does not
    /// hold them.
    fn take(&mut self, n: u64) -> Result<&[u8], LabError> {
        let left = self.left();
        if n > left {
            return Err(LabError::PickleTruncated {
                at: self.pos,
                declared: n,
                left,
            });
        }
        let n = n as usize;
        self.scratch.clear();
        if let Ok(buf) = self.inner.fill_buf() {
            if buf.len() >= n {
                self.scratch.extend_from_slice(&buf[..n]);
                self.inner.consume(n);
                self.pos += n;
                return Ok(&self.scratch);
            }
        }
        self.scratch.resize(n, 0);
        if self.inner.read_exact(&mut self.scratch).is_err() {
            return Err(LabError::PickleTruncated {
                at: self.pos,
                declared: n as u64,
                left: 0,
            });
        }
        self.pos += n;
        Ok(&self.scratch)
    }

    fn u8(&mut self) -> Result<u8, LabError> {
        if self.pos < self.total {
            if let Ok(buf) = self.inner.fill_buf() {
                if let Some(&b) = buf.first() {
                    self.inner.consume(1);
                    self.pos += 1;
                    return Ok(b);
                }
            }
        }
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: u64) -> Result<u64, LabError> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    /// A text line (protocol 0 opcodes), without its newline.
    fn line(&mut self) -> Result<&str, LabError> {
        let start = self.pos;
        self.scratch.clear();
        let limit = self.left();
        let n = (&mut self.inner)
            .take(limit)
            .read_until(b'\n', &mut self.scratch)
            .map_err(|_| malformed(start, "a text argument without its newline"))?;
        self.pos += n;
        if self.scratch.last() != Some(&b'\n') {
            return Err(malformed(start, "a text argument without its newline"));
        }
        self.scratch.pop();
        std::str::from_utf8(&self.scratch)
            .map_err(|_| malformed(start, "a text argument that is not UTF-8"))
    }
}

struct Parser<'h> {
    stack: Vec<Item>,
    /// Memo entries by key; keys are dense (MEMOIZE numbers them in order).
    memo: Vec<Option<Memo>>,
    /// Nesting depth of each memo entry's value.
    memo_depth: Vec<u16>,
    /// Keys far past the dense range (only from hand-made BINPUTs).
    sparse: HashMap<u64, (Memo, u16)>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Lists of shared objects, by the identity of their items: PyTorch
    /// writes each trace entry's frames as a new list of shared frame
    /// dicts, so identical stacks become one list here.
    lists: HashMap<u64, Vec<Rc<[PyValue]>>, BuildHasherDefault<Prehashed>>,
    hook: &'h mut dyn DictHook,
}

/// A hasher for keys that are hashes already.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Lists up to this long are shared by content when all their items are.
const HASH_CONS_MAX: usize = 1024;

/// The identity of a shared item (a string or container), or `None`.
fn identity(v: &PyValue) -> Option<usize> {
    match v {
        PyValue::Str(s) => Some(Rc::as_ptr(s) as *const u8 as usize),
        PyValue::List(l) | PyValue::Tuple(l) => Some(Rc::as_ptr(l) as *const PyValue as usize | 1),
        PyValue::Dict(d) => Some(Rc::as_ptr(d) as *const (PyValue, PyValue) as usize | 2),
        _ => None,
    }
}

impl Parser<'_> {
    fn open(&mut self, kind: Kind, items: Vec<PyValue>, depth: u16) {
        let slot = Slot {
            kind,
            items,
            depth,
            refs: 1,
            ..Slot::default()
        };
        let i = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.stack.push(Item::Open(i));
    }

    fn leaf(&mut self, v: PyValue) {
        self.stack.push(Item::Val(v, 0));
    }

    fn pop_item(&mut self, at: usize) -> Result<Item, LabError> {
        match self.stack.pop() {
            Some(Item::Mark) => Err(malformed(at, "a MARK where a value was expected")),
            Some(item) => Ok(item),
            None => Err(malformed(at, "stack underflow")),
        }
    }

    /// Pops a value to be put somewhere: an open container completes here.
    fn pop(&mut self, at: usize) -> Result<(PyValue, u16), LabError> {
        let item = self.pop_item(at)?;
        self.take_value(item)
    }

    /// Where the top MARK is on the stack.
    fn mark(&self, at: usize) -> Result<usize, LabError> {
        self.stack
            .iter()
            .rposition(|i| matches!(i, Item::Mark))
            .ok_or(malformed(at, "MARK not found"))
    }

    fn pop_mark(&mut self, at: usize) -> Result<Vec<(PyValue, u16)>, LabError> {
        let from = self.mark(at)?;
        let items: Vec<Item> = self.stack.drain(from..).skip(1).collect();
        items.into_iter().map(|i| self.take_value(i)).collect()
    }

    /// Drops a stack entry (POP, POP_MARK): an open container stays only
    /// while the memo or the stack can still reach it.
    fn discard(&mut self, item: Item) {
        if let Item::Open(s) = item {
            let slot = &mut self.slots[s as usize];
            slot.refs -= 1;
            if slot.refs == 0 && (slot.frozen.is_some() || slot.memo_keys.is_empty()) {
                self.slots[s as usize] = Slot::default();
                self.free_slots.push(s);
            }
        }
    }

    fn take_value(&mut self, item: Item) -> Result<(PyValue, u16), LabError> {
        match item {
            Item::Mark => unreachable!("marks are never values"),
            Item::Val(v, d) => Ok((v, d)),
            Item::Open(s) => {
                let su = s as usize;
                if self.slots[su].frozen.is_none() {
                    self.freeze(s)?;
                }
                let slot = &mut self.slots[su];
                let v = slot.frozen.clone().expect("frozen above");
                let d = slot.depth;
                slot.refs -= 1;
                if slot.refs == 0 {
                    self.slots[su] = Slot::default();
                    self.free_slots.push(s);
                }
                Ok((v, d))
            }
        }
    }

    /// Completes an open container: from now on the memo holds its value.
    fn freeze(&mut self, s: u32) -> Result<(), LabError> {
        let slot = &mut self.slots[s as usize];
        let items = std::mem::take(&mut slot.items);
        let keys = std::mem::take(&mut slot.memo_keys);
        let depth = slot.depth;
        let v = match slot.kind {
            Kind::List => self.list(items),
            Kind::Dict => {
                let mut pairs = Vec::with_capacity(items.len() / 2);
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                self.hook.dict(pairs)
            }
        };
        for k in keys {
            self.set_memo(k, Memo::Val(v.clone()), depth);
        }
        self.slots[s as usize].frozen = Some(v);
        Ok(())
    }

    fn list(&mut self, items: Vec<PyValue>) -> PyValue {
        if items.is_empty() || items.len() > HASH_CONS_MAX {
            return PyValue::List(items.into());
        }
        let mut h = items.len() as u64;
        for v in &items {
            let Some(id) = identity(v) else {
                return PyValue::List(items.into());
            };
            let p = ((h ^ id as u64) as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            h = (p as u64) ^ ((p >> 64) as u64);
        }
        let same = |l: &Rc<[PyValue]>| {
            l.len() == items.len()
                && l.iter()
                    .zip(&items)
                    .all(|(a, b)| identity(a) == identity(b))
        };
        let bucket = self.lists.entry(h).or_default();
        if let Some(l) = bucket.iter().find(|l| same(l)) {
            return PyValue::List(l.clone());
        }
        let l: Rc<[PyValue]> = items.into();
        bucket.push(l.clone());
        PyValue::List(l)
    }

    fn set_memo(&mut self, key: u64, m: Memo, depth: u16) {
        let k = key as usize;
        if k < self.memo.len() {
            self.memo[k] = Some(m);
            self.memo_depth[k] = depth;
        } else if k == self.memo.len() {
            self.memo.push(Some(m));
            self.memo_depth.push(depth);
        } else if k < self.memo.len() + 4096 {
            self.memo.resize_with(k + 1, || None);
            self.memo_depth.resize(k + 1, 0);
            self.memo[k] = Some(m);
            self.memo_depth[k] = depth;
        } else {
            self.sparse.insert(key, (m, depth));
        }
    }

    /// The open container at stack position `pos`, to append to (its slot
    /// index): an error if it is a complete value, not of `kind`, or
    /// already completed.
    fn open_slot(&self, pos: Option<usize>, at: usize, kind: Kind) -> Result<usize, LabError> {
        let s = match pos.map(|p| &self.stack[p]) {
            Some(Item::Open(s)) => *s as usize,
            Some(Item::Val(..)) => {
                return Err(malformed(
                    at,
                    "appending to a value that is already complete",
                ))
            }
            _ => return Err(malformed(at, "no object on the stack")),
        };
        let slot = &self.slots[s];
        if slot.frozen.is_some() {
            // Only a container that is (inside) its own item completes
            // before its appends are done.
            return Err(LabError::PickleCycle);
        }
        if slot.kind != kind {
            return Err(malformed(
                at,
                if kind == Kind::List {
                    "APPEND to something that is not a list"
                } else {
                    "SETITEM on something that is not a dict"
                },
            ));
        }
        Ok(s)
    }

    fn push_into(slot: &mut Slot, (v, d): (PyValue, u16)) -> Result<(), LabError> {
        let d = d.saturating_add(1);
        if d as usize > MAX_DEPTH {
            return Err(LabError::PickleTooDeep { max: MAX_DEPTH });
        }
        slot.depth = slot.depth.max(d);
        slot.items.push(v);
        Ok(())
    }

    fn append(&mut self, at: usize, kind: Kind, item: (PyValue, u16)) -> Result<(), LabError> {
        let s = self.open_slot(self.stack.len().checked_sub(1), at, kind)?;
        Self::push_into(&mut self.slots[s], item)
    }

    /// APPENDS, SETITEMS, ADDITEMS: the items above the top MARK go into the
    /// container below it, straight from the stack.
    fn append_marked(&mut self, at: usize, kind: Kind) -> Result<(), LabError> {
        let from = self.mark(at)?;
        let n = self.stack.len() - from - 1;
        if kind == Kind::Dict && n % 2 == 1 {
            return Err(malformed(at, "SETITEMS with an odd number of items"));
        }
        let s = self.open_slot(from.checked_sub(1), at, kind)?;
        let top = self.stack.len();
        for i in from + 1..top {
            let item = std::mem::replace(&mut self.stack[i], Item::Mark);
            let value = self.take_value(item)?;
            // An item that was the container itself has just completed it.
            if self.slots[s].frozen.is_some() {
                return Err(LabError::PickleCycle);
            }
            Self::push_into(&mut self.slots[s], value)?;
        }
        self.stack.truncate(from);
        Ok(())
    }

    /// Depth of a new container holding `items`.
    fn depth_of(items: &[(PyValue, u16)]) -> Result<u16, LabError> {
        let d = items.iter().map(|(_, d)| d + 1).max().unwrap_or(1);
        if d as usize > MAX_DEPTH {
            return Err(LabError::PickleTooDeep { max: MAX_DEPTH });
        }
        Ok(d)
    }
}

fn malformed(at: usize, problem: &'static str) -> LabError {
    LabError::PickleMalformed { at, problem }
}

fn bad_text(at: usize, what: &'static str, text: &str, expected: &'static str) -> LabError {
    LabError::PickleBadText {
        at,
        what,
        text: text.to_string(),
        expected,
    }
}

fn int_of_le(b: &[u8], at: usize) -> Result<i64, LabError> {
    let n = b.len();
    if n > 8 {
        return Err(LabError::PickleIntTooWide { at, bytes: n });
    }
    let mut v: i64 = 0;
    for (i, &x) in b.iter().enumerate() {
        v |= (x as i64) << (8 * i);
    }
    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
        v -= 1i64 << (8 * n);
    }
    Ok(v)
}

/// Parses one pickle held in memory.
pub fn unpickle(data: &[u8]) -> Result<PyValue, LabError> {
    unpickle_from(data, data.len(), &mut KeepDicts)
}

/// Parses one pickle of `len` bytes as it streams from `reader`, handing
/// each completed dict to `hook`. Memory follows what the pickle holds
/// (shared objects once, dicts as the hook keeps them), never the file's
/// size.
pub fn unpickle_from<R: BufRead>(
    reader: R,
    len: usize,
    hook: &mut dyn DictHook,
) -> Result<PyValue, LabError> {
    let mut r = Reader {
        inner: reader,
        pos: 0,
        total: len,
        scratch: Vec::new(),
    };
    let mut p = Parser {
        stack: Vec::new(),
        memo: Vec::new(),
        memo_depth: Vec::new(),
        sparse: HashMap::new(),
        slots: Vec::new(),
        free_slots: Vec::new(),
        lists: HashMap::default(),
        hook,
    };
    loop {
        let at = r.pos;
        let op = r
            .u8()
            .map_err(|_| malformed(at, "the pickle ends without STOP"))?;
        match op {
            0x80 => {
                let proto = r.u8()?;
                if proto > 5 {
                    return Err(LabError::PickleProtocol {
                        at,
                        protocol: proto,
                    });
                }
            }
            0x95 => {
                // FRAME: its length is a promise about the bytes that follow.
                let n = r.le(8)?;
                let left = r.left();
                if n > left {
                    return Err(LabError::PickleFrameTruncated {
                        at,
                        declared: n,
                        left,
                    });
                }
            }
            b'.' => {
                let (root, _) = p.pop(at)?;
                return Ok(root);
            }
            b'}' => p.open(Kind::Dict, Vec::new(), 1),
            b']' => p.open(Kind::List, Vec::new(), 1),
            b')' => p
                .stack
                .push(Item::Val(PyValue::Tuple(Vec::new().into()), 1)),
            // EMPTY_SET: read as a list (sets of plain values, rare here).
            0x8f => p.open(Kind::List, Vec::new(), 1),
            b'(' => p.stack.push(Item::Mark),
            b'0' => {
                let item = p.pop_item(at)?;
                p.discard(item);
            }
            b'1' => {
                let from = p.mark(at)?;
                let items: Vec<Item> = p.stack.drain(from..).skip(1).collect();
                for i in items {
                    p.discard(i);
                }
            }
            b'2' => {
                let dup = match p.stack.last() {
                    Some(Item::Val(v, d)) => Item::Val(v.clone(), *d),
                    Some(Item::Open(s)) => {
                        p.slots[*s as usize].refs += 1;
                        Item::Open(*s)
                    }
                    _ => return Err(malformed(at, "no object on the stack")),
                };
                p.stack.push(dup);
            }
            b'N' => p.leaf(PyValue::None),
            0x88 => p.leaf(PyValue::Bool(true)),
            0x89 => p.leaf(PyValue::Bool(false)),
            b'K' => {
                let v = r.u8()? as i64;
                p.leaf(PyValue::Int(v));
            }
            b'M' => {
                let v = r.le(2)? as i64;
                p.leaf(PyValue::Int(v));
            }
            b'J' => {
                let v = r.le(4)? as u32 as i32 as i64;
                p.leaf(PyValue::Int(v));
            }
            b'I' | b'L' => {
                let text = r.line()?.trim_end_matches('L');
                let v = match text {
                    "00" => PyValue::Bool(false),
                    "01" => PyValue::Bool(true),
                    t => PyValue::Int(
                        t.parse()
                            .map_err(|_| bad_text(at, "the argument", t, "a 64-bit integer"))?,
                    ),
                };
                p.leaf(v);
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a { r.u8()? as u64 } else { r.le(4)? };
                let b = r.take(n)?;
                let v = int_of_le(b, at)?;
                p.leaf(PyValue::Int(v));
            }
            b'G' => {
                let b = r.take(8)?;
                let v = f64::from_be_bytes(std::array::from_fn(|i| b[i]));
                p.leaf(PyValue::Float(v));
            }
            b'F' => {
                let t = r.line()?;
                let v = t
                    .parse()
                    .map_err(|_| bad_text(at, "the argument", t, "a float"))?;
                p.leaf(PyValue::Float(v));
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => r.u8()? as u64,
                    b'X' => r.le(4)?,
                    _ => r.le(8)?,
                };
                let s = String::from_utf8_lossy(r.take(n)?).into_owned();
                p.leaf(PyValue::Str(s.into()));
            }
            b'V' => {
                let s = r.line()?.to_string();
                p.leaf(PyValue::Str(s.into()));
            }
            b'C' | b'B' | 0x8e | 0x96 | b'U' | b'T' => {
                let n = match op {
                    b'C' | b'U' => r.u8()? as u64,
                    b'B' | b'T' => r.le(4)?,
                    _ => r.le(8)?,
                };
                let b: Rc<[u8]> = r.take(n)?.into();
                // SHORT_BINSTRING / BINSTRING (protocol ≤ 2 str): text.
                let v = if matches!(op, b'U' | b'T') {
                    PyValue::Str(String::from_utf8_lossy(&b).into_owned().into())
                } else {
                    PyValue::Bytes(b)
                };
                p.leaf(v);
            }
            b't' | 0x91 => {
                // TUPLE, FROZENSET: complete as made.
                let items = p.pop_mark(at)?;
                let d = Parser::depth_of(&items)?;
                let values: Vec<PyValue> = items.into_iter().map(|(v, _)| v).collect();
                let v = if op == b't' {
                    PyValue::Tuple(values.into())
                } else {
                    PyValue::List(values.into())
                };
                p.stack.push(Item::Val(v, d));
            }
            b'l' | b'd' => {
                // LIST, DICT (protocols 0–1): open, appended to afterwards.
                let items = p.pop_mark(at)?;
                if op == b'd' && items.len() % 2 == 1 {
                    return Err(malformed(at, "DICT with an odd number of items"));
                }
                let d = Parser::depth_of(&items)?;
                let values = items.into_iter().map(|(v, _)| v).collect();
                let kind = if op == b'l' { Kind::List } else { Kind::Dict };
                p.open(kind, values, d);
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(p.pop(at)?);
                }
                items.reverse();
                let d = Parser::depth_of(&items)?;
                let values: Vec<PyValue> = items.into_iter().map(|(v, _)| v).collect();
                p.stack.push(Item::Val(PyValue::Tuple(values.into()), d));
            }
            b'a' => {
                let item = p.pop(at)?;
                p.append(at, Kind::List, item)?;
            }
            b'e' | 0x90 => p.append_marked(at, Kind::List)?,
            b's' => {
                let v = p.pop(at)?;
                let k = p.pop(at)?;
                p.append(at, Kind::Dict, k)?;
                p.append(at, Kind::Dict, v)?;
            }
            b'u' => p.append_marked(at, Kind::Dict)?,
            0x94 | b'q' | b'r' | b'p' => {
                let key = match op {
                    0x94 => (p.memo.len() + p.sparse.len()) as u64,
                    b'q' => r.u8()? as u64,
                    b'r' => r.le(4)?,
                    _ => {
                        let t = r.line()?;
                        t.parse()
                            .map_err(|_| bad_text(at, "the PUT key", t, "a number"))?
                    }
                };
                // An open container is memoized as itself: filled later,
                // fetched filled.
                let (m, d) = match p.stack.last() {
                    Some(Item::Val(v, d)) => (Memo::Val(v.clone()), *d),
                    Some(Item::Open(s)) => {
                        let slot = &mut p.slots[*s as usize];
                        slot.memo_keys.push(key);
                        (Memo::Open(*s), slot.depth)
                    }
                    _ => return Err(malformed(at, "no object on the stack")),
                };
                p.set_memo(key, m, d);
            }
            b'h' | b'j' | b'g' => {
                let key = match op {
                    b'h' => r.u8()? as u64,
                    b'j' => r.le(4)?,
                    _ => {
                        let t = r.line()?;
                        t.parse()
                            .map_err(|_| bad_text(at, "the GET key", t, "a number"))?
                    }
                };
                let found = match p.memo.get(key as usize) {
                    Some(Some(m)) => Some((m, p.memo_depth[key as usize])),
                    _ => p.sparse.get(&key).map(|(m, d)| (m, *d)),
                };
                let item = match found {
                    Some((Memo::Val(v), d)) => Item::Val(v.clone(), d),
                    Some((Memo::Open(s), _)) => Item::Open(*s),
                    None => return Err(LabError::PickleMemoMissing { at, key }),
                };
                if let Item::Open(s) = item {
                    p.slots[s as usize].refs += 1;
                }
                p.stack.push(item);
            }
            other => return Err(LabError::PickleOpcode { at, opcode: other }),
        }
    }
}

/// Writes `v` as a protocol-4 pickle using only the opcodes PyTorch's
/// MemoryViz.js unpickler reads (no FRAME, LONG4, BINUNICODE8, GLOBAL or
/// REDUCE). An object reached twice through the same `Rc` (a frame shared
/// by many entries) is written once and fetched from the memo afterwards,
/// as Python's pickle does.
pub fn pickle(v: &PyValue) -> Vec<u8> {
    let mut w = Writer {
        out: vec![0x80, 4],
        memo: HashMap::new(),
    };
    w.value(v);
    w.out.push(b'.');
    w.out
}

struct Writer {
    out: Vec<u8>,
    /// Shared containers and strings by address → memo index.
    memo: HashMap<usize, u32>,
}

impl Writer {
    /// Writes BINGET for an object already written; else notes that the
    /// next object written is `key`'s and returns false.
    fn seen(&mut self, key: usize) -> bool {
        match self.memo.get(&key) {
            Some(&i) => {
                if i < 256 {
                    self.out.extend([b'h', i as u8]);
                } else {
                    self.out.push(b'j');
                    self.out.extend(i.to_le_bytes());
                }
                true
            }
            None => false,
        }
    }

    fn put(&mut self, key: usize) {
        let i = self.memo.len() as u32;
        self.memo.insert(key, i);
        if i < 256 {
            self.out.extend([b'q', i as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend(i.to_le_bytes());
        }
    }

    fn int(&mut self, i: i64) {
        if (0..256).contains(&i) {
            self.out.extend([b'K', i as u8]);
        } else if (0..65536).contains(&i) {
            self.out.push(b'M');
            self.out.extend((i as u16).to_le_bytes());
        } else if i32::try_from(i).is_ok() {
            self.out.push(b'J');
            self.out.extend((i as i32).to_le_bytes());
        } else {
            // LONG1: the shortest two's-complement little-endian form.
            let bytes = i.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let next_sign = bytes[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend([0x8a, n as u8]);
            self.out.extend(&bytes[..n]);
        }
    }

    fn value(&mut self, v: &PyValue) {
        match v {
            PyValue::None => self.out.push(b'N'),
            PyValue::Bool(true) => self.out.push(0x88),
            PyValue::Bool(false) => self.out.push(0x89),
            PyValue::Int(i) => self.int(*i),
            PyValue::Float(f) => {
                self.out.push(b'G');
                self.out.extend(f.to_be_bytes());
            }
            PyValue::Str(s) => {
                let key = Rc::as_ptr(s) as *const u8 as usize;
                if self.seen(key) {
                    return;
                }
                let b = s.as_bytes();
                if b.len() < 256 {
                    self.out.extend([0x8c, b.len() as u8]);
                } else {
                    self.out.push(b'X');
                    self.out.extend((b.len() as u32).to_le_bytes());
                }
                self.out.extend(b);
                self.put(key);
            }
            PyValue::Bytes(b) => {
                self.out.push(b'B');
                self.out.extend((b.len() as u32).to_le_bytes());
                self.out.extend(b.iter());
            }
            PyValue::List(items) | PyValue::Tuple(items) => {
                let key = items.as_ptr() as usize;
                if !items.is_empty() && self.seen(key) {
                    return;
                }
                let tuple = matches!(v, PyValue::Tuple(_));
                if tuple {
                    self.out.push(b'(');
                    for x in items.iter() {
                        self.value(x);
                    }
                    self.out.push(b't');
                } else {
                    self.out.push(b']');
                    if !items.is_empty() {
                        self.put(key);
                        self.out.push(b'(');
                        for x in items.iter() {
                            self.value(x);
                        }
                        self.out.push(b'e');
                    }
                }
            }
            PyValue::Dict(items) => {
                let key = items.as_ptr() as usize;
                if !items.is_empty() && self.seen(key) {
                    return;
                }
                self.out.push(b'}');
                if !items.is_empty() {
                    self.put(key);
                    self.out.push(b'(');
                    for (k, x) in items.iter() {
                        self.value(k);
                        self.value(x);
                    }
                    self.out.push(b'u');
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_python_writes() {
        // pickle.dumps({'a': [1, -2, 300, 70000, 2**40, -2**40], 'b': ('x', 1.5, None, True)}, protocol=4)
        let data: &[u8] = b"\x80\x04\x95B\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffM,\x01J\x70\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\x01\x8a\x06\x00\x00\x00\x00\x00\xffe\x8c\x01b\x94(\x8c\x01x\x94G?\xf8\x00\x00\x00\x00\x00\x00N\x88t\x94u.";
        let v = unpickle(data).unwrap();
        let a: Vec<i64> = v
            .get("a")
            .unwrap()
            .as_list()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        assert_eq!(a, vec![1, -2, 300, 70000, 1 << 40, -(1 << 40)]);
        let b = v.get("b").unwrap().as_list().unwrap();
        assert_eq!(b[0].as_str(), Some("x"));
        assert_eq!(b[1], PyValue::Float(1.5));
        assert_eq!(b[2], PyValue::None);
        assert_eq!(b[3], PyValue::Bool(true));
        assert!(unpickle(b"\x80\x04c").is_err());
    }
}
