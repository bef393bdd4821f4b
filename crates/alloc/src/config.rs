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
//! Only PyTorch's keys: options of other placement policies are parsed by
//! whoever provides the policy (the lab's `vramlab` strategy).

use super::constants::{K_MIN_MAX_SPLIT_SIZE_MB, K_ROUNDUP_POWER2_INTERVALS};
use super::error::AllocError;
use super::placement::Placement;
use std::sync::Arc;

/// The environment variable read for allocator options.
pub const ALLOC_CONF_ENV: &str = "VRAMLAB_ALLOC_CONF";

/// The keys this parser knows (PyTorch's), listed in error messages.
pub const KNOWN_KEYS: &[&str] = &[
    "max_split_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
];

/// PyTorch's `pinned_max_register_threads()`: the most
/// `pinned_num_register_threads` it accepts.
pub const MAX_PINNED_REGISTER_THREADS: u64 = 128;

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
    /// A placement policy (placement.rs), not a PyTorch option; `None` is
    /// PyTorch's allocator. A prototype: each allocator built from this
    /// configuration gets a fresh hook of it.
    pub placement: Option<Arc<dyn Placement>>,
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
            placement: None,
            expandable_segments: false,
        }
    }
}

impl AllocatorConfig {
    /// Parses PyTorch-style options on top of the defaults. An empty string is
    /// the default configuration.
    pub fn parse(input: &str) -> Result<Self, AllocError> {
        let mut cfg = AllocatorConfig::default();
        cfg.apply(input)?;
        Ok(cfg)
    }

    /// Reads `VRAMLAB_ALLOC_CONF`, or the defaults if it is unset.
    pub fn from_env() -> Result<Self, AllocError> {
        match std::env::var(ALLOC_CONF_ENV) {
            Ok(s) => Self::parse(&s),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Applies options on top of this configuration.
    pub fn apply(&mut self, input: &str) -> Result<(), AllocError> {
        let bad = |key: &'static str, value: &str, expected: &'static str| AllocError::BadValue {
            input: input.to_string(),
            key,
            value: value.to_string(),
            expected,
        };
        for option in split_options(input) {
            let option = option.trim();
            if option.is_empty() {
                continue;
            }
            let Some((key, value)) = option.split_once(':') else {
                return Err(AllocError::MissingValue {
                    input: input.to_string(),
                    option: option.to_string(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "max_split_size_mb" => {
                    const EXPECTED: &str = "a whole number of MiB above 20";
                    let key = "max_split_size_mb";
                    let mb: u64 = value.parse().map_err(|_| bad(key, value, EXPECTED))?;
                    if mb <= K_MIN_MAX_SPLIT_SIZE_MB {
                        return Err(bad(key, value, EXPECTED));
                    }
                    self.max_split_size = mb.saturating_mul(1 << 20);
                }
                "roundup_power2_divisions" => {
                    self.roundup_power2_divisions =
                        parse_divisions(value).map_err(|(piece, expected)| {
                            bad("roundup_power2_divisions", piece, expected)
                        })?;
                }
                "garbage_collection_threshold" => {
                    let key = "garbage_collection_threshold";
                    let expected = "a number strictly between 0.0 and 1.0";
                    let t: f64 = value.parse().map_err(|_| bad(key, value, expected))?;
                    if !(t > 0.0 && t < 1.0) {
                        return Err(bad(key, value, expected));
                    }
                    self.garbage_collection_threshold = t;
                }
                "expandable_segments" => {
                    self.expandable_segments = parse_bool(value)
                        .ok_or_else(|| bad("expandable_segments", value, TRUE_OR_FALSE))?;
                }
                // Checked as PyTorch checks them, then without effect: they
                // concern locking and pinned host memory, not device memory,
                // so a pasted PYTORCH_CUDA_ALLOC_CONF replays as it ran.
                "release_lock_on_cudamalloc" | "pinned_use_cuda_host_register" => {
                    let key = if key == "release_lock_on_cudamalloc" {
                        "release_lock_on_cudamalloc"
                    } else {
                        "pinned_use_cuda_host_register"
                    };
                    parse_bool(value).ok_or_else(|| bad(key, value, TRUE_OR_FALSE))?;
                }
                "pinned_num_register_threads" => {
                    const EXPECTED: &str = "a power of 2 from 1 to 128";
                    let key = "pinned_num_register_threads";
                    let n: u64 = value.parse().map_err(|_| bad(key, value, EXPECTED))?;
                    if !n.is_power_of_two() || n > MAX_PINNED_REGISTER_THREADS {
                        return Err(bad(key, value, EXPECTED));
                    }
                }
                // The allocator is PyTorch's native one; cudaMallocAsync
                // (CUDA's stream-ordered pool) is a different allocator
                // whose placement vramlab does not model, so it is refused.
                "backend" => match value {
                    "native" => {}
                    "cudaMallocAsync" => {
                        return Err(AllocError::AsyncBackend {
                            input: input.to_string(),
                        })
                    }
                    _ => return Err(bad("backend", value, "native or cudaMallocAsync")),
                },
                other => {
                    return Err(AllocError::UnknownKey {
                        input: input.to_string(),
                        key: other.to_string(),
                        known: KNOWN_KEYS,
                    })
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
        let parts = self.parts();
        if parts.is_empty() {
            "(defaults)".to_string()
        } else {
            parts.join(",")
        }
    }

    /// [`AllocatorConfig::describe`] for use inside a sentence: `defaults`
    /// bare where no option is set.
    pub fn options_text(&self) -> String {
        let parts = self.parts();
        if parts.is_empty() {
            "defaults".to_string()
        } else {
            parts.join(",")
        }
    }

    fn parts(&self) -> Vec<String> {
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
        if let Some(p) = &self.placement {
            parts.push(p.describe());
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        parts
    }
}

/// `True` / `False`, spelt only as PyTorch spells them: its parser refuses
/// `true` ("Expected 'True' or 'False'"), so a setting that passes here
/// also passes there.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}

/// What a boolean option takes, as [`parse_bool`] reads it.
pub const TRUE_OR_FALSE: &str = "True or False, capitalised (PyTorch refuses `true`)";

/// The options of an alloc-conf string: split on commas not inside `[...]`.
pub fn split_options(input: &str) -> Vec<&str> {
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

/// A bad piece of a `roundup_power2_divisions` value, and what was expected.
type DivisionsError<'a> = (&'a str, &'static str);

fn parse_divisions_count(s: &str) -> Result<u64, DivisionsError<'_>> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| (s, "a whole number of divisions"))?;
    if v != 0 && !v.is_power_of_two() {
        return Err((s, "divisions that are 0 or a power of 2"));
    }
    Ok(v)
}

/// `4` sets every interval; `[64:8,128:2,>:1]` sets intervals by their lower
/// bound in MiB, `>` meaning the last one named and every one after it. As
/// in PyTorch, the first named interval also covers the ones below it, and
/// an interval between two named ones keeps 0.
fn parse_divisions(value: &str) -> Result<[u64; K_ROUNDUP_POWER2_INTERVALS], DivisionsError<'_>> {
    let mut out = [0u64; K_ROUNDUP_POWER2_INTERVALS];
    let v = value.trim();
    if let Some(inner) = v.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or((v, "a list closed by ']'"))?;
        let mut last_index: Option<usize> = None;
        for item in inner.split(',') {
            let (k, d) = item
                .split_once(':')
                .ok_or((item, "items of the form INTERVAL_MB:DIVISIONS"))?;
            let divs = parse_divisions_count(d)?;
            let k = k.trim();
            if k == ">" {
                // PyTorch fills from the last named interval itself (its
                // std::fill starts at last_index), overwriting that entry.
                let from = last_index.unwrap_or(0);
                for slot in out.iter_mut().skip(from) {
                    *slot = divs;
                }
            } else {
                let mb: u64 = k.parse().map_err(|_| (k, "intervals as a number of MiB"))?;
                if mb == 0 || !mb.is_power_of_two() {
                    return Err((k, "intervals that are a power of 2 MiB"));
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
        let divs = parse_divisions_count(v)?;
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

    /// Keys PyTorch accepts that do not concern device memory (locking,
    /// pinned host memory) were refused as unknown, so a real
    /// PYTORCH_CUDA_ALLOC_CONF could not be pasted; they parse and change
    /// nothing.
    #[test]
    fn accepts_pytorch_keys_without_a_device_memory_effect() {
        let pasted = "backend:native,expandable_segments:True,release_lock_on_cudamalloc:True,\
                      pinned_use_cuda_host_register:True,pinned_num_register_threads:8";
        let c = AllocatorConfig::parse(pasted).unwrap();
        assert_eq!(
            c,
            AllocatorConfig {
                expandable_segments: true,
                ..AllocatorConfig::default()
            }
        );
        for n in [1, 2, 64, 128] {
            let c = format!("pinned_num_register_threads:{n}");
            assert!(AllocatorConfig::parse(&c).is_ok(), "{c}");
        }
        let e = AllocatorConfig::parse("backend:cudaMallocAsync").unwrap_err();
        assert!(matches!(e, AllocError::AsyncBackend { .. }), "{e}");
        assert!(e.to_string().contains("native caching allocator"), "{e}");
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

    /// PyTorch's parser, read off c10/core/AllocatorConfig.cpp: `>` fills
    /// from the last named interval on, that one included; intervals
    /// skipped between named ones stay 0.
    #[test]
    fn the_rest_marker_overwrites_the_last_named_interval_as_pytorch_does() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:[64:8,256:4,>:2]").unwrap();
        assert_eq!(c.divisions_for(20 << 20), 8);
        assert_eq!(c.divisions_for(64 << 20), 8);
        assert_eq!(c.divisions_for(150 << 20), 0);
        assert_eq!(c.divisions_for(300 << 20), 2);
        assert_eq!(c.divisions_for(3 << 30), 2);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[>:4]").unwrap();
        assert!((0..40).all(|s| c.divisions_for((1u64 << s) + 1) == 4));
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
        assert!(e.to_string().contains("known options"), "{e}");
        // Other policies' options are theirs to parse.
        for key in ["lookahead", "small_from_large", "release_before_grow"] {
            let e = AllocatorConfig::parse(&format!("{key}:True")).unwrap_err();
            assert!(
                matches!(&e, AllocError::UnknownKey { key: k, .. } if k == key),
                "{e}"
            );
        }
        for bad in [
            "backend:Native",
            "backend:",
            "release_lock_on_cudamalloc:yes",
            "pinned_use_cuda_host_register:1",
            "pinned_num_register_threads:0",
            "pinned_num_register_threads:3",
            "pinned_num_register_threads:256",
            "pinned_num_register_threads:-2",
        ] {
            assert!(AllocatorConfig::parse(bad).is_err(), "{bad} should fail");
        }
        let e = AllocatorConfig::parse("roundup_power2_divisions:[1:2,4:3]").unwrap_err();
        assert_eq!(
            e.to_string(),
            "allocator config \"roundup_power2_divisions:[1:2,4:3]\": roundup_power2_divisions wants divisions that are 0 or a power of 2, got \"3\""
        );
    }
}
