//! NaN is not trained on silently: ReLU passes NaN through (as PyTorch's
//! does) so it reaches the loss, and `train` stops at a non-finite loss with
//! an error that says what to check; NaN flags are refused up front.

use crate::common;
use crate::common::cli::{command, stderr, vramlab};

use vramlab::io::SafeTensors;
use vramlab::tensor::Tensor;

#[test]
fn relu_propagates_nan() {
    let e = common::engine();
    let x = Tensor::from_slice(&e, &[f32::NAN, -1.0, 2.0, -0.0, f32::INFINITY], &[5], "x").unwrap();
    let y = vramlab::ops::relu::relu(&x).unwrap().to_vec().unwrap();
    assert!(y[0].is_nan(), "relu(NaN) must be NaN, got {}", y[0]);
    assert_eq!(&y[1..], &[0.0, 2.0, 0.0, f32::INFINITY]);
}

#[test]
fn training_on_nan_input_stops_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("vramlab-nan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("batch.safetensors");
    let mut st = SafeTensors::new();
    let mut x = vec![0.5f32; 4 * 784];
    x[7] = f32::NAN;
    st.insert_f32("x", &[4, 784], &x).unwrap();
    st.insert_i64("y", &[4], &[0, 1, 2, 3]).unwrap();
    st.write(&data).unwrap();
    let out = command(["train", "--model", "mlp", "--steps", "2", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("step 1: the loss is NaN"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nan_and_negative_rates_are_refused_before_any_work() {
    for args in [
        &["demo", "--lr", "nan"][..],
        &["demo", "--lr=-0.1"],
        &["train", "--lr", "inf"],
        &["train", "--momentum", "NaN"],
    ] {
        let out = vramlab(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("must be a finite number"), "{args:?}: {err}");
    }
}
