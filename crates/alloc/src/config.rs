//! Allocator options in PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax, read from
//! `VRAMLAB_ALLOC_CONF` or `--alloc-conf`:
//!
//! ```text
//! max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8
//! roundup_power2_divisions:[256:1,512:2,1024:4,>:8]
//! ```
//!
//! Parsing follows `CUDAAllocatorConfig`: the same keys, the same checks (a
//! power-of-two division count, `max_split_size_mb` above 20, a garbage collection
//! threshold strictly between 0 and 1), and an error that names the key for
//! anything else, because a silently ignored typo would make every measurement lie.

use super::constants::{K_MIN_MAX_SPLIT_SIZE_MB, K_ROUNDUP_POWER2_INTERVALS};

/// The environment variable read for allocator options.
pub const ALLOC_CONF_ENV: &str = "VRAMLAB_ALLOC_CONF";

/// Keys this parser knows, listed in error messages.
const KNOWN_KEYS: &[&str] = &[
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "small_from_large (vramlab)",
    "release_before_grow (vramlab)",
    "lookahead (vramlab)",
];

/// A configuration string that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("allocator config {input:?}: {reason}")]
pub struct ConfigError {
    pub input: String,
    pub reason: String,
}

/// The caching allocator's tunables. `Default` is PyTorch's default.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks of at least this size are never split; `u64::MAX` = no limit.
    pub max_split_size: u64,
    /// Per power-of-two interval (1 MiB, 2 MiB, ... 32 GiB): round requests up to
    /// one of this many steps between powers of two; 0 or 1 = plain 512 B rounding.
    pub roundup_power2_divisions: [u64; K_ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the memory limit above which cached blocks are reclaimed
    /// before a new segment is requested; 0 = off. Needs a memory limit.
    pub garbage_collection_threshold: f64,
    /// Most bytes the allocator may reserve (PyTorch's
    /// `set_per_process_memory_fraction`); `None` = only the device's own limit.
    pub memory_limit: Option<u64>,
    /// vramlab's extension (not a PyTorch option): before asking the device
    /// for a new segment, give back the pool's whole free segments that are
    /// too small to serve the request. PyTorch keeps them until an
    /// out-of-memory; releasing them first keeps reserved memory near the
    /// live set when request sizes drift upward. Used by the `vramlab`
    /// strategy.
    pub release_before_grow: bool,
    /// vramlab's extension: a small request (≤ 1 MiB) with no free small
    /// block takes space from a free large-pool block before a new 2 MiB
    /// small segment is made.
    pub small_from_large: bool,
    /// vramlab's extension: a large block that lives for the whole run (a
    /// parameter or optimizer state, known from its category) goes where a
    /// replay of the short-lived allocations seen so far reserves least —
    /// one of the best-fitting free blocks or a new segment (see
    /// `lookahead.rs`). PyTorch puts Adam's first-step state into whatever
    /// hole fits best, often one the next step's activation needs again.
    /// With `small_from_large`, the same replay decides whether a small
    /// request may carve a large free block.
    pub lookahead: bool,
    /// PyTorch's `expandable_segments:True`: each pool has one segment of
    /// virtual address space that grows by mapping pages (2 MiB small, 20
    /// MiB large) instead of a new segment per miss. Only a simulated device
    /// can model it — wgpu has no virtual memory mapping, so a GPU refuses it.
    pub expandable_segments: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            roundup_power2_divisions: [0; K_ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            memory_limit: None,
            release_before_grow: false,
            small_from_large: false,
            lookahead: false,
            expandable_segments: false,
        }
    }
}

impl AllocatorConfig {
    /// The `vramlab` strategy: PyTorch's allocator plus the extensions the
    /// benchmark suite supports (`bench-alloc`).
    pub fn vramlab() -> Self {
        Self::default().with_vramlab_extensions()
    }

    /// These options plus the `vramlab` strategy's extensions.
    pub fn with_vramlab_extensions(self) -> Self {
        AllocatorConfig {
            small_from_large: true,
            lookahead: true,
            ..self
        }
    }

    /// Parses PyTorch-style options on top of the defaults. An empty string is
    /// the default configuration.
    pub fn parse(input: &str) -> Result<Self, ConfigError> {
        let mut cfg = AllocatorConfig::default();
        cfg.apply(input)?;
        Ok(cfg)
    }

    /// Reads `VRAMLAB_ALLOC_CONF`, or the defaults if it is unset.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var(ALLOC_CONF_ENV) {
            Ok(s) => Self::parse(&s),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Applies options on top of this configuration.
    pub fn apply(&mut self, input: &str) -> Result<(), ConfigError> {
        let err = |reason: String| ConfigError {
            input: input.to_string(),
            reason,
        };
        for option in split_options(input) {
            let option = option.trim();
            if option.is_empty() {
                continue;
            }
            let Some((key, value)) = option.split_once(':') else {
                return Err(err(format!(
                    "option {option:?} has no value; write key:value"
                )));
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "max_split_size_mb" => {
                    let mb: u64 = value.parse().map_err(|_| {
                        err(format!(
                            "max_split_size_mb wants a whole number of MiB, got {value:?}"
                        ))
                    })?;
                    if mb <= K_MIN_MAX_SPLIT_SIZE_MB {
                        return Err(err(format!(
                            "max_split_size_mb too small, must be > {K_MIN_MAX_SPLIT_SIZE_MB} (got {mb})"
                        )));
                    }
                    self.max_split_size = mb.saturating_mul(1 << 20);
                }
                "roundup_power2_divisions" => {
                    self.roundup_power2_divisions = parse_divisions(value)
                        .map_err(|r| err(format!("roundup_power2_divisions: {r}")))?;
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| {
                        err(format!(
                            "garbage_collection_threshold wants a number in (0, 1), got {value:?}"
                        ))
                    })?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(err(format!(
                            "garbage_collection_threshold must be strictly between 0.0 and 1.0 (got {t})"
                        )));
                    }
                    self.garbage_collection_threshold = t;
                }
                "small_from_large" | "release_before_grow" | "lookahead" => {
                    let on = match value {
                        "True" | "true" => true,
                        "False" | "false" => false,
                        _ => {
                            return Err(err(format!(
                                "{key}:{value} must be True or False (a vramlab extension)"
                            )))
                        }
                    };
                    match key {
                        "small_from_large" => self.small_from_large = on,
                        "lookahead" => self.lookahead = on,
                        _ => self.release_before_grow = on,
                    }
                }
                "expandable_segments" => {
                    self.expandable_segments = match value {
                        "True" | "true" => true,
                        "False" | "false" => false,
                        _ => {
                            return Err(err(format!(
                                "expandable_segments:{value} must be True or False"
                            )))
                        }
                    }
                }
                other => {
                    return Err(err(format!(
                        "unknown option {other:?}; known options: {}",
                        KNOWN_KEYS.join(", ")
                    )))
                }
            }
        }
        Ok(())
    }

    /// Divisions for a (rounded-so-far) size: PyTorch's
    /// `CUDAAllocatorConfig::roundup_power2_divisions(size)`.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log_size = 63 - size.max(1).leading_zeros() as i64;
        let interval_start = 20; // log2(1 MiB)
        let index = (log_size - interval_start).clamp(0, K_ROUNDUP_POWER2_INTERVALS as i64 - 1);
        self.roundup_power2_divisions[index as usize]
    }

    /// Renders the options back in the same syntax (for reports).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.max_split_size != u64::MAX {
            parts.push(format!("max_split_size_mb:{}", self.max_split_size >> 20));
        }
        let d = &self.roundup_power2_divisions;
        if d.iter().all(|&x| x == d[0]) {
            if d[0] != 0 {
                parts.push(format!("roundup_power2_divisions:{}", d[0]));
            }
        } else {
            let items: Vec<String> = d
                .iter()
                .enumerate()
                .map(|(i, v)| format!("{}:{}", 1u64 << i, v))
                .collect();
            parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
        }
        if self.garbage_collection_threshold > 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.small_from_large {
            parts.push("small_from_large:True".into());
        }
        if self.release_before_grow {
            parts.push("release_before_grow:True".into());
        }
        if self.lookahead {
            parts.push("lookahead:True".into());
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if parts.is_empty() {
            "(defaults)".to_string()
        } else {
            parts.join(",")
        }
    }
}

/// Splits on commas that are not inside `[...]`.
fn split_options(input: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&input[start..]);
    out
}

fn parse_power_of_two_or_zero(s: &str, what: &str) -> Result<u64, String> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{what} {s:?} is not a whole number"))?;
    if v != 0 && !v.is_power_of_two() {
        return Err(format!("{what} must be a power of 2 (got {v})"));
    }
    Ok(v)
}

/// `4` sets every interval; `[64:8,128:2,>:1]` sets intervals by their lower
/// bound in MiB, `>` meaning every interval after the last one named. As in
/// PyTorch, the first named interval also covers the ones below it.
fn parse_divisions(value: &str) -> Result<[u64; K_ROUNDUP_POWER2_INTERVALS], String> {
    let mut out = [0u64; K_ROUNDUP_POWER2_INTERVALS];
    let v = value.trim();
    if let Some(inner) = v.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| "missing closing ']'".to_string())?;
        let mut last_index: Option<usize> = None;
        for item in inner.split(',') {
            let (k, d) = item
                .split_once(':')
                .ok_or_else(|| format!("item {item:?} should be INTERVAL_MB:DIVISIONS"))?;
            let divs = parse_power_of_two_or_zero(d, "divisions")?;
            let k = k.trim();
            if k == ">" {
                let from = last_index.map(|i| i + 1).unwrap_or(0);
                for slot in out.iter_mut().skip(from) {
                    *slot = divs;
                }
            } else {
                let mb: u64 = k
                    .parse()
                    .map_err(|_| format!("interval {k:?} is not a number of MiB"))?;
                if mb == 0 || !mb.is_power_of_two() {
                    return Err(format!("interval {mb} MiB must be a power of 2"));
                }
                let index = (63 - mb.leading_zeros() as usize).min(K_ROUNDUP_POWER2_INTERVALS - 1);
                if last_index.is_none() {
                    for slot in out.iter_mut().take(index) {
                        *slot = divs;
                    }
                }
                out[index] = divs;
                last_index = Some(index);
            }
        }
        Ok(out)
    } else {
        let divs = parse_power_of_two_or_zero(v, "divisions")?;
        Ok([divs; K_ROUNDUP_POWER2_INTERVALS])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pytorch_syntax() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 128 << 20);
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert_eq!(c.garbage_collection_threshold, 0.8);
        assert_eq!(
            AllocatorConfig::parse("").unwrap(),
            AllocatorConfig::default()
        );
    }

    #[test]
    fn parses_interval_array_like_pytorch() {
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
                .unwrap();
        // Intervals up to and including 64 MiB take 8 (the first item fills below it).
        assert_eq!(c.divisions_for(84 << 20), 8);
        assert_eq!(c.divisions_for(1 << 20), 8);
        assert_eq!(c.divisions_for(200 << 20), 2);
        assert_eq!(c.divisions_for(400 << 20), 2);
        assert_eq!(c.divisions_for(5 << 30), 1);
    }

    #[test]
    fn rejects_what_pytorch_rejects() {
        for bad in [
            "foo:1,bar:2",
            "garbage_collection_threshold:1.2",
            "garbage_collection_threshold:0",
            "max_split_size_mb:2",
            "max_split_size_mb:20",
            "roundup_power2_divisions:3",
            "roundup_power2_divisions:[3:4]",
            "max_split_size_mb",
            "expandable_segments:maybe",
        ] {
            assert!(AllocatorConfig::parse(bad).is_err(), "{bad} should fail");
        }
        assert!(
            AllocatorConfig::parse("expandable_segments:True").is_ok_and(|c| c.expandable_segments)
        );
        let e = AllocatorConfig::parse("max_split_size_md:128").unwrap_err();
        assert!(e.to_string().contains("max_split_size_md"), "{e}");
    }
}
