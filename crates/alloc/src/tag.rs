//! What a block holds, beyond its tensor's name: a category (why the memory
//! exists) and the op that made it (`conv2.forward`, `fc.backward`,
//! `adam.step`). Snapshots, event logs and reports carry both, so every byte
//! can be attributed.

use serde::{Deserialize, Serialize};

/// Why a block is allocated.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    Input,
    /// Saved for backward.
    Activation,
    /// A forward result nobody saved (yet): what `no_grad` produces.
    Output,
    /// Freed within its op or within backward (gradients flowing between ops).
    Temporary,
    /// Scratch inside one op (conv2d's im2col columns).
    Workspace,
    /// Autocast's 16-bit copies of f32 weights, cast once per autocast
    /// region and kept while an op saved them for backward. Written
    /// `autocast_cache` everywhere; recordings before it said `cast_cache`.
    #[serde(rename = "autocast_cache", alias = "cast_cache")]
    CastCache,
    /// Allocated outside any labelled scope.
    #[default]
    Untagged,
}

/// Every category, in report order.
/// How many categories there are.
pub const N_CATEGORIES: usize = 10;

pub const CATEGORIES: [Category; N_CATEGORIES] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Input,
    Category::Activation,
    Category::Output,
    Category::Temporary,
    Category::Workspace,
    Category::CastCache,
    Category::Untagged,
];

impl Category {
    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Input => "input",
            Category::Activation => "activation",
            Category::Output => "output",
            Category::Temporary => "temporary",
            Category::Workspace => "workspace",
            Category::CastCache => "autocast_cache",
            Category::Untagged => "untagged",
        }
    }

    /// Parameters and optimizer state: allocated once, alive until the
    /// model goes away (what a placement policy may place with care).
    pub fn lives_for_the_run(self) -> bool {
        matches!(self, Category::Parameter | Category::OptimizerState)
    }

    /// Index into [`CATEGORIES`].
    pub fn index(self) -> usize {
        CATEGORIES
            .iter()
            .position(|&c| c == self)
            .unwrap_or(N_CATEGORIES - 1)
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
