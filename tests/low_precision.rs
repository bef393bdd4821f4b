//! f16 and bf16 tensors and kernels against f64 references.
//!
//! Tolerances follow from the formats: a value stored in f16 carries a
//! relative rounding error of at most 2^-11 ≈ 4.9e-4 (unit roundoff, 10
//! mantissa bits), in bf16 at most 2^-8 ≈ 3.9e-3 (7 bits). Products read
//! their 16-bit operands exactly (the reference uses the same rounded
//! inputs) and accumulate in f32, so an output kept in f32 stays at the f32
//! tolerance 1e-4, and an output stored in 16 bits adds one rounding: 1e-3
//! (f16) and 4e-3 (bf16), measured against the largest output as
//! `max_rel_err` does.

use crate::common;
use common::*;
use vramlab::ops::cast::cast;
use vramlab::ops::matmul::{gemm, Gemm, MatView, MatmulKernel};
use vramlab::tensor::{DType, Engine, Tensor};

/// The 16-bit dtypes (every adapter runs both: f16 natively where it has
/// SHADER_F16, packed in words and computed in f32 elsewhere).
fn low_dtypes(_: &Engine) -> Vec<DType> {
    vec![DType::Bf16, DType::F16]
}

fn output_tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-4,
        DType::F16 => 1e-3,
        DType::Bf16 => 4e-3,
    }
}

#[test]
fn casts_round_like_the_half_crate_on_odd_lengths() {
    casts_round_like_the_half_crate(&engine());
}

/// f16 packed in words (no native f16): the same values to the bit, the same
/// products.
#[test]
fn packed_f16_is_the_same_f16() {
    let e = engine_without_native_f16();
    assert!(!e.has_shader_f16());
    casts_round_like_the_half_crate(&e);
    products_match_f64(&e);
}

fn casts_round_like_the_half_crate(e: &Engine) {
    let e = e.clone();
    let mut rng = Rng::new(21);
    // Odd length (a half-filled last word), values across the ranges,
    // overflow to ±inf in f16, NaN, and ties.
    let mut x = rng.vec(1001);
    x[0] = 70_000.0;
    x[1] = -1e-8;
    x[2] = f32::NAN;
    x[3] = 1.0 + 1.0 / 256.0; // a bf16 tie: rounds to even (1.0)
    x[4] = f32::INFINITY;
    let t = Tensor::from_slice(&e, &x, &[7, 11, 13], "x").unwrap();
    for d in low_dtypes(&e) {
        let low = cast(&t, d, "low").unwrap();
        assert_eq!(low.dtype(), d);
        assert_eq!(low.nbytes(), 2002);
        let got = low.to_vec().unwrap();
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            let want = d.round(v);
            assert!(
                g == want || (g.is_nan() && want.is_nan()),
                "{d} element {i}: {v} became {g}, want {want}"
            );
        }
        // And back: widening is exact.
        let back = cast(&low, DType::F32, "back").unwrap().to_vec().unwrap();
        for (&b, &g) in back.iter().zip(&got) {
            assert!(b == g || (b.is_nan() && g.is_nan()));
        }
    }
}

fn plain(m: usize, n: usize, k: usize) -> Gemm {
    Gemm {
        m,
        n,
        k,
        batch: 1,
        a: MatView::dense(0, m, k, false),
        b: MatView::dense(0, n, k, true),
        c_offset: 0,
        c_batch_stride: m * n,
        accumulate: false,
        reduce_batch: false,
        implicit_b: None,
    }
}

#[test]
fn products_in_each_dtype_match_f64() {
    products_match_f64(&engine());
}

fn products_match_f64(e: &Engine) {
    let e = e.clone();
    let mut rng = Rng::new(22);
    // Even n (bf16 outputs written a word per thread), odd n (through an f32
    // workspace), and a K long enough to split into partial sums.
    for d in low_dtypes(&e) {
        for &(m, n, k) in &[(33, 18, 65), (9, 17, 31), (7, 10, 9000)] {
            let a: Vec<f32> = rng.vec(m * k).iter().map(|&v| d.round(v)).collect();
            let b: Vec<f32> = rng.vec(n * k).iter().map(|&v| d.round(v)).collect();
            let ta = Tensor::from_f32_as(&e, &a, &[m, k], d, "a").unwrap();
            let tb = Tensor::from_f32_as(&e, &b, &[n, k], d, "b").unwrap();
            let want: Vec<f64> = (0..m * n)
                .map(|ij| {
                    let (i, j) = (ij / n, ij % n);
                    (0..k)
                        .map(|kk| a[i * k + kk] as f64 * b[j * k + kk] as f64)
                        .sum()
                })
                .collect();
            let g = plain(m, n, k);
            for out in [DType::F32, d] {
                let nan = vec![f32::NAN; m * n];
                let c = Tensor::from_f32_as(&e, &nan, &[m, n], out, "c").unwrap();
                gemm(&g, &ta, &tb, &c, MatmulKernel::Tiled).unwrap();
                let err = max_rel_err(&c.to_vec().unwrap(), &want);
                let tol = output_tolerance(out);
                assert!(err < tol, "{d}→{out} {m}x{n}·K{k}: {err} (tolerance {tol})");
            }
        }
    }
}
