//! A PyTorch snapshot's integer fields as vramlab reads them: counts
//! clamped to 2^62 (the most vramlab models, so a sum of two never
//! overflows), and byte sizes for which a negative or larger value is a
//! corrupt file, named where.

use crate::error::LabError;
use crate::pickle::PyValue;
use crate::trace_entries::SizeField;

/// A non-negative integer field, at most 2^62 (the most vramlab models), so
/// a sum of two never overflows; totals are summed saturating.
pub(crate) fn int(v: &PyValue, key: &str) -> u64 {
    (v.get(key).and_then(PyValue::as_i64).unwrap_or(0).max(0) as u64)
        .min(crate::memory::constants::MAX_BYTES)
}

/// A byte count the snapshot states (`size`, `total_size`): absent is 0, but
/// negative or past 2^62 (the most vramlab models) is a corrupt file, and
/// the error names where (`at`), so no block is replayed at a made-up size.
pub(crate) fn size_field(
    raw: SizeField,
    key: &'static str,
    at: impl Fn() -> String,
) -> Result<u64, LabError> {
    let n = match raw {
        SizeField::Absent => return Ok(0),
        SizeField::NotInt => return Err(LabError::SizeNotInteger { at: at(), key }),
        SizeField::Int(n) => n,
    };
    if n < 0 {
        return Err(LabError::SizeNegative {
            at: at(),
            key,
            value: n,
        });
    }
    if n as u64 > crate::memory::constants::MAX_BYTES {
        return Err(LabError::SizeTooLarge {
            at: at(),
            key,
            value: n,
        });
    }
    Ok(n as u64)
}

/// [`size_field`] of a dict's `key`.
pub(crate) fn size_of(
    v: &PyValue,
    key: &'static str,
    at: impl Fn() -> String,
) -> Result<u64, LabError> {
    let raw = match v.get(key) {
        None => SizeField::Absent,
        Some(x) => x.as_i64().map_or(SizeField::NotInt, SizeField::Int),
    };
    size_field(raw, key, at)
}
