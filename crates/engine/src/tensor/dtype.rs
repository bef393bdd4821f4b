//! Element types: f32, and the two 16-bit types of mixed precision. f16 is
//! IEEE half (WGSL `f16` where the adapter has SHADER_F16); bf16 is the top
//! half of an f32 (8 exponent bits, 7 mantissa bits), stored two per `u32`
//! word and computed in f32 in registers. Both take 2 bytes an element (the
//! articles' "BF16 is 2.5 bytes" is wrong).

use crate::device::compose::Elem;
use serde::Serialize;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// The kernel element type that stores this dtype.
    pub fn elem(self) -> Elem {
        match self {
            DType::F32 => Elem::F32,
            DType::F16 => Elem::F16,
            DType::Bf16 => Elem::Bf16,
        }
    }

    /// 2 bytes an element. Kernels writing such a tensor give each 32-bit
    /// word to one invocation (bf16 is packed two per word, and so is f16
    /// on adapters without native f16).
    pub fn is_16bit(self) -> bool {
        self.size_in_bytes() == 2
    }

    /// Parses `f32`, `f16`/`half`/`float16`, `bf16`/`bfloat16`.
    pub fn parse(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Some(DType::F32),
            "f16" | "half" | "float16" | "fp16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::Bf16),
            _ => None,
        }
    }

    /// Rounds `v` to this dtype (round to nearest even) and back: what a
    /// value becomes when stored in it.
    pub fn round(self, v: f32) -> f32 {
        match self {
            DType::F32 => v,
            DType::F16 => half::f16::from_f32(v).to_f32(),
            DType::Bf16 => half::bf16::from_f32(v).to_f32(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        })
    }
}
