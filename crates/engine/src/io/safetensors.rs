//! The safetensors format, read and written by hand (it is small): an 8-byte
//! little-endian header length, a JSON header mapping each name to
//! `{dtype, shape, data_offsets}` (plus an optional `__metadata__` map of
//! strings), then the raw little-endian data. PyTorch writes it with
//! `safetensors.torch.save_file(model.state_dict(), path)`, so weights come
//! in with PyTorch's names and layouts unchanged.
//!
//! Writing goes to a temporary file that is renamed into place, so a failed
//! or interrupted dump never leaves a truncated file where a good one was.

use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Element types this reader converts; the names are safetensors' own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StDtype {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
}

impl StDtype {
    fn parse(s: &str) -> Option<StDtype> {
        Some(match s {
            "F64" => StDtype::F64,
            "F32" => StDtype::F32,
            "F16" => StDtype::F16,
            "BF16" => StDtype::BF16,
            "I64" => StDtype::I64,
            "I32" => StDtype::I32,
            "I16" => StDtype::I16,
            "I8" => StDtype::I8,
            "U8" => StDtype::U8,
            "BOOL" => StDtype::Bool,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            StDtype::F64 => "F64",
            StDtype::F32 => "F32",
            StDtype::F16 => "F16",
            StDtype::BF16 => "BF16",
            StDtype::I64 => "I64",
            StDtype::I32 => "I32",
            StDtype::I16 => "I16",
            StDtype::I8 => "I8",
            StDtype::U8 => "U8",
            StDtype::Bool => "BOOL",
        }
    }

    pub fn size(self) -> usize {
        match self {
            StDtype::F64 | StDtype::I64 => 8,
            StDtype::F32 | StDtype::I32 => 4,
            StDtype::F16 | StDtype::BF16 | StDtype::I16 => 2,
            StDtype::I8 | StDtype::U8 | StDtype::Bool => 1,
        }
    }

    fn is_float(self) -> bool {
        matches!(
            self,
            StDtype::F64 | StDtype::F32 | StDtype::F16 | StDtype::BF16
        )
    }
}

/// What went wrong with a safetensors file, naming the file and the tensor.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid safetensors file: {message}")]
    Format { path: String, message: String },
    #[error("{path} has no tensor named {name:?}; it holds: {available}")]
    Missing {
        path: String,
        name: String,
        available: String,
    },
    #[error("tensor {name:?} in {path} is {dtype}, but {wanted} was expected")]
    WrongDtype {
        path: String,
        name: String,
        dtype: &'static str,
        wanted: &'static str,
    },
    #[error("tensor {name:?}: {len} values do not fill shape {shape:?}")]
    BadLength {
        name: String,
        len: usize,
        shape: Vec<usize>,
    },
}

/// One stored tensor: its type, shape and raw little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct StTensor {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl StTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A whole file in memory, tensors by name (sorted, as safetensors writes them).
#[derive(Debug, Clone, Default)]
pub struct SafeTensors {
    /// Where it came from, for error messages ("<memory>" if built here).
    pub origin: String,
    pub tensors: BTreeMap<String, StTensor>,
    pub metadata: BTreeMap<String, String>,
}

impl SafeTensors {
    pub fn new() -> SafeTensors {
        SafeTensors {
            origin: "<memory>".into(),
            ..Default::default()
        }
    }

    /// Reads and parses a file.
    pub fn read(path: &Path) -> Result<SafeTensors, SafetensorsError> {
        let bytes = std::fs::read(path).map_err(|source| SafetensorsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&bytes, &path.display().to_string())
    }

    /// Parses bytes; `origin` names them in errors.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<SafeTensors, SafetensorsError> {
        let bad = |message: String| SafetensorsError::Format {
            path: origin.to_string(),
            message,
        };
        if bytes.len() < 8 {
            return Err(bad(format!(
                "{} bytes is too short for the 8-byte header length",
                bytes.len()
            )));
        }
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8])) as usize;
        let data_start = 8usize
            .checked_add(header_len)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| {
                bad(format!(
                    "the header claims {header_len} bytes but the file has {}",
                    bytes.len()
                ))
            })?;
        let header: Json = serde_json::from_slice(&bytes[8..data_start])
            .map_err(|e| bad(format!("header is not JSON: {e}")))?;
        let Json::Object(entries) = header else {
            return Err(bad("header is not a JSON object".into()));
        };
        let data = &bytes[data_start..];
        let mut out = SafeTensors {
            origin: origin.to_string(),
            ..Default::default()
        };
        for (name, entry) in entries {
            if name == "__metadata__" {
                if let Json::Object(m) = entry {
                    for (k, v) in m {
                        out.metadata
                            .insert(k, v.as_str().unwrap_or_default().to_string());
                    }
                }
                continue;
            }
            let t = parse_entry(&name, &entry, data).map_err(|m| bad(format!("{name:?}: {m}")))?;
            out.tensors.insert(name, t);
        }
        Ok(out)
    }

    /// The tensor called `name`, or an error listing what the file holds.
    pub fn get(&self, name: &str) -> Result<&StTensor, SafetensorsError> {
        self.tensors
            .get(name)
            .ok_or_else(|| SafetensorsError::Missing {
                path: self.origin.clone(),
                name: name.to_string(),
                available: self.tensors.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }

    /// A floating-point tensor as f32 (F64, F16 and BF16 are converted).
    pub fn f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), SafetensorsError> {
        let t = self.get(name)?;
        if !t.dtype.is_float() {
            return Err(self.wrong(name, t.dtype, "a float type (F32, F16, BF16, F64)"));
        }
        let v = t
            .data
            .chunks_exact(t.dtype.size())
            .map(|c| match t.dtype {
                StDtype::F64 => f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32,
                StDtype::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
                StDtype::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f32(),
                _ => f32::from_le_bytes(c.try_into().unwrap_or([0; 4])),
            })
            .collect();
        Ok((v, t.shape.clone()))
    }

    /// An integer tensor as i64 (I32, I16, I8, U8 widen).
    pub fn i64(&self, name: &str) -> Result<(Vec<i64>, Vec<usize>), SafetensorsError> {
        let t = self.get(name)?;
        let v = match t.dtype {
            StDtype::I64 => t
                .data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            StDtype::I32 => t
                .data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
                .collect(),
            StDtype::I16 => t
                .data
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            StDtype::I8 => t.data.iter().map(|&b| b as i8 as i64).collect(),
            StDtype::U8 => t.data.iter().map(|&b| b as i64).collect(),
            d => return Err(self.wrong(name, d, "an integer type (I64, I32, I16, I8, U8)")),
        };
        Ok((v, t.shape.clone()))
    }

    fn wrong(&self, name: &str, dtype: StDtype, wanted: &'static str) -> SafetensorsError {
        SafetensorsError::WrongDtype {
            path: self.origin.clone(),
            name: name.to_string(),
            dtype: dtype.name(),
            wanted,
        }
    }

    /// Adds (or replaces) an f32 tensor.
    pub fn insert_f32(
        &mut self,
        name: &str,
        shape: &[usize],
        values: &[f32],
    ) -> Result<(), SafetensorsError> {
        self.insert_raw(name, StDtype::F32, shape, values.len(), |out| {
            values.iter().for_each(|v| out.extend(v.to_le_bytes()))
        })
    }

    /// Adds (or replaces) an i64 tensor.
    pub fn insert_i64(
        &mut self,
        name: &str,
        shape: &[usize],
        values: &[i64],
    ) -> Result<(), SafetensorsError> {
        self.insert_raw(name, StDtype::I64, shape, values.len(), |out| {
            values.iter().for_each(|v| out.extend(v.to_le_bytes()))
        })
    }

    fn insert_raw(
        &mut self,
        name: &str,
        dtype: StDtype,
        shape: &[usize],
        len: usize,
        fill: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), SafetensorsError> {
        if shape.iter().product::<usize>() != len {
            return Err(SafetensorsError::BadLength {
                name: name.to_string(),
                len,
                shape: shape.to_vec(),
            });
        }
        let mut data = Vec::with_capacity(len * dtype.size());
        fill(&mut data);
        self.tensors.insert(
            name.to_string(),
            StTensor {
                dtype,
                shape: shape.to_vec(),
                data,
            },
        );
        Ok(())
    }

    /// The file's bytes: header padded with spaces to a multiple of 8, then
    /// the tensors in name order.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut header = Map::new();
        if !self.metadata.is_empty() {
            let m: Map<String, Json> = self
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), Json::String(v.clone())))
                .collect();
            header.insert("__metadata__".into(), Json::Object(m));
        }
        let mut offset = 0usize;
        for (name, t) in &self.tensors {
            let end = offset + t.data.len();
            header.insert(
                name.clone(),
                serde_json::json!({
                    "dtype": t.dtype.name(),
                    "shape": t.shape,
                    "data_offsets": [offset, end],
                }),
            );
            offset = end;
        }
        let mut h = Json::Object(header).to_string().into_bytes();
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        let mut out = Vec::with_capacity(8 + h.len() + offset);
        out.extend((h.len() as u64).to_le_bytes());
        out.extend(h);
        for t in self.tensors.values() {
            out.extend(&t.data);
        }
        out
    }

    /// Writes the file atomically (temporary file, then rename).
    pub fn write(&self, path: &Path) -> Result<(), SafetensorsError> {
        let err = |source| SafetensorsError::Write {
            path: path.to_path_buf(),
            source,
        };
        super::write_atomic(path, &self.to_bytes()).map_err(err)
    }
}

fn parse_entry(name: &str, entry: &Json, data: &[u8]) -> Result<StTensor, String> {
    let dtype_name = entry
        .get("dtype")
        .and_then(Json::as_str)
        .ok_or("missing \"dtype\"")?;
    let dtype = StDtype::parse(dtype_name).ok_or_else(|| format!("unknown dtype {dtype_name}"))?;
    let shape: Vec<usize> = entry
        .get("shape")
        .and_then(Json::as_array)
        .ok_or("missing \"shape\"")?
        .iter()
        .map(|d| {
            d.as_u64()
                .map(|d| d as usize)
                .ok_or("shape entries must be integers")
        })
        .collect::<Result<_, _>>()?;
    let offsets = entry
        .get("data_offsets")
        .and_then(Json::as_array)
        .filter(|a| a.len() == 2)
        .ok_or("missing \"data_offsets\" [begin, end]")?;
    let begin = offsets[0].as_u64().ok_or("bad data_offsets")? as usize;
    let end = offsets[1].as_u64().ok_or("bad data_offsets")? as usize;
    if begin > end || end > data.len() {
        return Err(format!(
            "data_offsets [{begin}, {end}] fall outside the {} data bytes",
            data.len()
        ));
    }
    // Checked: a shape whose element count overflows must not wrap around
    // to a size that matches the data.
    let bytes = shape
        .iter()
        .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            format!("shape {shape:?} of tensor {name} has more elements than any file can hold")
        })?;
    if bytes != end - begin {
        return Err(format!(
            "shape {shape:?} of {} needs {bytes} bytes but data_offsets give {} (tensor {name})",
            dtype.name(),
            end - begin
        ));
    }
    Ok(StTensor {
        dtype,
        shape,
        data: data[begin..end].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_names_shapes_and_values() {
        let mut s = SafeTensors::new();
        s.insert_f32("fc.weight", &[2, 3], &[1.0, -2.0, 3.5, 0.0, 1e-8, 7.0])
            .unwrap();
        s.insert_i64("y", &[3], &[0, 9, -1]).unwrap();
        s.metadata.insert("format".into(), "pt".into());
        let back = SafeTensors::parse(&s.to_bytes(), "t").unwrap();
        assert_eq!(back.f32("fc.weight").unwrap().1, vec![2, 3]);
        assert_eq!(back.f32("fc.weight").unwrap().0[4], 1e-8);
        assert_eq!(back.i64("y").unwrap().0, vec![0, 9, -1]);
        assert_eq!(back.metadata["format"], "pt");
        assert_eq!((s.to_bytes().len() - 8) % 8, 0);
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = SafeTensors::parse(b"abc", "x.safetensors").unwrap_err();
        assert!(e.to_string().contains("too short"), "{e}");
        let mut s = SafeTensors::new();
        s.insert_i64("y", &[1], &[3]).unwrap();
        let e = s.f32("y").unwrap_err().to_string();
        assert!(e.contains("I64") && e.contains("float"), "{e}");
        let e = s.f32("x").unwrap_err().to_string();
        assert!(e.contains("\"x\"") && e.contains("y"), "{e}");
        assert!(s.insert_f32("z", &[2, 2], &[1.0]).is_err());
        let mut bytes = s.to_bytes();
        bytes.truncate(bytes.len() - 1);
        let e = SafeTensors::parse(&bytes, "cut").unwrap_err().to_string();
        assert!(e.contains("outside"), "{e}");
    }
}
