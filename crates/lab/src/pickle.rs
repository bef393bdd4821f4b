//! A small unpickler: enough of Python's pickle (protocols 2–5) to read the
//! memory snapshots `torch.cuda.memory._dump_snapshot()` writes — dicts,
//! lists, tuples, sets, strings, bytes, ints, floats, booleans and None,
//! with the memo. Anything else (class instances, globals) is an error that
//! names the opcode and its byte offset, rather than code execution as in
//! Python.
//!
//! Shared references: Python memoizes a list or dict as soon as it is
//! created, *empty*, and fills it afterwards, and a later BINGET must see it
//! filled (PyTorch's snapshots share every frame this way). So the parser
//! builds objects in an arena, the memo holds arena indices, and the result
//! is a tree of reference-counted nodes in which a shared object is one node
//! (no copy per reference, so a hostile file cannot multiply its size).
//!
//! Hostile input costs bounded work: every declared length is checked
//! against the bytes left before anything is allocated, each opcode adds at
//! most one object, nesting is limited to [`MAX_DEPTH`], and a structure
//! that contains itself is an error.

use crate::error::LabError;
use std::collections::HashMap;
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

/// An object under construction.
enum Obj {
    Leaf(PyValue),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
}

enum Item {
    Mark,
    Obj(usize),
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: u64) -> Result<&[u8], LabError> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return Err(LabError::PickleTruncated {
                at: self.pos,
                declared: n,
                left,
            });
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, LabError> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: u64) -> Result<u64, LabError> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    /// A text line (protocol 0 opcodes), without its newline.
    fn line(&mut self) -> Result<&str, LabError> {
        let start = self.pos;
        let end = self.data[start..]
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(malformed(start, "a text argument without its newline"))?;
        self.pos = start + end + 1;
        std::str::from_utf8(&self.data[start..start + end])
            .map_err(|_| malformed(start, "a text argument that is not UTF-8"))
    }
}

struct Parser {
    arena: Vec<Obj>,
    stack: Vec<Item>,
    memo: HashMap<u64, usize>,
}

impl Parser {
    fn push(&mut self, o: Obj) {
        self.arena.push(o);
        self.stack.push(Item::Obj(self.arena.len() - 1));
    }

    fn leaf(&mut self, v: PyValue) {
        self.push(Obj::Leaf(v));
    }

    fn pop(&mut self, at: usize) -> Result<usize, LabError> {
        match self.stack.pop() {
            Some(Item::Obj(i)) => Ok(i),
            Some(Item::Mark) => Err(malformed(at, "a MARK where a value was expected")),
            None => Err(malformed(at, "stack underflow")),
        }
    }

    fn pop_mark(&mut self, at: usize) -> Result<Vec<usize>, LabError> {
        let mut items = Vec::new();
        loop {
            match self.stack.pop() {
                Some(Item::Mark) => break,
                Some(Item::Obj(i)) => items.push(i),
                None => return Err(malformed(at, "MARK not found")),
            }
        }
        items.reverse();
        Ok(items)
    }

    fn top(&mut self, at: usize) -> Result<usize, LabError> {
        match self.stack.last() {
            Some(Item::Obj(i)) => Ok(*i),
            _ => Err(malformed(at, "no object on the stack")),
        }
    }

    /// The arena object `root` as a tree; each object converted once.
    fn finish(&self, root: usize) -> Result<PyValue, LabError> {
        let mut done: Vec<Option<PyValue>> = vec![None; self.arena.len()];
        let mut busy = vec![false; self.arena.len()];
        self.convert(root, &mut done, &mut busy, 0)
    }

    fn convert(
        &self,
        i: usize,
        done: &mut Vec<Option<PyValue>>,
        busy: &mut Vec<bool>,
        depth: usize,
    ) -> Result<PyValue, LabError> {
        if let Some(v) = &done[i] {
            return Ok(v.clone());
        }
        if depth > MAX_DEPTH {
            return Err(LabError::PickleTooDeep { max: MAX_DEPTH });
        }
        if busy[i] {
            return Err(LabError::PickleCycle);
        }
        busy[i] = true;
        let mut items = |ids: &[usize]| -> Result<Vec<PyValue>, LabError> {
            ids.iter()
                .map(|&j| self.convert(j, done, busy, depth + 1))
                .collect()
        };
        let v = match &self.arena[i] {
            Obj::Leaf(v) => v.clone(),
            Obj::List(ids) => PyValue::List(items(ids)?.into()),
            Obj::Tuple(ids) => PyValue::Tuple(items(ids)?.into()),
            Obj::Dict(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                for &(k, v) in pairs {
                    out.push((
                        self.convert(k, done, busy, depth + 1)?,
                        self.convert(v, done, busy, depth + 1)?,
                    ));
                }
                PyValue::Dict(out.into())
            }
        };
        busy[i] = false;
        done[i] = Some(v.clone());
        Ok(v)
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

/// Parses one pickle.
pub fn unpickle(data: &[u8]) -> Result<PyValue, LabError> {
    let mut r = Reader { data, pos: 0 };
    let mut p = Parser {
        arena: Vec::new(),
        stack: Vec::new(),
        memo: HashMap::new(),
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
                let left = (r.data.len() - r.pos) as u64;
                if n > left {
                    return Err(LabError::PickleFrameTruncated {
                        at,
                        declared: n,
                        left,
                    });
                }
            }
            b'.' => {
                let root = p.pop(at)?;
                return p.finish(root);
            }
            b'}' => p.push(Obj::Dict(Vec::new())),
            b']' => p.push(Obj::List(Vec::new())),
            b')' => p.push(Obj::Tuple(Vec::new())),
            // EMPTY_SET: read as a list (sets of plain values, rare here).
            0x8f => p.push(Obj::List(Vec::new())),
            b'(' => p.stack.push(Item::Mark),
            b'0' => {
                p.stack
                    .pop()
                    .ok_or(malformed(at, "POP on an empty stack"))?;
            }
            b'1' => {
                p.pop_mark(at)?;
            }
            b'2' => {
                let t = p.top(at)?;
                p.stack.push(Item::Obj(t));
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
            b't' => {
                let items = p.pop_mark(at)?;
                p.push(Obj::Tuple(items));
            }
            b'l' => {
                let items = p.pop_mark(at)?;
                p.push(Obj::List(items));
            }
            b'd' => {
                let items = p.pop_mark(at)?;
                if items.len() % 2 == 1 {
                    return Err(malformed(at, "DICT with an odd number of items"));
                }
                p.push(Obj::Dict(items.chunks(2).map(|c| (c[0], c[1])).collect()));
            }
            0x91 => {
                // FROZENSET
                let items = p.pop_mark(at)?;
                p.push(Obj::List(items));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(p.pop(at)?);
                }
                items.reverse();
                p.push(Obj::Tuple(items));
            }
            b'a' | b'e' | 0x90 => {
                let items = if op == b'a' {
                    vec![p.pop(at)?]
                } else {
                    p.pop_mark(at)?
                };
                let target = p.top(at)?;
                match &mut p.arena[target] {
                    Obj::List(l) => l.extend(items),
                    _ => return Err(malformed(at, "APPEND to something that is not a list")),
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = p.pop(at)?;
                    let k = p.pop(at)?;
                    vec![k, v]
                } else {
                    p.pop_mark(at)?
                };
                if items.len() % 2 == 1 {
                    return Err(malformed(at, "SETITEMS with an odd number of items"));
                }
                let target = p.top(at)?;
                match &mut p.arena[target] {
                    Obj::Dict(d) => d.extend(items.chunks(2).map(|c| (c[0], c[1]))),
                    _ => return Err(malformed(at, "SETITEM on something that is not a dict")),
                }
            }
            0x94 | b'q' | b'r' | b'p' => {
                let key = match op {
                    0x94 => p.memo.len() as u64,
                    b'q' => r.u8()? as u64,
                    b'r' => r.le(4)?,
                    _ => {
                        let t = r.line()?;
                        t.parse()
                            .map_err(|_| bad_text(at, "the PUT key", t, "a number"))?
                    }
                };
                // The memo holds the object itself: filled later, seen filled.
                let top = p.top(at)?;
                p.memo.insert(key, top);
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
                let i = *p
                    .memo
                    .get(&key)
                    .ok_or(LabError::PickleMemoMissing { at, key })?;
                p.stack.push(Item::Obj(i));
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
