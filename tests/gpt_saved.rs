//! What `gpt` saves for backward, per block, equals to the byte what
//! PyTorch's autograd saves for the same architecture in f32 — the tensors
//! `torch.autograd.graph.saved_tensors_hooks` sees in nanoGPT's forward,
//! each storage once, parameters left out (tests/fixtures/torch/gpt_saved.json,
//! written by scripts/gpt_reference.py) — except where PyTorch saves
//! differently, which is asserted too: its masked_fill keeps a freshly
//! compared bool mask per block (S² bytes; vramlab's causal softmax is fused
//! and keeps none), and its indices and labels are int64 (vramlab's f32).
//! With dropout both keep a one-byte mask per element (PyTorch's
//! native_dropout, what CUDA runs; "bool" in the fixture).
//! Runs on a simulated device: the bytes depend on shapes only.

use crate::common;
use common::saved_bytes_by_part;
use vramlab::nn::gpt::GptConfig;
use vramlab::nn::ModelSpec;

fn fixture() -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/torch/gpt_saved.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The part of the model a saving scope belongs to.
fn part_of(scope: &str) -> String {
    if let Some(rest) = scope.strip_prefix("h.") {
        let i: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        return format!("h.{i}");
    }
    // (The one dropout outside the blocks is the embedding's; `wte` and
    // `wpe` are the two tables' layers.)
    if ["embedding", "dropout", "wte.", "wpe."]
        .iter()
        .any(|p| scope.starts_with(p))
    {
        "embedding".into()
    } else if scope.starts_with("cross_entropy") {
        "loss".into()
    } else {
        "head".into()
    }
}

#[test]
fn saved_bytes_per_block_match_pytorch() {
    for case in fixture().as_array().unwrap() {
        let c = &case["config"];
        let get = |k: &str| c[k].as_u64().unwrap() as usize;
        let cfg = GptConfig {
            layers: get("layers"),
            heads: get("heads"),
            dim: get("dim"),
            seq_len: get("seq_len"),
            vocab: get("vocab"),
        };
        let (n, s) = (get("batch") as u64, cfg.seq_len as u64);
        let dropout = c["dropout"].as_f64().unwrap_or(0.0) as f32;
        let spec = ModelSpec::from(vramlab::nn::GptSpec {
            config: cfg,
            seq: cfg.seq_len,
            dropout,
        });
        let ours = saved_bytes_by_part(&spec, n as usize, part_of);
        let theirs = &case["parts"];
        let num = |part: &str, kind: &str| theirs[part][kind].as_u64().unwrap();
        for i in 0..cfg.layers {
            let part = format!("h.{i}");
            // Dropout masks: three per block (attention probabilities, both
            // residual branches), one byte an element, in both.
            let masks = if dropout > 0.0 {
                n * cfg.heads as u64 * s * s + 2 * n * s * cfg.dim as u64
            } else {
                0
            };
            assert_eq!(
                ours[&part],
                num(&part, "float") + masks,
                "{cfg:?} block {i}: saved bytes"
            );
            // PyTorch's one difference inside a block: the causal mask.
            assert_eq!(
                num(&part, "bool"),
                s * s + masks,
                "{cfg:?} block {i}: PyTorch's masks"
            );
            assert_eq!(num(&part, "int64") + num(&part, "scalar"), 0);
        }
        // ln_f's input, mean, rstd and output (the tied head's input).
        assert_eq!(ours["head"], num("head", "float"), "{cfg:?}: head");
        // Loss: vramlab keeps the logits, PyTorch the log-probabilities
        // (same size); labels are f32 here, int64 there.
        assert_eq!(
            ours["loss"],
            num("loss", "float") + n * s * 4,
            "{cfg:?}: loss"
        );
        assert_eq!(num("loss", "int64"), n * s * 8);
        // Embedding: the token ids (f32 here; int64 ids and positions
        // there), and the embedding dropout's mask.
        let emb_mask = if dropout > 0.0 {
            n * s * cfg.dim as u64
        } else {
            0
        };
        assert_eq!(
            ours["embedding"],
            n * s * 4 + emb_mask,
            "{cfg:?}: embedding"
        );
        assert_eq!(num("embedding", "bool"), emb_mask);
        assert_eq!(num("embedding", "int64"), n * s * 8 + s * 8);
        assert_eq!(
            ours.len(),
            cfg.layers + 3,
            "{cfg:?}: nothing saved outside the blocks, head, loss and embedding: {ours:?}"
        );
    }
}
