//! Every kernel against an f64 CPU reference on random inputs of awkward
//! sizes (1, 7, 33, 257, non-square), relative error under 1e-4.

use crate::common;
use common::*;
use vramlab::ops::{elementwise, fill, matmul, relu};
use vramlab::tensor::{DType, Tensor, TensorError};

const TOL: f64 = 1e-4;
const SIZES: &[usize] = &[1, 7, 33, 257, 1000, 65_537];

/// A tensor made in chunks (`Tensor::generated`, so that a large one never
/// has all its values on the host twice over) holds the same values, in
/// order, as one made whole, across chunk boundaries and in 16 bits.
#[test]
fn generated_tensors_are_the_values_made_whole() {
    use vramlab::tensor::{DType, GENERATE_CHUNK};
    let e = engine();
    for (n, dtype) in [
        (2 * GENERATE_CHUNK + 3, DType::F32),
        (GENERATE_CHUNK + 5, DType::F16),
    ] {
        let mut rng = vramlab::nn::init::Rng::new(5);
        let t = Tensor::generated(&e, &[n], dtype, "g", |m| rng.uniform(m, 1.0)).unwrap();
        let want = vramlab::nn::init::Rng::new(5).uniform(n, 1.0);
        let got = t.to_vec().unwrap();
        let round = |v: f32| match dtype {
            DType::F16 => half::f16::from_f32(v).to_f32(),
            _ => v,
        };
        let first_wrong = (0..n).find(|&i| got[i].to_bits() != round(want[i]).to_bits());
        assert_eq!(first_wrong, None, "{dtype:?} n = {n}");
    }
}

#[test]
fn upload_download_round_trip() {
    let e = engine();
    let mut rng = Rng::new(1);
    for &n in SIZES {
        let x = rng.vec(n);
        let t = Tensor::from_slice(&e, &x, &[n], "x").unwrap();
        assert_eq!(t.to_vec().unwrap(), x);
    }
    let h: Vec<half::f16> = (0..7)
        .map(|i| half::f16::from_f32(i as f32 * 0.5))
        .collect();
    let t = Tensor::from_f16(&e, &h, &[7], "h").unwrap();
    assert_eq!(
        t.to_vec().unwrap(),
        (0..7).map(|i| i as f32 * 0.5).collect::<Vec<_>>()
    );
}

/// Small reads share one mappable buffer: each must return what the
/// tensor holds now, not an earlier read's bytes, on both sides of the
/// buffer's 4,096 bytes and after a large read between them.
#[test]
fn reads_through_the_kept_buffer_return_the_latest_values() {
    let e = engine();
    let mut rng = Rng::new(7);
    for (round, &n) in [1, 3, 1024, 1025, 7, 1, 50_000, 2].iter().enumerate() {
        let x = rng.vec(n);
        let t = Tensor::from_slice(&e, &x, &[n], "x").unwrap();
        assert_eq!(t.to_vec().unwrap(), x, "round {round}, n = {n}");
        // Written on the device after the first read: a stale buffer
        // would return x again.
        fill::fill(&t, round as f32 + 0.25).unwrap();
        let got = t.to_vec().unwrap();
        assert!(
            got.iter().all(|&v| v == round as f32 + 0.25),
            "round {round}, n = {n}: {:?}",
            &got[..got.len().min(4)]
        );
    }
}

/// Tensors read together (one wait where they fit the kept buffer side by
/// side, one read each where not) return what each holds, whatever mix of
/// sizes and dtypes, odd 16-bit lengths included; one wait for small ones.
#[test]
fn tensors_read_together_return_each_ones_values() {
    let e = engine();
    let mut rng = Rng::new(11);
    let cases: [&[(usize, DType)]; 5] = [
        &[(1, DType::F32), (1, DType::F32)],
        &[(3, DType::F16), (5, DType::F32), (1, DType::Bf16)],
        &[(1000, DType::F32), (97, DType::F32)],
        &[(1, DType::F32), (2000, DType::F32)],
        &[(7, DType::F16)],
    ];
    for (round, case) in cases.iter().enumerate() {
        let tensors: Vec<Tensor> = case
            .iter()
            .map(|&(n, d)| {
                let t = Tensor::from_slice(&e, &rng.vec(n), &[n], "x").unwrap();
                vramlab::ops::cast::cast(&t, d, "x").unwrap()
            })
            .collect();
        // Each its own value (exact in every dtype), written after a read
        // of it: a stale or shifted read returns another.
        let value = |i: usize| (round * 10 + i) as f32 + 0.5;
        for (i, t) in tensors.iter().enumerate() {
            assert_eq!(t.to_vec().unwrap().len(), case[i].0);
            let src = fill::full(&e, &[case[i].0], value(i), "v").unwrap();
            vramlab::ops::cast::cast_into(&src, t).unwrap();
        }
        let before = e.gpu().unwrap().host_waits();
        let got = Tensor::read_together(&tensors.iter().collect::<Vec<_>>()).unwrap();
        let waits = e.gpu().unwrap().host_waits() - before;
        assert_eq!(got.len(), case.len());
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.len(), case[i].0, "round {round}, tensor {i}");
            assert!(
                g.iter().all(|&v| v == value(i)),
                "round {round}, tensor {i}: {g:?}"
            );
        }
        let bytes: usize = tensors.iter().map(|t| t.nbytes().div_ceil(4) * 4).sum();
        let expected = if bytes <= 4096 {
            1
        } else {
            tensors.len() as u64
        };
        assert_eq!(waits, expected, "round {round}: {bytes} bytes");
    }
}

#[test]
fn fill_writes_every_element() {
    let e = engine();
    for &n in SIZES {
        let t = fill::full(&e, &[n], -2.5, "f").unwrap();
        assert!(t.to_vec().unwrap().iter().all(|&v| v == -2.5), "n={n}");
    }
}

#[test]
fn add_mul_relu_match_f64() {
    let e = engine();
    let mut rng = Rng::new(2);
    for &n in SIZES {
        let (a, b) = (rng.vec(n), rng.vec(n));
        let ta = Tensor::from_slice(&e, &a, &[n], "a").unwrap();
        let tb = Tensor::from_slice(&e, &b, &[n], "b").unwrap();
        let sum: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| *x as f64 + *y as f64)
            .collect();
        let prod: Vec<f64> = a
            .iter()
            .zip(&b)
            .map(|(x, y)| *x as f64 * *y as f64)
            .collect();
        let r: Vec<f64> = a.iter().map(|x| (*x as f64).max(0.0)).collect();
        assert!(max_rel_err(&elementwise::add(&ta, &tb).unwrap().to_vec().unwrap(), &sum) < TOL);
        assert!(
            max_rel_err(
                &elementwise::mul(&ta, &tb).unwrap().to_vec().unwrap(),
                &prod
            ) < TOL
        );
        assert!(max_rel_err(&relu::relu(&ta).unwrap().to_vec().unwrap(), &r) < TOL);
    }
}

#[test]
fn elementwise_past_65535_workgroups_uses_a_2d_grid() {
    // 256 * 65,535 + 1000 elements: one more workgroup than one dimension holds.
    let n = 256 * 65_535 + 1000;
    let e = engine();
    let a = fill::full(&e, &[n], 1.5, "a").unwrap();
    let b = fill::full(&e, &[n], 2.0, "b").unwrap();
    let c = elementwise::mul(&a, &b).unwrap().to_vec().unwrap();
    assert!(c.iter().all(|&v| v == 3.0));
}

#[test]
fn matmul_matches_f64_on_awkward_shapes() {
    let e = engine();
    let mut rng = Rng::new(3);
    let shapes = [
        (1, 1, 1),
        (7, 7, 7),
        (33, 33, 33),
        (1, 257, 7),
        (257, 1, 33),
        (7, 33, 257),
        (65, 129, 63),
        (130, 70, 200),
    ];
    for kernel in [matmul::MatmulKernel::Tiled, matmul::MatmulKernel::Naive] {
        for &(m, k, n) in &shapes {
            let a = rng.vec(m * k);
            let b = rng.vec(k * n);
            let want = matmul_ref(&a, &b, m, k, n);
            let ta = Tensor::from_slice(&e, &a, &[m, k], "a").unwrap();
            let tb = Tensor::from_slice(&e, &b, &[k, n], "b").unwrap();
            let got = matmul::matmul_ex(&ta, &tb, false, false, kernel).unwrap();
            assert_eq!(got.shape(), &[m, n]);
            let err = max_rel_err(&got.to_vec().unwrap(), &want);
            assert!(err < TOL, "{kernel:?} {m}x{k}x{n}: rel err {err}");
        }
    }
}

#[test]
fn matmul_transposed_operands_and_batches() {
    let e = engine();
    let mut rng = Rng::new(4);
    let (m, k, n) = (33, 7, 65);
    let a = rng.vec(m * k);
    let b = rng.vec(k * n);
    let want = matmul_ref(&a, &b, m, k, n);
    // Store Aᵀ ([k, m]) and Bᵀ ([n, k]) and ask for the transposes.
    let at = Tensor::from_slice(&e, &transpose(&a, m, k), &[k, m], "at").unwrap();
    let bt = Tensor::from_slice(&e, &transpose(&b, k, n), &[n, k], "bt").unwrap();
    let got = matmul::matmul_ex(&at, &bt, true, true, matmul::MatmulKernel::Tiled).unwrap();
    assert!(max_rel_err(&got.to_vec().unwrap(), &want) < TOL);

    // Batched: 3 independent products; and a shared right operand.
    let batch = 3;
    let a3 = rng.vec(batch * m * k);
    let b3 = rng.vec(batch * k * n);
    let ta = Tensor::from_slice(&e, &a3, &[batch, m, k], "a3").unwrap();
    let tb = Tensor::from_slice(&e, &b3, &[batch, k, n], "b3").unwrap();
    let got = matmul::matmul(&ta, &tb).unwrap();
    assert_eq!(got.shape(), &[batch, m, n]);
    let got = got.to_vec().unwrap();
    let shared = Tensor::from_slice(&e, &b3[..k * n], &[k, n], "b").unwrap();
    let got_shared = matmul::matmul(&ta, &shared).unwrap().to_vec().unwrap();
    for i in 0..batch {
        let want = matmul_ref(
            &a3[i * m * k..(i + 1) * m * k],
            &b3[i * k * n..(i + 1) * k * n],
            m,
            k,
            n,
        );
        assert!(max_rel_err(&got[i * m * n..(i + 1) * m * n], &want) < TOL);
        let want = matmul_ref(&a3[i * m * k..(i + 1) * m * k], &b3[..k * n], m, k, n);
        assert!(max_rel_err(&got_shared[i * m * n..(i + 1) * m * n], &want) < TOL);
    }
}

#[test]
fn shape_errors_name_both_shapes() {
    let e = engine();
    let a = fill::zeros(&e, &[2, 3], "a").unwrap();
    let b = fill::zeros(&e, &[4, 5], "b").unwrap();
    let err = matmul::matmul(&a, &b).unwrap_err();
    assert!(
        err.to_string().contains("[2, 3]") && err.to_string().contains("[4, 5]"),
        "{err}"
    );
    let err = elementwise::add(&a, &b).unwrap_err();
    assert!(matches!(err, TensorError::ShapeMismatch { .. }));
    assert!(matches!(
        Tensor::empty(&e, &[0, 3], vramlab::tensor::DType::F32, "z"),
        Err(TensorError::Empty { .. })
    ));
    assert!(matches!(
        Tensor::from_slice(&e, &[1.0; 5], &[2, 3], "x"),
        Err(TensorError::DataLength { .. })
    ));
}

#[test]
fn each_kernel_compiles_once() {
    let e = engine();
    let a = fill::full(&e, &[10], 1.0, "a").unwrap();
    for _ in 0..5 {
        let _ = relu::relu(&a).unwrap();
    }
    e.synchronize().unwrap();
    assert_eq!(e.gpu().unwrap().pipelines_compiled(), 2, "fill and relu");
}

#[test]
fn long_reductions_survive_llvmpipes_loop_limit() {
    // llvmpipe ends any shader loop after 65,535 iterations; SimpleConvNet's
    // fc layer reduces over 100,352 inputs. Both kernels must still be exact.
    let e = engine();
    let mut rng = Rng::new(5);
    let (m, k, n) = (2, 100_352, 3);
    let a = rng.vec(m * k);
    let b = rng.vec(k * n);
    let want = matmul_ref(&a, &b, m, k, n);
    let ta = Tensor::from_slice(&e, &a, &[m, k], "a").unwrap();
    let tb = Tensor::from_slice(&e, &b, &[k, n], "b").unwrap();
    for kernel in [matmul::MatmulKernel::Tiled, matmul::MatmulKernel::Naive] {
        let got = matmul::matmul_ex(&ta, &tb, false, false, kernel).unwrap();
        let err = max_rel_err(&got.to_vec().unwrap(), &want);
        assert!(err < TOL, "{kernel:?}: {err}");
    }
    // Channel sums over 3 x 2 x 70,001 positions, and a mean over 140,002.
    let (outer, ch, inner) = (3, 2, 70_001);
    let x = rng.vec(outer * ch * inner);
    let (sums, want) = channel_sums(&e, &x, outer, ch, inner);
    assert!(max_rel_err(&sums, &want) < TOL, "{sums:?} vs {want:?}");
    let t = Tensor::from_slice(&e, &x, &[outer, ch, inner], "x").unwrap();
    let mean = vramlab::ops::mean::mean(&t, "m").unwrap().to_vec().unwrap();
    let want = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
    assert!((mean[0] as f64 - want).abs() < 1e-5, "{mean:?} vs {want}");
}

#[test]
fn channel_sums_match_f64_whatever_share_of_positions_a_workgroup_takes() {
    // Generated shapes from one channel over many positions to many
    // channels over few: a workgroup takes from 2,048 to 16,384 positions
    // of a channel, as many as give about 1,024 workgroups, so both bounds
    // and the range between them are crossed, with a partial last group.
    let e = engine();
    let mut rng = Rng::new(61);
    let mut pick = |lo: usize, hi: usize| lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize;
    let mut shapes = vec![(64, 128, 784), (1, 1, 300_001), (7, 3, 9_999), (2, 500, 17)];
    for _ in 0..8 {
        let ch = pick(1, 300);
        let inner = pick(1, 4_000);
        let outer = pick(1, (1_500_000 / (ch * inner)).max(1));
        shapes.push((outer, ch, inner));
    }
    let mut rng = Rng::new(62);
    for (outer, ch, inner) in shapes {
        let x = rng.vec(outer * ch * inner);
        let (sums, want) = channel_sums(&e, &x, outer, ch, inner);
        // Relative to the sum's scale: uniform ±1 values cancel.
        let scale = ((outer * inner) as f64).sqrt();
        for (c, (g, w)) in sums.iter().zip(&want).enumerate() {
            let err = (*g as f64 - w).abs() / w.abs().max(scale);
            assert!(err < TOL, "{outer}×{ch}×{inner}: channel {c}: {g} vs {w}");
        }
    }
}

/// Σ over outer and inner of x viewed as `[outer, ch, inner]`, per
/// channel: `sum_channels` on the GPU, and in f64.
fn channel_sums(
    e: &vramlab::tensor::Engine,
    x: &[f32],
    outer: usize,
    ch: usize,
    inner: usize,
) -> (Vec<f32>, Vec<f64>) {
    let t = Tensor::from_slice(e, x, &[outer, ch, inner], "x").unwrap();
    let sums = vramlab::ops::bias::sum_channels(&t, ch, inner, "s")
        .unwrap()
        .to_vec()
        .unwrap();
    let want = (0..ch)
        .map(|c| {
            (0..outer)
                .flat_map(|o| (0..inner).map(move |i| (o, i)))
                .map(|(o, i)| x[(o * ch + c) * inner + i] as f64)
                .sum::<f64>()
        })
        .collect();
    (sums, want)
}

/// Planes longer than a grid's x reach (65,535 workgroups of 256
/// positions) are walked in strides of it: a bias added along a plane of
/// 16.8M positions, and col2im's input gradient of a 4096×4096 image (a
/// stride-2 convolution's, which takes the col2im route), reach the last
/// position. Before, both were refused with "more workgroups than the
/// device's 65535".
#[test]
fn planes_past_the_grids_reach_are_walked_in_strides() {
    use vramlab::ops::bias::add_bias;
    use vramlab::ops::conv2d::{conv2d_backward, Conv2dConfig};
    let e = engine();
    let reach = 65_535 * 256;
    let n = reach + 777;
    let t = fill::full(&e, &[1, 1, n], 1.0, "t").unwrap();
    let b = Tensor::from_slice(&e, &[0.5], &[1], "b").unwrap();
    add_bias(&t, &b, 1, n).unwrap();
    let got = t.to_vec().unwrap();
    assert_eq!(got.iter().position(|&v| v != 1.5), None);
    drop((t, got));

    let (h, k, s, p) = (4096usize, 3usize, 2usize, 1usize);
    let ho = (h + 2 * p - k) / s + 1;
    let mut rng = Rng::new(40);
    let w = rng.vec(k * k);
    let dy = rng.vec(ho * ho);
    let x = fill::full(&e, &[1, 1, h, h], 0.25, "x").unwrap();
    let tw = Tensor::from_slice(&e, &w, &[1, 1, k, k], "w").unwrap();
    let tdy = Tensor::from_slice(&e, &dy, &[1, 1, ho, ho], "dy").unwrap();
    let cfg = Conv2dConfig {
        stride: s,
        padding: p,
    };
    let (dx, _, _) = conv2d_backward(&x, &tw, &tdy, cfg, true).unwrap();
    let got = dx.unwrap().to_vec().unwrap();
    let mut want = vec![0.0f64; h * h];
    for oy in 0..ho {
        for ox in 0..ho {
            for ky in 0..k {
                for kx in 0..k {
                    let (y, xx) = (
                        (oy * s + ky) as isize - p as isize,
                        (ox * s + kx) as isize - p as isize,
                    );
                    if (0..h as isize).contains(&y) && (0..h as isize).contains(&xx) {
                        want[y as usize * h + xx as usize] +=
                            dy[oy * ho + ox] as f64 * w[ky * k + kx] as f64;
                    }
                }
            }
        }
    }
    assert!(max_rel_err(&got, &want) < TOL);
    // The positions past the grid's reach are among them, and not all zero.
    assert!(want[reach..].iter().any(|&v| v != 0.0));
    assert!(max_rel_err(&got[reach..], &want[reach..]) < TOL);
}
