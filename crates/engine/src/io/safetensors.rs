//! The safetensors format, read and written with the `safetensors` crate:
//! an 8-byte little-endian header length, a JSON header mapping each name to
//! `{dtype, shape, data_offsets}` (plus an optional `__metadata__` map of
//! strings), then the raw little-endian data. PyTorch writes it with
//! `safetensors.torch.save_file(model.state_dict(), path)`, so weights come
//! in with PyTorch's names and layouts unchanged.
//!
//! The crate checks the header and the offsets; this module adds what it
//! does not do: errors that name the file and say which tensor is wrong and
//! how (the crate's own errors are terse), the element type a caller wants,
//! a missing name listed against what the file holds, and values that must
//! fill the shape they are stored under.
//!
//! Writing goes through [`super::write_atomic`] (a temporary file renamed
//! into place, devices and FIFOs written in place), so a failed or
//! interrupted dump never leaves a truncated file where a good one was.

use ::safetensors::tensor::{Dtype, SafeTensorError, TensorInfo, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The crate's limit on the JSON header (100 MB).
const MAX_HEADER: u64 = 100_000_000;

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
    /// The crate's type, or `None` for the ones vramlab does not read
    /// (unsigned 16-64 bit, FP8, FP4/FP6, complex).
    fn from_crate(d: Dtype) -> Option<StDtype> {
        Some(match d {
            Dtype::F64 => StDtype::F64,
            Dtype::F32 => StDtype::F32,
            Dtype::F16 => StDtype::F16,
            Dtype::BF16 => StDtype::BF16,
            Dtype::I64 => StDtype::I64,
            Dtype::I32 => StDtype::I32,
            Dtype::I16 => StDtype::I16,
            Dtype::I8 => StDtype::I8,
            Dtype::U8 => StDtype::U8,
            Dtype::BOOL => StDtype::Bool,
            _ => return None,
        })
    }

    fn to_crate(self) -> Dtype {
        match self {
            StDtype::F64 => Dtype::F64,
            StDtype::F32 => Dtype::F32,
            StDtype::F16 => Dtype::F16,
            StDtype::BF16 => Dtype::BF16,
            StDtype::I64 => Dtype::I64,
            StDtype::I32 => Dtype::I32,
            StDtype::I16 => Dtype::I16,
            StDtype::I8 => Dtype::I8,
            StDtype::U8 => Dtype::U8,
            StDtype::Bool => Dtype::BOOL,
        }
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

    pub fn is_float(self) -> bool {
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
    #[error("{path} is not a valid safetensors file: {problem}")]
    Format {
        path: String,
        problem: FormatProblem,
    },
    #[error("cannot lay out {path} as safetensors: {source}")]
    Encode {
        path: String,
        #[source]
        source: SafeTensorError,
    },
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

/// Why bytes are not a safetensors file: the crate's check that failed,
/// with the sizes, offsets and tensor it failed on.
#[derive(Debug, thiserror::Error)]
pub enum FormatProblem {
    #[error("{len} bytes is too short for the 8-byte header length")]
    TooShort { len: usize },
    #[error("the header claims {claimed} bytes, over safetensors' limit of 100000000")]
    HeaderTooLarge { claimed: u64 },
    /// What `torch.save` writes (a zip archive, or a bare pickle before
    /// PyTorch 1.6): recognised by its first bytes.
    #[error("it is a torch.save file ({0}), not safetensors; convert it in Python: safetensors.torch.save_file(torch.load(path), 'out.safetensors') (a state_dict, or a dict of tensors for --data)")]
    TorchSave(&'static str),
    #[error("the header claims {claimed} bytes but the file has {len}")]
    HeaderPastEnd { claimed: u64, len: usize },
    /// Not UTF-8, not JSON, or JSON that is not a map of tensor entries
    /// (a missing or unknown `dtype`, a negative shape, …).
    #[error("{0}")]
    Header(#[source] SafeTensorError),
    #[error(
        "tensor {name:?} has dtype {dtype}, which vramlab does not read \
         (it reads F64, F32, F16, BF16, I64, I32, I16, I8, U8 and BOOL)"
    )]
    UnsupportedDtype { name: String, dtype: Dtype },
    #[error("{name:?}: data_offsets [{begin}, {end}] fall outside the {data} data bytes")]
    OffsetsOutside {
        name: String,
        begin: usize,
        end: usize,
        data: usize,
    },
    #[error(
        "{name:?}: data_offsets [{begin}, {end}] must run forward from byte {expected}, \
         where the previous tensor's data ends (tensors fill the data in order, \
         without gaps or overlaps)"
    )]
    OffsetsOutOfOrder {
        name: String,
        begin: usize,
        end: usize,
        expected: usize,
    },
    #[error("shape {shape:?} of {dtype} needs {needs} bytes but data_offsets give {got} (tensor {name})")]
    SizeMismatch {
        name: String,
        dtype: Dtype,
        shape: Vec<usize>,
        needs: usize,
        got: usize,
    },
    #[error("shape {shape:?} of tensor {name} has more elements than any file can hold")]
    Overflow { name: String, shape: Vec<usize> },
    #[error(
        "the tensors' data ends at byte {end} of the {data} data bytes: \
         {} bytes belong to no tensor", .data - .end
    )]
    Uncovered { end: usize, data: usize },
    /// A failed check that the header does not let us pin on one tensor.
    #[error("{0}")]
    Other(#[source] SafeTensorError),
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

/// What the crate serialises: a stored tensor as its `View`.
struct Out<'a>(&'a StTensor);

impl View for Out<'_> {
    fn dtype(&self) -> Dtype {
        self.0.dtype.to_crate()
    }
    fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.0.data)
    }
    fn data_len(&self) -> usize {
        self.0.data.len()
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

    /// Reads and parses a file: a regular one whole (where the memory
    /// available holds it), a stream (a pipe, a device) as far as its own
    /// header says it goes, so `/dev/zero` is refused at once.
    pub fn read(path: &Path) -> Result<SafeTensors, SafetensorsError> {
        let read = |source| SafetensorsError::Read {
            path: path.to_path_buf(),
            source,
        };
        let (file, regular) = super::bounded::open(path).map_err(read)?;
        let bytes = if regular {
            super::bounded::read_regular(file).map_err(read)?
        } else {
            read_framed(file).map_err(read)?
        };
        Self::parse(&bytes, &path.display().to_string())
    }

    /// Parses bytes; `origin` names them in errors.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<SafeTensors, SafetensorsError> {
        let bad = |problem: FormatProblem| SafetensorsError::Format {
            path: origin.to_string(),
            problem,
        };
        let (header, data_len) = frame(bytes).map_err(bad)?;
        // The crate adds the data's end to the header length unchecked,
        // which overflows (a panic in a debug build) for offsets near 2^64:
        // offsets past the data are refused here first.
        let entries = entries(header);
        if let Some((name, info)) = entries.iter().find(|(_, i)| i.data_offsets.1 > data_len) {
            let (begin, end) = info.data_offsets;
            return Err(bad(FormatProblem::OffsetsOutside {
                name: name.clone(),
                begin,
                end,
                data: data_len,
            }));
        }
        let (n, meta) = ::safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| bad(explain(e, &entries, data_len)))?;
        let data = &bytes[8 + n..];
        let mut out = SafeTensors {
            origin: origin.to_string(),
            ..Default::default()
        };
        if let Some(m) = meta.metadata() {
            out.metadata
                .extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for (name, info) in meta.tensors() {
            let Some(dtype) = StDtype::from_crate(info.dtype) else {
                return Err(bad(FormatProblem::UnsupportedDtype {
                    name,
                    dtype: info.dtype,
                }));
            };
            let (begin, end) = info.data_offsets;
            let tensor = StTensor {
                dtype,
                shape: info.shape.clone(),
                data: data[begin..end].to_vec(),
            };
            out.tensors.insert(name, tensor);
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
        let (t, values) = self.floats(name)?;
        Ok((values.map(|v| v as f32).collect(), t.shape.clone()))
    }

    /// A floating-point tensor as f64: every stored value exactly.
    pub fn f64(&self, name: &str) -> Result<(Vec<f64>, Vec<usize>), SafetensorsError> {
        let (t, values) = self.floats(name)?;
        Ok((values.collect(), t.shape.clone()))
    }

    /// A floating-point tensor and its values, each exactly as an f64
    /// (so f32 of it is what a direct conversion gives).
    fn floats(
        &self,
        name: &str,
    ) -> Result<(&StTensor, impl Iterator<Item = f64> + '_), SafetensorsError> {
        let t = self.get(name)?;
        if !t.dtype.is_float() {
            return Err(self.wrong(name, t.dtype, "a float type (F32, F16, BF16, F64)"));
        }
        let values = t.data.chunks_exact(t.dtype.size()).map(|c| match t.dtype {
            StDtype::F64 => f64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
            StDtype::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            StDtype::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            _ => f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64,
        });
        Ok((t, values))
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
        if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) != Some(len) {
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

    /// The file's bytes, laid out by the crate: the header padded with
    /// spaces to a multiple of 8, then the tensors (widest type first, then
    /// by name). Fails only for a tensor whose bytes do not fill its shape
    /// (built by hand, not by `insert_*`) or a header over 100 MB.
    pub fn to_bytes(&self) -> Result<Vec<u8>, SafetensorsError> {
        let metadata = (!self.metadata.is_empty()).then(|| {
            self.metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>()
        });
        let views = self.tensors.iter().map(|(n, t)| (n.as_str(), Out(t)));
        ::safetensors::serialize(views, metadata).map_err(|source| SafetensorsError::Encode {
            path: self.origin.clone(),
            source,
        })
    }

    /// Writes the file atomically (temporary file, then rename).
    pub fn write(&self, path: &Path) -> Result<(), SafetensorsError> {
        let bytes = self.to_bytes().map_err(|e| match e {
            SafetensorsError::Encode { source, .. } => SafetensorsError::Encode {
                path: path.display().to_string(),
                source,
            },
            e => e,
        })?;
        super::write_atomic(path, &bytes).map_err(|source| SafetensorsError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// A stream's safetensors bytes: the length, the header it claims (at most
/// [`MAX_HEADER`]) and the data its entries reach, no further; what does
/// not parse is left for [`SafeTensors::parse`] to name.
fn read_framed(file: std::fs::File) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut reader = std::io::BufReader::new(file);
    let mut out = Vec::new();
    (&mut reader).take(8).read_to_end(&mut out)?;
    let Some(len) = out.first_chunk::<8>().map(|b| u64::from_le_bytes(*b)) else {
        return Ok(out);
    };
    if len > MAX_HEADER {
        return Ok(out);
    }
    (&mut reader).take(len).read_to_end(&mut out)?;
    let data = entries(&out[8..])
        .iter()
        .map(|(_, i)| i.data_offsets.1 as u64)
        .max()
        .unwrap_or(0);
    super::bounded::fits_memory(data, || {
        format!("its header places data up to byte {data} of a stream")
    })?;
    reader.take(data).read_to_end(&mut out)?;
    Ok(out)
}

/// The header's bytes and the length of the data after it, or why the
/// 8-byte length does not fit the file.
fn frame(bytes: &[u8]) -> Result<(&[u8], usize), FormatProblem> {
    let Some(len_bytes) = bytes.first_chunk::<8>() else {
        return Err(FormatProblem::TooShort { len: bytes.len() });
    };
    let claimed = u64::from_le_bytes(*len_bytes);
    if claimed > MAX_HEADER {
        // torch.save's formats read as a huge length (their later bytes
        // are not zeros), so only then are they looked for.
        if bytes.starts_with(b"PK\x03\x04") {
            return Err(FormatProblem::TorchSave("a zip archive"));
        }
        if bytes[0] == 0x80 && (2..=5).contains(&bytes[1]) {
            return Err(FormatProblem::TorchSave("a pickle"));
        }
        return Err(FormatProblem::HeaderTooLarge { claimed });
    }
    // At most 100 MB: fits a usize.
    let end = 8 + claimed as usize;
    match bytes.get(8..end) {
        Some(header) => Ok((header, bytes.len() - end)),
        None => Err(FormatProblem::HeaderPastEnd {
            claimed,
            len: bytes.len(),
        }),
    }
}

/// The header's tensor entries that parse as the crate's `TensorInfo`, in
/// data order (as the crate checks them); empty if the header is not JSON
/// (the crate then says why).
fn entries(header: &[u8]) -> Vec<(String, TensorInfo)> {
    let Ok(map) = serde_json::from_slice::<BTreeMap<String, serde_json::Value>>(header) else {
        return Vec::new();
    };
    let mut out: Vec<(String, TensorInfo)> = map
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .filter_map(|(name, v)| Some((name, serde_json::from_value::<TensorInfo>(v).ok()?)))
        .collect();
    out.sort_by_key(|(_, i)| i.data_offsets);
    out
}

/// The crate's error, pinned on the tensor and numbers it failed on.
fn explain(e: SafeTensorError, entries: &[(String, TensorInfo)], data: usize) -> FormatProblem {
    use SafeTensorError as E;
    match e {
        E::InvalidHeader(_) | E::InvalidHeaderDeserialization(_) | E::JsonError(_) => {
            FormatProblem::Header(e)
        }
        E::InvalidOffset(ref name) => {
            let mut expected = 0;
            for (n, info) in entries {
                if n == name {
                    let (begin, end) = info.data_offsets;
                    return FormatProblem::OffsetsOutOfOrder {
                        name: n.clone(),
                        begin,
                        end,
                        expected,
                    };
                }
                expected = info.data_offsets.1;
            }
            FormatProblem::Other(e)
        }
        E::TensorInvalidInfo | E::ValidationOverflow | E::MisalignedSlice => entries
            .iter()
            .find_map(|(name, info)| {
                let (begin, end) = info.data_offsets;
                let bits = info
                    .shape
                    .iter()
                    .try_fold(info.dtype.bitsize(), |a, &d| a.checked_mul(d));
                match bits {
                    None => Some(FormatProblem::Overflow {
                        name: name.clone(),
                        shape: info.shape.clone(),
                    }),
                    Some(bits) if bits % 8 != 0 || bits / 8 != end.wrapping_sub(begin) => {
                        Some(FormatProblem::SizeMismatch {
                            name: name.clone(),
                            dtype: info.dtype,
                            shape: info.shape.clone(),
                            needs: bits.div_ceil(8),
                            got: end.wrapping_sub(begin),
                        })
                    }
                    Some(_) => None,
                }
            })
            .unwrap_or(FormatProblem::Other(e)),
        E::MetadataIncompleteBuffer => {
            let end = entries.last().map_or(0, |(_, i)| i.data_offsets.1);
            if end <= data {
                FormatProblem::Uncovered { end, data }
            } else {
                FormatProblem::Other(e)
            }
        }
        e => FormatProblem::Other(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with one header and `data` bytes after it.
    fn file(header: &str, data: usize) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(std::iter::repeat_n(0u8, data));
        out
    }

    fn parse_err(bytes: &[u8]) -> String {
        SafeTensors::parse(bytes, "x.safetensors")
            .unwrap_err()
            .to_string()
    }

    /// torch.save's files are named as such, with the conversion (they
    /// read as a header of 578712552184433488 bytes).
    #[test]
    fn a_torch_save_file_is_named_with_its_fix() {
        let zip = b"PK\x03\x04\x14\x00\x08\x08\x00\x00archive/data.pkl";
        let pickle = b"\x80\x02}q\x00(X\x06\x00\x00\x00weight";
        for bytes in [&zip[..], &pickle[..]] {
            let e = parse_err(bytes);
            assert!(
                e.contains("torch.save file") && e.contains("save_file"),
                "{e}"
            );
        }
        // A safetensors header of 640 bytes starts 0x80 0x02 too.
        let e = parse_err(b"\x80\x02\x00\x00\x00\x00\x00\x00{}");
        assert!(!e.contains("torch.save"), "{e}");
    }

    #[test]
    fn round_trip_keeps_names_shapes_and_values() {
        let mut s = SafeTensors::new();
        s.insert_f32("fc.weight", &[2, 3], &[1.0, -2.0, 3.5, 0.0, 1e-8, 7.0])
            .unwrap();
        s.insert_i64("y", &[3], &[0, 9, -1]).unwrap();
        s.metadata.insert("format".into(), "pt".into());
        let bytes = s.to_bytes().unwrap();
        let back = SafeTensors::parse(&bytes, "t").unwrap();
        assert_eq!(back.f32("fc.weight").unwrap().1, vec![2, 3]);
        assert_eq!(back.f32("fc.weight").unwrap().0[4], 1e-8);
        assert_eq!(back.i64("y").unwrap().0, vec![0, 9, -1]);
        assert_eq!(back.metadata["format"], "pt");
        assert_eq!((bytes.len() - 8) % 8, 0);
    }

    /// A stream is read as far as its header says: a file written through
    /// a pipe loads, and /dev/zero (a header of length 0) is refused at
    /// once instead of read until the host runs out of memory.
    #[cfg(unix)]
    #[test]
    fn a_stream_is_read_as_far_as_its_header_says() {
        let mut s = SafeTensors::new();
        s.insert_f32("x", &[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        let bytes = s.to_bytes().unwrap();
        let dir = std::env::temp_dir().join(format!("vramlab-st-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("batch.safetensors");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // More bytes than the file after it: the reader stops at the data.
        let writer = {
            let (fifo, mut more) = (fifo.clone(), bytes.clone());
            more.extend([9u8; 4096]);
            std::thread::spawn(move || {
                use std::io::Write;
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&fifo)
                    .and_then(|mut f| f.write_all(&more));
            })
        };
        let back = SafeTensors::read(&fifo).unwrap();
        assert_eq!(back.f32("x").unwrap().0, vec![1.0, 2.0, 3.0, 4.0]);
        drop(writer);
        let e = SafeTensors::read(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid JSON in header"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = parse_err(b"abc");
        assert!(
            e.contains("x.safetensors") && e.contains("too short"),
            "{e}"
        );
        let mut s = SafeTensors::new();
        s.insert_i64("y", &[1], &[3]).unwrap();
        let e = s.f32("y").unwrap_err().to_string();
        assert!(e.contains("I64") && e.contains("float"), "{e}");
        let e = s.f32("x").unwrap_err().to_string();
        assert!(e.contains("\"x\"") && e.contains("y"), "{e}");
        assert!(s.insert_f32("z", &[2, 2], &[1.0]).is_err());
        assert!(s.insert_f32("z", &[usize::MAX, 2], &[1.0]).is_err());
        let mut bytes = s.to_bytes().unwrap();
        bytes.truncate(bytes.len() - 1);
        let e = parse_err(&bytes);
        assert!(e.contains("outside") && e.contains("\"y\""), "{e}");
    }

    #[test]
    fn header_and_offset_errors_carry_the_numbers() {
        let mut big = 200_000_000u64.to_le_bytes().to_vec();
        big.extend(b"{}");
        let e = parse_err(&big);
        assert!(e.contains("200000000") && e.contains("limit"), "{e}");
        let mut past = 50u64.to_le_bytes().to_vec();
        past.extend(b"{}");
        let e = parse_err(&past);
        assert!(e.contains("claims 50 bytes") && e.contains("10"), "{e}");
        let e = parse_err(&file("not json", 0));
        assert!(e.contains("JSON"), "{e}");
        let e = parse_err(&file(
            r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#,
            1,
        ));
        assert!(e.contains("Q4"), "{e}");
        let e = parse_err(&file(
            r#"{"w":{"dtype":"U16","shape":[1],"data_offsets":[0,2]}}"#,
            2,
        ));
        assert!(e.contains("U16") && e.contains("does not read"), "{e}");
        let e = parse_err(&file(
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        ));
        assert!(e.contains("needs 12 bytes") && e.contains("give 8"), "{e}");
        assert!(e.contains("tensor w"), "{e}");
        let e = parse_err(&file(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            8,
        ));
        assert!(e.contains("\"w\"") && e.contains("from byte 0"), "{e}");
        let e = parse_err(&file(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            12,
        ));
        assert!(e.contains("8 bytes belong to no tensor"), "{e}");
        let huge = format!(
            r#"{{"w":{{"dtype":"F32","shape":[{},4],"data_offsets":[0,4]}}}}"#,
            u64::MAX
        );
        let e = parse_err(&file(&huge, 4));
        assert!(e.contains("more elements"), "{e}");
    }

    /// Offsets that sum past 2^64: the crate would overflow adding them;
    /// they are refused first.
    #[test]
    fn offsets_near_the_top_of_usize_are_refused_not_overflowed() {
        let step = 1u64 << 61;
        let mut entries = Vec::new();
        for i in 0..8u64 {
            let (b, e) = (i * step, if i == 7 { u64::MAX - 4 } else { (i + 1) * step });
            entries.push(format!(
                r#""t{i}":{{"dtype":"U8","shape":[{}],"data_offsets":[{b},{e}]}}"#,
                e - b
            ));
        }
        let header = format!("{{{}}}", entries.join(","));
        let e = parse_err(&file(&header, 0));
        assert!(e.contains("outside"), "{e}");
    }

    #[test]
    fn a_hand_built_tensor_that_does_not_fill_its_shape_is_not_written() {
        let mut s = SafeTensors::new();
        s.tensors.insert(
            "w".into(),
            StTensor {
                dtype: StDtype::F32,
                shape: vec![2],
                data: vec![0; 4],
            },
        );
        let e = s.to_bytes().unwrap_err().to_string();
        assert!(e.contains("<memory>"), "{e}");
    }
}
