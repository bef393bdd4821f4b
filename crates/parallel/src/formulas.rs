//! Closed forms the per-rank programs are checked against.

use crate::layout::{Precision, Recompute};

/// Model states per data-parallel rank by the ZeRO paper (Rajbhandari et
/// al. 2020, figure 1): with Ψ parameters on N ranks, 16-bit parameters and
/// gradients (2 bytes each) and K bytes of optimizer state a parameter,
/// stage 0: (2 + 2 + K)Ψ; 1: (2 + 2)Ψ + KΨ/N; 2: 2Ψ + (2 + K)Ψ/N;
/// 3: (2 + 2 + K)Ψ/N. `precision` sets the 2s and K (fp32: 4, 4, 8).
pub fn zero_model_states(psi: u64, n: u64, stage: u8, precision: Precision) -> f64 {
    let (p, g, k) = (
        precision.param_bytes() as f64,
        precision.param_bytes() as f64,
        precision.k() as f64,
    );
    let (psi, n) = (psi as f64, n as f64);
    match stage {
        0 => (p + g + k) * psi,
        1 => (p + g) * psi + k * psi / n,
        2 => p * psi + (g + k) * psi / n,
        _ => (p + g + k) * psi / n,
    }
}

/// Activation bytes one transformer layer saves for backward, Korthikanti
/// et al. 2022 ("Reducing Activation Recomputation in Large Transformer
/// Models"), table 2, for 16-bit activations and 1-byte dropout masks:
/// sequence `s`, micro-batch `b`, hidden `h`, `a` heads, tensor parallel
/// `t`, sequence parallel `sp`:
/// - none: sbh(34 + 5as/h)
/// - tensor parallel: sbh(10 + 24/t + 5as/(ht))
/// - tensor + sequence parallel: sbh(34/t + 5as/(ht))
/// - selective recomputation drops the 5as/(ht) term;
/// - full recomputation keeps sbh·2 (the layer's input; over t with sp).
pub fn korthikanti_layer(s: u64, b: u64, h: u64, a: u64, t: u64, sp: bool, r: Recompute) -> f64 {
    let (s, b, h, a, t) = (s as f64, b as f64, h as f64, a as f64, t as f64);
    let sbh = s * b * h;
    let core = 5.0 * a * s / (h * t);
    match (r, sp) {
        (Recompute::Full, false) => sbh * 2.0,
        (Recompute::Full, true) => sbh * 2.0 / t,
        (Recompute::Selective, false) => sbh * (10.0 + 24.0 / t),
        (Recompute::Selective, true) => sbh * 34.0 / t,
        (Recompute::None, false) => sbh * (10.0 + 24.0 / t + core),
        (Recompute::None, true) => sbh * (34.0 / t + core),
    }
}

/// As [`korthikanti_layer`] with fused attention (FlashAttention): no
/// 5as/(ht) term whatever the recomputation, and 4·a·s·b/t bytes of fp32
/// log-sum-exp where the layer's tensors are saved (not under full
/// recomputation).
pub fn flash_layer(s: u64, b: u64, h: u64, a: u64, t: u64, sp: bool, r: Recompute) -> f64 {
    let kept = if r == Recompute::Full {
        r
    } else {
        Recompute::Selective
    };
    let lse = if r == Recompute::Full {
        0.0
    } else {
        4.0 * (a * s * b) as f64 / t as f64
    };
    korthikanti_layer(s, b, h, a, t, sp, kept) + lse
}

/// Micro-batches whose activations pipeline stage `stage` of `p` holds at
/// once with `m` micro-batches: all of them under GPipe, at most p − stage
/// under 1F1B (Narayanan et al. 2021).
pub fn in_flight(stage: u64, p: u64, m: u64, gpipe: bool) -> u64 {
    if gpipe {
        m
    } else {
        (p - stage).min(m)
    }
}

/// Bytes of one layer's dropout-only terms among [`korthikanti_layer`]'s
/// (or [`flash_layer`]'s) for layout `l` of a model of `hidden` features
/// and `heads` heads: the two s·b·h one-byte masks, and with the scores
/// stored the a·s²·b mask and 16-bit dropout output. A model without
/// dropout saves the formula less these.
pub fn dropout_layer(l: &crate::layout::Layout, hidden: u64, heads: u64) -> f64 {
    let (s, b, h, a, t) = (
        l.seq as f64,
        l.micro_batch as f64,
        hidden as f64,
        heads as f64,
        l.tp as f64,
    );
    if l.recompute == Recompute::Full {
        return 0.0;
    }
    let masks = 2.0 * s * b * h / if l.sp { t } else { 1.0 };
    let core = if l.recompute == Recompute::None && !l.flash_attention {
        3.0 * a * s * s * b / t
    } else {
        0.0
    };
    masks + core
}
