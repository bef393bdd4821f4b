//! What `resnet50` saves for backward, per stage, equals to the byte what
//! PyTorch's autograd saves for torchvision's ResNet (in-place ReLUs and
//! residual adds) in f32 — the tensors `saved_tensors_hooks` sees, each
//! storage once, parameters and buffers left out
//! (tests/fixtures/torch/resnet_saved.json from scripts/resnet_reference.py)
//! — except the max pool's indices, which PyTorch keeps as int64 (8 bytes)
//! and vramlab as f32 (4), asserted too. Out-of-place ReLUs and adds save
//! the same: ReLU saves its output either way, and BatchNorm saves its input
//! (the convolution's output), never its output.

use crate::common;
use common::saved_bytes_by_part;
use vramlab::nn::ModelSpec;

fn part_of(scope: &str) -> String {
    if let Some(rest) = scope.strip_prefix("layer") {
        return format!("layer{}", &rest[..1]);
    }
    if ["stem", "conv1", "bn1"]
        .iter()
        .any(|p| scope.starts_with(p))
    {
        "stem".into()
    } else if scope.starts_with("cross_entropy") {
        "loss".into()
    } else {
        "head".into()
    }
}

#[test]
fn saved_bytes_per_stage_match_pytorch() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch/resnet_saved.json");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    for case in cases.as_array().unwrap() {
        let c = &case["config"];
        let get = |k: &str| c[k].as_u64().unwrap() as usize;
        let spec = ModelSpec::from(vramlab::nn::Resnet50Spec {
            depth: get("depth"),
            width: get("width"),
            resolution: get("resolution"),
            classes: get("classes"),
        });
        let batch = get("batch");
        let ours = saved_bytes_by_part(&spec, batch, part_of);
        let theirs = &case["parts"];
        let num = |part: &str, kind: &str| theirs[part][kind].as_u64().unwrap();
        for s in 1..=4 {
            let part = format!("layer{s}");
            assert_eq!(ours[&part], num(&part, "float"), "{spec:?} {part}");
            assert_eq!(num(&part, "int64"), 0);
        }
        // The stem: the max pool's indices are int64 there, f32 here.
        assert_eq!(
            ours["stem"],
            num("stem", "float") + num("stem", "int64") / 2,
            "{spec:?} stem"
        );
        assert_eq!(ours["head"], num("head", "float"), "{spec:?} head");
        // Loss: logits here, log-probabilities there (same size); labels
        // f32 here, int64 there.
        assert_eq!(
            ours["loss"],
            num("loss", "float") + batch as u64 * 4,
            "{spec:?} loss"
        );
        assert_eq!(ours.len(), 7, "{ours:?}");
    }
}

/// A ResNet's full `model.state_dict()` loads: its BatchNorm running
/// statistics go into the model's buffers (checked for shape), and each
/// `num_batches_tracked` is accepted; a name that is neither is still
/// refused, and the parameters alone still load. (It was refused as
/// "unexpected tensors (not parameters of this model): bn1.running_mean".)
#[test]
fn a_full_state_dict_loads_its_running_statistics() {
    use vramlab::autograd::param::ParamStore;
    use vramlab::io::SafeTensors;
    let e = crate::common::engine();
    let spec = ModelSpec::from(vramlab::nn::Resnet50Spec {
        depth: 50,
        width: 2,
        resolution: 32,
        classes: 4,
    });
    let mut store = ParamStore::new();
    let model = spec
        .build(&e, &mut store, &mut vramlab::nn::init::Rng::new(1))
        .unwrap();
    let buffers = model.buffers();
    assert!(buffers.iter().any(|(n, _)| n == "bn1.running_var"));
    let mut full = SafeTensors::new();
    for (name, shape) in spec.parameter_shapes() {
        let n = shape.iter().product();
        full.insert_f32(&name, &shape, &vec![0.5; n]).unwrap();
    }
    let params_only = full.clone();
    for (i, (name, t)) in buffers.iter().enumerate() {
        let values: Vec<f32> = (0..t.numel()).map(|j| (i * 7 + j) as f32 + 0.25).collect();
        full.insert_f32(name, t.shape(), &values).unwrap();
        let tracked = name.replace(".running_mean", ".num_batches_tracked");
        if tracked != *name {
            full.insert_i64(&tracked, &[], &[3]).unwrap();
        }
    }
    store.load_with_buffers(&full, &buffers).unwrap();
    for (i, (name, t)) in buffers.iter().enumerate() {
        let want: Vec<f32> = (0..t.numel()).map(|j| (i * 7 + j) as f32 + 0.25).collect();
        assert_eq!(t.to_vec().unwrap(), want, "{name}");
    }
    store.load_with_buffers(&params_only, &buffers).unwrap();
    let mut stray = full.clone();
    stray
        .insert_f32("bn1.running_median", &[1], &[0.0])
        .unwrap();
    let err = store
        .load_with_buffers(&stray, &buffers)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bn1.running_median"), "{err}");
    // The same file on a store that knows no buffers names them.
    let err = store.load(&full).unwrap_err().to_string();
    assert!(err.contains("running_mean"), "{err}");
}
