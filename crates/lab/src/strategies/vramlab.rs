//! vramlab's placement options: PyTorch's caching allocator plus a
//! placement policy, plugged in through the allocator's placement hook
//! ([`Placement`](crate::memory::Placement)). Three options, each an
//! alloc-conf key parsed here (the allocator knows only PyTorch's):
//! - `lookahead` (lookahead.rs): a large parameter or optimizer-state block
//!   goes where a replay of the short-lived history reserves least — one of
//!   the 8 best-fitting free blocks or a new segment. PyTorch's best fit puts
//!   Adam's first-step state into the hole an activation left, and the next
//!   step needs a new segment (simple-cnn: 146 → 140 MiB reserved, same
//!   device allocations).
//! - `small_from_large`: a small request with no free small block is carved
//!   from a free large block before a new 2 MiB small segment is made —
//!   with `lookahead`, unless its replay says the large block is needed
//!   whole.
//! - `release_before_grow`: before a new segment, give back the pool's whole
//!   free segments too small for the request.
//!
//! These were the `vramlab` strategy until issue 31 (the lab's `vramlab` is
//! now expandable segments over 2 MiB granules, granules.rs); the engine,
//! which has no page mapping on wgpu, still runs `lookahead` and
//! `small_from_large` as `vramlab` (`max-batch --allocator vramlab`,
//! `bench-alloc --grid`): on the grid the two together win 24 of 64 cells
//! and lose none.
//! `release_before_grow` lowered one workload's peak but cost device
//! allocations, so it stays an option. PyTorch snapshots get categories from
//! their frames (`torch_snapshot.rs`); traces without any get
//! `small_from_large` alone.

use crate::error::LabError;
use crate::lookahead::History;
use crate::memory::config::{parse_bool, split_options, KNOWN_KEYS};
use crate::memory::{
    AllocatorConfig, AllocatorView, BlockHandle, FreeBlock, Ghost, Place, Placement, PoolKind,
    Request, ALLOC_CONF_ENV,
};
use std::any::Any;
use std::sync::Arc;

/// vramlab's alloc-conf keys.
pub const KEYS: [&str; 3] = ["small_from_large", "release_before_grow", "lookahead"];

/// vramlab's options; all off is PyTorch's allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VramlabOptions {
    pub small_from_large: bool,
    pub release_before_grow: bool,
    pub lookahead: bool,
}

impl VramlabOptions {
    /// What the `vramlab` strategy runs: `lookahead` and `small_from_large`.
    pub fn strategy() -> Self {
        VramlabOptions {
            small_from_large: true,
            release_before_grow: false,
            lookahead: true,
        }
    }

    /// The options of `config`'s placement policy (all off unless it is
    /// vramlab's).
    pub fn of(config: &AllocatorConfig) -> Self {
        config
            .placement
            .as_deref()
            .and_then(|p| (p as &dyn Any).downcast_ref::<VramlabPlacement>())
            .map_or_else(Self::default, |p| p.options)
    }

    fn is_off(self) -> bool {
        self == Self::default()
    }

    /// The options in alloc-conf syntax, those on only.
    pub fn describe(self) -> String {
        let on = [
            self.small_from_large,
            self.release_before_grow,
            self.lookahead,
        ];
        KEYS.iter()
            .zip(on)
            .filter(|&(_, on)| on)
            .map(|(k, _)| format!("{k}:True"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The policy for an [`AllocatorConfig`]; `None` when every option is
    /// off.
    pub fn policy(self) -> Option<Arc<dyn Placement>> {
        (!self.is_off()).then(|| Arc::new(VramlabPlacement::new(self)) as Arc<dyn Placement>)
    }

    /// A hook for one allocator; `None` when every option is off.
    pub fn hook(self) -> Option<Box<dyn Placement>> {
        (!self.is_off()).then(|| Box::new(VramlabPlacement::new(self)) as Box<dyn Placement>)
    }

    fn set(&mut self, key: &str, on: bool) {
        match key {
            "small_from_large" => self.small_from_large = on,
            "release_before_grow" => self.release_before_grow = on,
            _ => self.lookahead = on,
        }
    }
}

/// The hook: the options, and with `lookahead` the history it replays.
#[derive(Debug)]
pub struct VramlabPlacement {
    options: VramlabOptions,
    history: Option<History>,
}

impl VramlabPlacement {
    pub fn new(options: VramlabOptions) -> Self {
        VramlabPlacement {
            options,
            history: options.lookahead.then(History::default),
        }
    }

    pub fn options(&self) -> VramlabOptions {
        self.options
    }
}

/// A ghost of `view` under the same options without `lookahead`: a replay
/// does not look ahead itself.
fn ghost_of(view: &dyn AllocatorView, options: VramlabOptions) -> Box<dyn Ghost> {
    let mut ghost = view.ghost();
    ghost.set_placement(
        VramlabOptions {
            lookahead: false,
            ..options
        }
        .hook(),
    );
    ghost
}

impl Placement for VramlabPlacement {
    fn describe(&self) -> String {
        self.options.describe()
    }

    fn fresh(&self) -> Box<dyn Placement> {
        Box::new(VramlabPlacement::new(self.options))
    }

    fn place(&mut self, view: &dyn AllocatorView, request: &Request) -> Option<Place> {
        let options = self.options;
        let history = self.history.as_mut()?;
        if request.pool != PoolKind::Large || !request.category.lives_for_the_run() {
            return None;
        }
        history.look_ahead(view, request, &|v| ghost_of(v, options))
    }

    fn carve_small_from_large(
        &mut self,
        view: &dyn AllocatorView,
        request: &Request,
        block: FreeBlock,
    ) -> bool {
        let options = self.options;
        if !options.small_from_large {
            return false;
        }
        match &mut self.history {
            None => true,
            Some(h) => h.carving_is_free(view, request, block, &|v| ghost_of(v, options)),
        }
    }

    fn release_before_grow(&mut self, _view: &dyn AllocatorView, _request: &Request) -> bool {
        self.options.release_before_grow
    }

    fn on_alloc(&mut self, handle: BlockHandle, request: &Request) {
        if let Some(h) = &mut self.history {
            h.alloc(handle, request.requested, request.category);
        }
    }

    fn on_free(&mut self, handle: BlockHandle) {
        if let Some(h) = &mut self.history {
            h.free(handle);
        }
    }
}

/// PyTorch's defaults plus the `vramlab` strategy's options.
pub fn config() -> AllocatorConfig {
    with_extensions(AllocatorConfig::default())
}

/// `config` plus the `vramlab` strategy's options (what `vramlab` runs
/// under `--alloc-conf`); vramlab options already set stay set.
pub fn with_extensions(config: AllocatorConfig) -> AllocatorConfig {
    let mut options = VramlabOptions::of(&config);
    options.small_from_large = true;
    options.lookahead = true;
    AllocatorConfig {
        placement: options.policy(),
        ..config
    }
}

/// Parses an alloc-conf string: PyTorch's keys (by the allocator's parser)
/// and vramlab's ([`KEYS`], `True` or `False`). An error quotes the option
/// at fault.
pub fn parse_alloc_conf(input: &str) -> Result<AllocatorConfig, LabError> {
    let mut config = AllocatorConfig::default();
    let mut options = VramlabOptions::default();
    for option in split_options(input) {
        let option = option.trim();
        let key = option.split_once(':').map(|(k, v)| (k.trim(), v.trim()));
        match key {
            Some((key, value)) if KEYS.contains(&key) => {
                let on = parse_bool(value).ok_or_else(|| LabError::OptionValue {
                    input: option.to_string(),
                    key: KEYS.into_iter().find(|&k| k == key).unwrap_or_default(),
                    value: value.to_string(),
                })?;
                options.set(key, on);
            }
            Some((key, _)) if !KNOWN_KEYS.contains(&key) => {
                let known = KNOWN_KEYS.iter().map(|k| k.to_string());
                let ours = KEYS.iter().map(|k| format!("{k} (vramlab)"));
                return Err(LabError::UnknownOption {
                    input: option.to_string(),
                    key: key.to_string(),
                    known: known.chain(ours).collect(),
                });
            }
            // PyTorch's, empty, or without a value: the allocator's to judge.
            _ => config.apply(option)?,
        }
    }
    config.placement = options.policy();
    Ok(config)
}

/// Reads `VRAMLAB_ALLOC_CONF` with [`parse_alloc_conf`], or the defaults if
/// it is unset.
pub fn alloc_conf_from_env() -> Result<AllocatorConfig, LabError> {
    match std::env::var(ALLOC_CONF_ENV) {
        Ok(s) => parse_alloc_conf(&s),
        Err(_) => Ok(AllocatorConfig::default()),
    }
}
