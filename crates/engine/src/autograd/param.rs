//! Parameters by name (PyTorch's state_dict names) with their gradients.
//! A gradient stays allocated until `zero_grad`, as in PyTorch, which is why
//! "gradients live only through backward" (the articles' claim C03) is false.

use crate::ops::elementwise;
use crate::tensor::{LoadProblem, Tensor, TensorError};

/// Index of a parameter in its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamId(pub usize);

/// One trainable tensor.
pub struct Parameter {
    pub name: String,
    pub value: Tensor,
    pub grad: Option<Tensor>,
}

/// All parameters of a model, in registration order.
#[derive(Default)]
pub struct ParamStore {
    params: Vec<Parameter>,
}

impl ParamStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, name: &str, value: Tensor) -> ParamId {
        self.params.push(Parameter {
            name: name.to_string(),
            value,
            grad: None,
        });
        ParamId(self.params.len() - 1)
    }

    pub fn get(&self, id: ParamId) -> &Parameter {
        &self.params[id.0]
    }

    pub fn get_mut(&mut self, id: ParamId) -> &mut Parameter {
        &mut self.params[id.0]
    }

    pub fn iter(&self) -> impl Iterator<Item = &Parameter> {
        self.params.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Parameter> {
        self.params.iter_mut()
    }

    /// The name of the `i`-th parameter in registration order ("" past the end).
    pub fn name_of(&self, i: usize) -> &str {
        self.params.get(i).map_or("", |p| p.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Total number of elements (what the articles call the parameter count).
    pub fn numel(&self) -> usize {
        self.params.iter().map(|p| p.value.numel()).sum()
    }

    /// Adds `g` into the parameter's `.grad` (sets it if there is none).
    pub fn accumulate_grad(&mut self, id: ParamId, g: Tensor) -> Result<(), TensorError> {
        let p = &mut self.params[id.0];
        let total = elementwise::accumulate(p.grad.take(), g)?;
        total.storage().retag(crate::memory::Category::Gradient);
        p.grad = Some(total);
        Ok(())
    }

    /// `model.to(dtype)` (`model.half()` for f16): every parameter converted,
    /// the f32 copies freed (gradients dropped). Training afterwards is
    /// pure low precision: gradients and optimizer state in `dtype` too.
    pub fn to_dtype(&mut self, dtype: crate::tensor::DType) -> Result<(), TensorError> {
        for p in &mut self.params {
            if p.value.dtype() == dtype {
                continue;
            }
            let engine = p.value.engine().clone();
            let _scope = engine.scope(crate::memory::Category::Parameter, "model.to");
            p.value = crate::ops::cast::cast(&p.value, dtype, &p.name)?;
            p.grad = None;
        }
        Ok(())
    }

    /// `zero_grad(set_to_none=True)`, PyTorch's default: frees every gradient.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.grad = None;
        }
    }
}

impl ParamStore {
    /// `load_state_dict(strict=True)`: every parameter must be in `st` with
    /// its exact shape, and `st` may hold nothing else.
    pub fn load(&mut self, st: &crate::io::SafeTensors) -> Result<(), TensorError> {
        self.load_with_buffers(st, &[])
    }

    /// [`ParamStore::load`] for a model with `buffers` (BatchNorm's running
    /// statistics, by state_dict name): those `st` holds are checked and
    /// written into the model's tensors in place, and each one's
    /// `num_batches_tracked` is accepted and left out (with PyTorch's
    /// default momentum it changes nothing). A file of the parameters alone
    /// (`named_parameters()`) still loads, the buffers keeping their
    /// initial values.
    pub fn load_with_buffers(
        &mut self,
        st: &crate::io::SafeTensors,
        buffers: &[(String, Tensor)],
    ) -> Result<(), TensorError> {
        let mut problems = Vec::new();
        for p in &self.params {
            match st.f32(&p.name) {
                Err(e) => problems.push(LoadProblem::Read(e)),
                Ok((_, shape)) if shape != p.value.shape() => problems.push(LoadProblem::Shape {
                    name: p.name.clone(),
                    file: shape,
                    model: p.value.shape().to_vec(),
                }),
                Ok(_) => {}
            }
        }
        let present: Vec<&(String, Tensor)> = buffers
            .iter()
            .filter(|(name, _)| st.tensors.contains_key(name))
            .collect();
        if !present.is_empty() && present.len() < buffers.len() {
            let missing = buffers
                .iter()
                .filter(|(name, _)| !st.tensors.contains_key(name))
                .map(|(name, _)| name.clone())
                .collect();
            problems.push(LoadProblem::MissingBuffers(missing));
        }
        for (name, t) in &present {
            match st.f32(name) {
                Err(e) => problems.push(LoadProblem::Read(e)),
                Ok((_, shape)) if shape != t.shape() => problems.push(LoadProblem::Shape {
                    name: name.clone(),
                    file: shape,
                    model: t.shape().to_vec(),
                }),
                Ok(_) => {}
            }
        }
        let known = |k: &str| {
            self.params.iter().any(|p| p.name == k)
                || buffers.iter().any(|(b, _)| b == k)
                || k.strip_suffix(".num_batches_tracked").is_some_and(|m| {
                    buffers
                        .iter()
                        .any(|(b, _)| b.strip_suffix(".running_mean") == Some(m))
                })
        };
        let unexpected: Vec<String> = st.tensors.keys().filter(|k| !known(k)).cloned().collect();
        if !unexpected.is_empty() {
            problems.push(LoadProblem::Unexpected(unexpected));
        }
        if !problems.is_empty() {
            return Err(TensorError::Load {
                path: st.origin.clone(),
                problems,
            });
        }
        for p in &mut self.params {
            let _scope = p
                .value
                .engine()
                .scope(crate::memory::Category::Parameter, "load");
            let (values, shape) = st.f32(&p.name)?;
            p.value = Tensor::from_slice(p.value.engine(), &values, &shape, &p.name)?;
        }
        for (name, t) in present {
            let (values, _) = st.f32(name)?;
            t.write_f32(&values)?;
        }
        Ok(())
    }

    /// Adds `param.<name>` (and, where present, `grad.<name>`) to `out`.
    pub fn dump(&self, out: &mut crate::io::SafeTensors) -> Result<(), TensorError> {
        for p in &self.params {
            let put = |out: &mut crate::io::SafeTensors, key: String, t: &Tensor| {
                Ok::<_, TensorError>(out.insert_f32(&key, t.shape(), &t.to_vec()?)?)
            };
            put(out, format!("param.{}", p.name), &p.value)?;
            if let Some(g) = &p.grad {
                put(out, format!("grad.{}", p.name), g)?;
            }
        }
        Ok(())
    }
}
