//! A batch: inputs `x` `[N, ..]` (f32) and integer class labels `y` `[N]`,
//! random (seeded) or read from a safetensors file written by PyTorch
//! (`x` any float dtype, `y` int64 as `torch.long` writes it).

use crate::io::SafeTensors;
use crate::memory::Category;
use crate::nn::init::Rng;
use crate::tensor::{DType, Engine, Tensor, TensorError};

#[derive(Clone)]
pub struct Batch {
    pub x: Tensor,
    /// Labels as f32 class indices (what the cross-entropy kernel reads).
    pub labels: Tensor,
    pub label_values: Vec<i64>,
}

impl Batch {
    /// `x.to(dtype)` (for a model converted with `model.half()`); the f32
    /// inputs are freed.
    pub fn to_dtype(&mut self, dtype: crate::tensor::DType) -> Result<(), TensorError> {
        if self.x.dtype() != dtype {
            let engine = self.x.engine().clone();
            let _scope = engine.scope(Category::Input, "batch");
            self.x = crate::ops::cast::cast(&self.x, dtype, "input")?;
        }
        Ok(())
    }

    /// Standard-normal inputs and uniform labels.
    pub fn random(
        engine: &Engine,
        rng: &mut Rng,
        batch: usize,
        input_shape: &[usize],
        classes: usize,
    ) -> Result<Batch, TensorError> {
        Self::random_as(engine, rng, batch, input_shape, classes, DType::F32)
    }

    /// [`Batch::random`] with inputs stored in `dtype` from the start (a
    /// loader producing 16-bit batches: no f32 copy ever exists).
    pub fn random_as(
        engine: &Engine,
        rng: &mut Rng,
        batch: usize,
        input_shape: &[usize],
        classes: usize,
        dtype: DType,
    ) -> Result<Batch, TensorError> {
        let _scope = engine.scope(Category::Input, "batch");
        let mut shape = vec![batch];
        shape.extend_from_slice(input_shape);
        // Allocated before any host bytes are made (none on a simulated
        // device), so a batch too big for the device fails fast.
        let x = Tensor::generated(engine, &shape, dtype, "input", |n| rng.normal(n))?;
        if engine.is_simulated() {
            let labels = Tensor::empty(engine, &[batch], DType::F32, "labels")?;
            return Ok(Batch {
                x,
                labels,
                label_values: Vec::new(),
            });
        }
        let label_values: Vec<i64> = (0..batch)
            .map(|_| rng.below(classes as u64) as i64)
            .collect();
        Self::with_labels(engine, x, label_values, classes)
    }

    /// A random batch for `spec`: token ids and next-token labels for a
    /// token model (gpt), otherwise [`Batch::random_as`].
    pub fn random_for(
        engine: &Engine,
        rng: &mut Rng,
        spec: &crate::nn::ModelSpec,
        batch: usize,
        dtype: DType,
    ) -> Result<Batch, TensorError> {
        match spec.vocab() {
            Some(vocab) => Self::random_tokens(engine, rng, batch, spec.input_shape()[0], vocab),
            None => Self::random_as(
                engine,
                rng,
                batch,
                &spec.input_shape(),
                spec.classes(),
                dtype,
            ),
        }
    }

    /// Uniform random token ids `[batch, seq]` in `0..vocab` and labels
    /// `[batch·seq]` (a language model's input: ids stored as f32 integers,
    /// exact below 2^24).
    pub fn random_tokens(
        engine: &Engine,
        rng: &mut Rng,
        batch: usize,
        seq: usize,
        vocab: usize,
    ) -> Result<Batch, TensorError> {
        let count = batch.checked_mul(seq).ok_or(TensorError::TooLarge {
            op: "batch",
            shape: vec![batch, seq],
        })?;
        if engine.is_simulated() {
            let _scope = engine.scope(Category::Input, "batch");
            return Ok(Batch {
                x: Tensor::empty(engine, &[batch, seq], DType::F32, "input")?,
                labels: Tensor::empty(engine, &[count], DType::F32, "labels")?,
                label_values: Vec::new(),
            });
        }
        let stream: Vec<u32> = (0..count + 1)
            .map(|_| rng.below(vocab as u64) as u32)
            .collect();
        let starts: Vec<usize> = (0..batch).map(|b| b * seq).collect();
        Self::token_windows(engine, &stream, &starts, seq, vocab)
    }

    /// Windows of a token stream: sample b is `stream[starts[b]..][..seq]`
    /// and its labels the tokens one further on (next-token prediction).
    pub fn token_windows(
        engine: &Engine,
        stream: &[u32],
        starts: &[usize],
        seq: usize,
        vocab: usize,
    ) -> Result<Batch, TensorError> {
        if vocab > 1 << 24 {
            return Err(TensorError::OutOfRange {
                op: "batch",
                what: "the vocabulary (f32 token ids are exact up to 2^24)",
                value: vocab,
                min: 1,
                max: 1 << 24,
                hint: "",
            });
        }
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let n = starts.len().saturating_mul(seq);
        x.try_reserve_exact(n)
            .and_then(|_| y.try_reserve_exact(n))
            .map_err(|_| TensorError::HostMemory {
                op: "batch",
                shape: vec![starts.len(), seq],
                bytes: (n as u64).saturating_mul(12),
            })?;
        for &s0 in starts {
            let w = stream
                .get(s0..s0 + seq + 1)
                .ok_or(TensorError::WindowPastEnd {
                    start: s0,
                    len: seq + 1,
                    tokens: stream.len(),
                })?;
            if let Some(&t) = w.iter().find(|&&t| t as usize >= vocab) {
                return Err(TensorError::ClassOutOfRange {
                    what: "token",
                    value: t.into(),
                    classes: vocab,
                });
            }
            x.extend(w[..seq].iter().map(|&t| t as f32));
            y.extend(w[1..].iter().map(|&t| t as i64));
        }
        let _scope = engine.scope(Category::Input, "batch");
        let xt = Tensor::from_slice(engine, &x, &[starts.len(), seq], "input")?;
        Self::with_labels(engine, xt, y, vocab)
    }

    /// `x` and `y` from a safetensors file; labels must lie in 0..classes.
    /// For a language model (`vocab`), x holds token ids: integers (as
    /// PyTorch saves them) or whole floats, each in 0..vocab.
    pub fn from_safetensors(
        engine: &Engine,
        st: &SafeTensors,
        classes: usize,
        vocab: Option<usize>,
    ) -> Result<Batch, TensorError> {
        let _scope = engine.scope(Category::Input, "batch");
        let (xv, xs) = match vocab {
            Some(vocab) => Self::token_ids(st, vocab).map_err(|e| e.in_file(&st.origin))?,
            None => st.f32("x")?,
        };
        let (yv, ys) = st.i64("y")?;
        // [N] class labels, or [N, S] next-token labels of a sequence
        // model (x [N, S] token ids), flattened as its logits are.
        // A language model's labels are next tokens: x's shape.
        let token_labels = vocab.is_some();
        if !xs.is_empty() && xs.contains(&0) {
            return Err(TensorError::EmptyBatch { shape: xs }.in_file(&st.origin));
        }
        if xs.is_empty() || (ys != xs && (token_labels || ys != [xs[0]])) {
            return Err(TensorError::LabelShape {
                x: xs,
                y: ys,
                tokens: token_labels,
            }
            .in_file(&st.origin));
        }
        let x = Tensor::from_slice(engine, &xv, &xs, "input")?;
        Self::with_labels(engine, x, yv, classes).map_err(|e| e.in_file(&st.origin))
    }

    /// x's token ids as f32, each a whole number in 0..vocab that f32
    /// holds exactly (every id below 2^24; the input is f32).
    fn token_ids(st: &SafeTensors, vocab: usize) -> Result<(Vec<f32>, Vec<usize>), TensorError> {
        let ids: (Vec<i64>, Vec<usize>) = if st.get("x")?.dtype.is_float() {
            // Judged in the file's own precision: an f64 of 7.00000001 is
            // not a token id, though it rounds to 7 in f32.
            let (values, shape) = st.f64("x")?;
            let ids = values
                .iter()
                .map(|&f| {
                    if f.is_finite() && f.fract() == 0.0 {
                        Ok(f as i64)
                    } else {
                        Err(TensorError::TokenNotWhole { value: f, vocab })
                    }
                })
                .collect::<Result<_, _>>()?;
            (ids, shape)
        } else {
            st.i64("x")?
        };
        if let Some(&bad) = ids.0.iter().find(|&&v| v < 0 || v as usize >= vocab) {
            return Err(TensorError::ClassOutOfRange {
                what: "token",
                value: bad,
                classes: vocab,
            });
        }
        if let Some(&big) = ids.0.iter().find(|&&v| (v as f32) as i64 != v) {
            return Err(TensorError::TokenNotExact { value: big });
        }
        Ok((ids.0.iter().map(|&v| v as f32).collect(), ids.1))
    }

    fn with_labels(
        engine: &Engine,
        x: Tensor,
        label_values: Vec<i64>,
        classes: usize,
    ) -> Result<Batch, TensorError> {
        if let Some(&bad) = label_values
            .iter()
            .find(|&&v| v < 0 || v as usize >= classes)
        {
            return Err(TensorError::ClassOutOfRange {
                what: "label",
                value: bad,
                classes,
            });
        }
        let as_f32: Vec<f32> = label_values.iter().map(|&v| v as f32).collect();
        let labels = Tensor::from_slice(engine, &as_f32, &[as_f32.len()], "labels")?;
        Ok(Batch {
            x,
            labels,
            label_values,
        })
    }

    /// The batch size (x's first axis).
    pub fn size(&self) -> usize {
        self.x.shape().first().copied().unwrap_or(0)
    }
}
