//! The zoo: every model a command can name, one line each. A model's file
//! owns its sizes, defaults, checks and layers and exports one [`ZooEntry`].

use super::spec::ModelSpec;
pub use super::spec::ZooEntry;
use crate::tensor::SpecError;

impl ModelSpec {
    /// The zoo model called `name` with default sizes.
    pub fn default_for(name: &str) -> Result<ModelSpec, SpecError> {
        Zoo::standard().spec(name)
    }
}

/// vramlab's models, in the order `vramlab models` lists them.
pub const ZOO: &[ZooEntry] = &[
    super::mlp::ENTRY,
    super::simple_cnn::ENTRY,
    super::resnet_mini::ENTRY,
    super::attention::ENTRY,
    super::gpt::ENTRY,
    super::resnet::ENTRY,
];

/// A registry to look models up in: the standard zoo, plus any a program
/// adds with [`Zoo::add`].
#[derive(Clone)]
pub struct Zoo {
    entries: Vec<ZooEntry>,
}

impl Zoo {
    pub fn standard() -> Zoo {
        Zoo {
            entries: ZOO.to_vec(),
        }
    }

    /// Adds a model; an entry of the same name replaces the old one.
    pub fn add(&mut self, entry: ZooEntry) {
        self.entries.retain(|e| e.name != entry.name);
        self.entries.push(entry);
    }

    pub fn entries(&self) -> &[ZooEntry] {
        &self.entries
    }

    /// The model called `name` with its default sizes.
    pub fn spec(&self, name: &str) -> Result<ModelSpec, SpecError> {
        match self.entries.iter().find(|e| e.name == name) {
            Some(e) => Ok((e.default)()),
            None => Err(SpecError::UnknownModel {
                name: name.to_string(),
                known: self.entries.iter().map(|e| e.name).collect(),
            }),
        }
    }
}
