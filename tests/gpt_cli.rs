//! `gpt` from the command line: it trains on text (the built-in text and a
//! file) and its loss falls; `estimate` handles GPT-2 presets up to 175B
//! parameters on a simulated device without building anything in host
//! memory; flags that do not fit are errors that say why.

use crate::common;
use crate::common::cli::{command, stderr, stdout, vramlab};
use common::*;

fn losses(v: &serde_json::Value) -> Vec<f64> {
    v["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn a_small_gpt_learns_the_built_in_text() {
    let v = vramlab_json([
        "train", "--model", "gpt", "--steps", "40", "--batch", "8", "--json",
    ]);
    let l = losses(&v);
    assert_eq!(l.len(), 40);
    // Uniform over 96 characters is ln 96 = 4.56; English text is far
    // more predictable, and 40 Adam steps get well below.
    assert!((l[0] - 96f64.ln()).abs() < 0.3, "first loss {}", l[0]);
    let late: f64 = l[30..].iter().sum::<f64>() / 10.0;
    assert!(
        late < l[0] - 1.0,
        "loss {} → {late} (mean of the last 10)",
        l[0]
    );
}

#[test]
fn train_reads_a_text_file() {
    let dir = std::env::temp_dir().join(format!("vramlab-gpt-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.txt");
    // One repeated line (with a tab and a non-ASCII letter, read as
    // spaces): easy to learn, so the loss falls fast.
    std::fs::write(&file, "abcabc\tabc é\n".repeat(200)).unwrap();
    let f = file.to_str().unwrap();
    let v = vramlab_json([
        "train",
        "--model",
        "gpt",
        "--text",
        f,
        "--steps",
        "25",
        "--batch",
        "4",
        "--seq-len",
        "16",
        "--json",
    ]);
    let l = losses(&v);
    assert!(l[24] < l[0] - 1.5, "{l:?}");
    let bad = |args: &[&str]| {
        let out = vramlab(args);
        assert!(!out.status.success(), "{args:?} should fail");
        stderr(&out)
    };
    let e = bad(&["train", "--model", "mlp", "--text", f]);
    assert!(e.contains("--model gpt"), "{e}");
    let e = bad(&["train", "--model", "gpt", "--vocab", "50", "--text", f]);
    assert!(e.contains("vocab"), "{e}");
    let e = bad(&["train", "--model", "gpt", "--text", "/nonexistent/x.txt"]);
    assert!(e.contains("/nonexistent/x.txt"), "{e}");
    let e = bad(&["train", "--model", "gpt", "--dtype", "f16"]);
    assert!(e.contains("--amp"), "{e}");
    let e = bad(&["estimate", "--model", "gpt", "--dim", "100", "--heads", "3"]);
    assert!(e.contains("multiple"), "{e}");
    let e = bad(&["estimate", "--model", "gpt", "--preset", "gpt5"]);
    assert!(e.contains("gpt2-xl"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn estimate_handles_gpt2_to_175b() {
    let mut params = Vec::new();
    for preset in ["gpt2", "gpt2-xl", "7b", "175b"] {
        let v = vramlab_json([
            "estimate",
            "--model",
            "gpt",
            "--preset",
            preset,
            "--batch",
            "8",
            "--seq-len",
            "1024",
            "--optimizer",
            "adamw",
            "--json",
        ]);
        let p = v["parameters"].as_u64().unwrap();
        params.push(p);
        let e = &v["estimate"];
        let peak = e["peak_allocated_bytes"].as_u64().unwrap();
        // Weights + gradients + AdamW's two moments are 16 bytes per
        // parameter; activations come on top.
        assert!(peak > 16 * p, "{preset}: peak {peak} for {p} parameters");
    }
    // GPT-2 small is 124M parameters (with the tied head), GPT-3 175B.
    assert!(
        (124_000_000..125_500_000).contains(&params[0]),
        "{params:?}"
    );
    assert!(
        (1_500_000_000..1_600_000_000).contains(&params[1]),
        "{params:?}"
    );
    assert!(
        (174_000_000_000..176_000_000_000).contains(&params[3]),
        "{params:?}"
    );
}

/// `--data` for a language model: x holds token ids, as integers (what
/// PyTorch saves) or whole floats, each inside the vocabulary; an id past
/// it, negative or not whole is an error naming it, never clamped.
#[test]
fn data_token_ids_are_whole_and_inside_the_vocabulary() {
    use vramlab::io::SafeTensors;
    use vramlab::memory::AllocatorConfig;
    use vramlab::nn::ModelSpec;
    use vramlab::tensor::Engine;
    use vramlab::train::Batch;
    let spec = ModelSpec::default_for("gpt").unwrap();
    let vocab = spec.vocab().expect("gpt has a vocabulary");
    let seq = spec.input_shape()[0];
    let e = Engine::simulated(AllocatorConfig::default(), None);
    let labels: Vec<i64> = (0..2 * seq).map(|i| (i % vocab) as i64).collect();
    let batch = |x: &dyn Fn(&mut SafeTensors)| {
        let mut st = SafeTensors::new();
        x(&mut st);
        st.insert_i64("y", &[2, seq], &labels).unwrap();
        Batch::from_safetensors(&e, &st, spec.classes(), spec.vocab()).map(|b| b.size())
    };
    let ids = |last: i64| -> Vec<i64> {
        let mut v = labels.clone();
        *v.last_mut().unwrap() = last;
        v
    };
    // int64 ids, and the same as whole floats.
    assert_eq!(
        batch(&|st| st.insert_i64("x", &[2, seq], &ids(3)).unwrap()).unwrap(),
        2
    );
    let floats = |last: f32| -> Vec<f32> {
        let mut v: Vec<f32> = labels.iter().map(|&i| i as f32).collect();
        *v.last_mut().unwrap() = last;
        v
    };
    assert_eq!(
        batch(&|st| st.insert_f32("x", &[2, seq], &floats(3.0)).unwrap()).unwrap(),
        2
    );
    for bad in [vocab as i64, -1] {
        let err = batch(&|st| st.insert_i64("x", &[2, seq], &ids(bad)).unwrap()).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("token {bad} is outside 0..{vocab}")),
            "{err}"
        );
    }
    let err = batch(&|st| {
        st.insert_f32("x", &[2, seq], &floats(vocab as f32))
            .unwrap()
    })
    .unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    // Labels of one class a sample are not next tokens.
    let err = {
        let mut st = SafeTensors::new();
        st.insert_i64("x", &[2, seq], &ids(3)).unwrap();
        st.insert_i64("y", &[2], &[0, 1]).unwrap();
        Batch::from_safetensors(&e, &st, spec.classes(), spec.vocab())
            .map(|b| b.size())
            .unwrap_err()
    };
    // Said as a language model's rule (the class-label rule, "y must have
    // shape [N]", read as if [2] should pass).
    assert!(err.to_string().contains("its shape must be x's"), "{err}");
    // A batch of no samples is said as such (it was "from_slice: a tensor
    // of shape [0, 16] has no elements").
    let err = {
        let mut st = SafeTensors::new();
        st.insert_i64("x", &[0, seq], &[]).unwrap();
        st.insert_i64("y", &[0, seq], &[]).unwrap();
        Batch::from_safetensors(&e, &st, spec.classes(), spec.vocab())
            .map(|b| b.size())
            .unwrap_err()
    };
    assert!(err.to_string().contains("holds no samples"), "{err}");
    // An f64 id is judged as stored: 7.00000001 is not 7.
    let err = batch(&|st| {
        let mut v: Vec<f64> = labels.iter().map(|&i| i as f64).collect();
        v[0] = 7.000_000_01;
        st.tensors.insert(
            "x".into(),
            vramlab::io::safetensors::StTensor {
                dtype: vramlab::io::safetensors::StDtype::F64,
                shape: vec![2, seq],
                data: v.iter().flat_map(|f| f.to_le_bytes()).collect(),
            },
        );
    })
    .unwrap_err();
    assert!(err.to_string().contains("not a whole number"), "{err}");
    // A vocabulary past 2^24: an id f32 cannot hold is refused, not rounded.
    let mut st = SafeTensors::new();
    st.insert_i64("x", &[2, seq], &ids(16_777_217)).unwrap();
    st.insert_i64("y", &[2, seq], &labels).unwrap();
    let err = Batch::from_safetensors(&e, &st, spec.classes(), Some(20_000_000))
        .map(|b| b.size())
        .unwrap_err();
    assert!(err.to_string().contains("past 2^24"), "{err}");
    for bad in [1.5, f32::NAN] {
        let err = batch(&|st| st.insert_f32("x", &[2, seq], &floats(bad)).unwrap()).unwrap_err();
        assert!(err.to_string().contains("not a whole number"), "{err}");
    }
}

/// `vramlab models` names every GPT preset `--preset` takes, in order.
#[test]
fn models_lists_every_preset() {
    let names: Vec<&str> = vramlab::nn::gpt::PRESETS.iter().map(|p| p.0).collect();
    let listed = format!("--preset {};", names.join("|"));
    assert!(vramlab::nn::gpt::ENTRY.about.contains(&listed), "{listed}");
}

/// A gpt whose head count no shape holds loads with --heads beside --load:
/// the file's shapes decide dim, vocab, positions and layers, the flag adds
/// the heads (it failed on the default dim 64 before the file was read),
/// and a flag that contradicts the file is refused naming it. Without
/// --heads or `heads` metadata it is an error, not a guess.
#[test]
fn heads_come_from_the_flag_beside_load() {
    use vramlab::io::SafeTensors;
    let dir = std::env::temp_dir().join(format!("vramlab-gpt-heads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("dump.safetensors");
    let sizes = [
        "--heads",
        "3",
        "--dim",
        "12",
        "--vocab",
        "100",
        "--seq-len",
        "7",
        "--layers",
        "2",
    ];
    let mut args = vec!["train", "--model", "gpt", "--steps", "1", "--batch", "2"];
    args.extend(sizes);
    let out = command(&args).arg("--dump").arg(&dump).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let dumped = SafeTensors::read(&dump).unwrap();
    let mut weights = SafeTensors::new();
    for (name, t) in &dumped.tensors {
        if let Some(param) = name.strip_prefix("param.") {
            weights.tensors.insert(param.to_string(), t.clone());
        }
    }
    let w = dir.join("w.safetensors");
    weights.write(&w).unwrap();
    let train = |extra: &[&str]| {
        command([
            "train", "--model", "gpt", "--steps", "1", "--batch", "2", "--load",
        ])
        .arg(&w)
        .args(extra)
        .output()
        .unwrap()
    };
    let ok = train(&["--heads", "3"]);
    let text = stdout(&ok);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(text.contains("3 heads, dim 12"), "{text}");
    // Without --heads or metadata the head count is not guessed: a guess
    // trains with the loss right and the attention's gradients wrong.
    let assumed = train(&[]);
    assert_eq!(assumed.status.code(), Some(1));
    let err = stderr(&assumed);
    assert!(err.contains("give --heads"), "{err}");
    // vramlab's own dump records its heads, so it loads back without them.
    let resumed = command([
        "train", "--model", "gpt", "--steps", "1", "--batch", "2", "--load",
    ])
    .arg(&dump)
    .output()
    .unwrap();
    assert!(
        stdout(&resumed).contains("3 heads, dim 12"),
        "{}",
        stderr(&resumed)
    );
    // A batch of shorter sequences: its length is the file's to set, the
    // flags only add the heads (it was refused as contradicting --heads).
    let ids: Vec<i64> = (0..10).map(|i| i * 9 % 100).collect();
    let mut batch = SafeTensors::new();
    batch.insert_i64("x", &[2, 5], &ids).unwrap();
    batch.insert_i64("y", &[2, 5], &ids).unwrap();
    let data = dir.join("ids.safetensors");
    batch.write(&data).unwrap();
    let data = data.to_str().unwrap();
    let with_data = train(&["--heads", "3", "--data", data]);
    assert!(with_data.status.success(), "{}", stderr(&with_data));
    let clash = train(&["--heads", "3", "--seq-len", "7", "--data", data]);
    assert!(!clash.status.success());
    let err = stderr(&clash);
    assert!(
        err.contains("the flags (--seq-len, --heads)") || err.contains("--seq-len"),
        "{err}"
    );
    let wrong = train(&["--heads", "3", "--dim", "24"]);
    assert!(!wrong.status.success());
    let err = stderr(&wrong);
    assert!(
        err.contains("the flags (--dim, --heads)") || err.contains("--dim"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `train --data` with int64 token ids, as PyTorch saves them and as the
/// token-id error advises: the command read x as floats to learn its shape
/// and refused int64 ("is I64, but a float type … was expected").
#[test]
fn train_takes_int64_token_ids() {
    use vramlab::io::SafeTensors;
    let dir = std::env::temp_dir().join(format!("vramlab-gpt-ids-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (n, seq) = (2usize, 16usize);
    let ids: Vec<i64> = (0..n * seq).map(|i| (i * 7 % 96) as i64).collect();
    let mut st = SafeTensors::new();
    st.insert_i64("x", &[n, seq], &ids).unwrap();
    st.insert_i64("y", &[n, seq], &ids).unwrap();
    let path = dir.join("ids.safetensors");
    st.write(&path).unwrap();
    let out = command(["train", "--model", "gpt", "--steps", "1", "--data"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
