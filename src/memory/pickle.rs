//! A small unpickler: enough of Python's pickle (protocols 2–5) to read the
//! memory snapshots `torch.cuda.memory._dump_snapshot()` writes — dicts,
//! lists, tuples, strings, bytes, ints, floats, booleans and None, with the
//! memo. Anything else (class instances, globals) is an error that names
//! the opcode, rather than code execution as in Python.

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    Dict(Vec<(PyValue, PyValue)>),
}

impl PyValue {
    /// `d[key]` for a dict with string keys.
    pub fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            PyValue::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, PyValue::Str(s) if s == key))
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

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            PyValue::Int(i) => Some(*i),
            PyValue::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

enum Item {
    Mark,
    Value(PyValue),
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64, String> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }
}

/// Parses one pickle.
pub fn unpickle(data: &[u8]) -> Result<PyValue, String> {
    let mut r = Reader { data, pos: 0 };
    let mut stack: Vec<Item> = Vec::new();
    let mut memo: HashMap<u64, PyValue> = HashMap::new();
    let pop = |stack: &mut Vec<Item>| -> Result<PyValue, String> {
        match stack.pop() {
            Some(Item::Value(v)) => Ok(v),
            _ => Err("stack underflow".into()),
        }
    };
    let pop_mark = |stack: &mut Vec<Item>| -> Result<Vec<PyValue>, String> {
        let mut items = Vec::new();
        loop {
            match stack.pop() {
                Some(Item::Mark) => break,
                Some(Item::Value(v)) => items.push(v),
                None => return Err("MARK not found".into()),
            }
        }
        items.reverse();
        Ok(items)
    };
    loop {
        let at = r.pos;
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?;
            }
            0x95 => {
                r.take(8)?;
            }
            b'.' => return pop(&mut stack),
            b'}' => stack.push(Item::Value(PyValue::Dict(Vec::new()))),
            b']' => stack.push(Item::Value(PyValue::List(Vec::new()))),
            b')' => stack.push(Item::Value(PyValue::Tuple(Vec::new()))),
            b'(' => stack.push(Item::Mark),
            b'N' => stack.push(Item::Value(PyValue::None)),
            0x88 => stack.push(Item::Value(PyValue::Bool(true))),
            0x89 => stack.push(Item::Value(PyValue::Bool(false))),
            b'K' => {
                let v = r.u8()? as i64;
                stack.push(Item::Value(PyValue::Int(v)));
            }
            b'M' => {
                let v = r.le(2)? as i64;
                stack.push(Item::Value(PyValue::Int(v)));
            }
            b'J' => {
                let v = r.le(4)? as u32 as i32 as i64;
                stack.push(Item::Value(PyValue::Int(v)));
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a { r.u8()? as usize } else { r.le(4)? as usize };
                let b = r.take(n)?;
                if n > 8 {
                    return Err(format!("integer of {n} bytes at byte {at} does not fit in 64 bits"));
                }
                let mut v: i64 = 0;
                for (i, &x) in b.iter().enumerate() {
                    v |= (x as i64) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v -= 1i64 << (8 * n);
                }
                stack.push(Item::Value(PyValue::Int(v)));
            }
            b'G' => {
                let b = r.take(8)?;
                let v = f64::from_be_bytes(b.try_into().map_err(|_| "bad float")?);
                stack.push(Item::Value(PyValue::Float(v)));
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => r.u8()? as usize,
                    b'X' => r.le(4)? as usize,
                    _ => r.le(8)? as usize,
                };
                let s = String::from_utf8_lossy(r.take(n)?).into_owned();
                stack.push(Item::Value(PyValue::Str(s)));
            }
            b'C' | b'B' | 0x8e => {
                let n = match op {
                    b'C' => r.u8()? as usize,
                    b'B' => r.le(4)? as usize,
                    _ => r.le(8)? as usize,
                };
                let b = r.take(n)?.to_vec();
                stack.push(Item::Value(PyValue::Bytes(b)));
            }
            b't' => {
                let items = pop_mark(&mut stack)?;
                stack.push(Item::Value(PyValue::Tuple(items)));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::new();
                for _ in 0..n {
                    items.push(pop(&mut stack)?);
                }
                items.reverse();
                stack.push(Item::Value(PyValue::Tuple(items)));
            }
            b'a' | b'e' => {
                let items = if op == b'a' {
                    vec![pop(&mut stack)?]
                } else {
                    pop_mark(&mut stack)?
                };
                match stack.last_mut() {
                    Some(Item::Value(PyValue::List(l))) => l.extend(items),
                    _ => return Err(format!("APPEND to a non-list at byte {at}")),
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = pop(&mut stack)?;
                    let k = pop(&mut stack)?;
                    vec![k, v]
                } else {
                    pop_mark(&mut stack)?
                };
                match stack.last_mut() {
                    Some(Item::Value(PyValue::Dict(d))) => {
                        let mut it = items.into_iter();
                        while let (Some(k), Some(v)) = (it.next(), it.next()) {
                            d.push((k, v));
                        }
                    }
                    _ => return Err(format!("SETITEM on a non-dict at byte {at}")),
                }
            }
            0x94 | b'q' | b'r' => {
                let key = match op {
                    0x94 => memo.len() as u64,
                    b'q' => r.u8()? as u64,
                    _ => r.le(4)?,
                };
                if let Some(Item::Value(v)) = stack.last() {
                    memo.insert(key, v.clone());
                }
            }
            b'h' | b'j' => {
                let key = if op == b'h' { r.u8()? as u64 } else { r.le(4)? };
                let v = memo
                    .get(&key)
                    .cloned()
                    .ok_or_else(|| format!("memo {key} missing at byte {at}"))?;
                stack.push(Item::Value(v));
            }
            other => {
                return Err(format!(
                    "unsupported pickle opcode 0x{other:02x} at byte {at} (only plain data is read: dicts, lists, tuples, strings, numbers)"
                ))
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
