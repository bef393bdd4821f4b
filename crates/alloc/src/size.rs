//! Byte sizes as people write them (`2GiB`, `512MiB`, `1.5GB`, `4096`) and as
//! PyTorch prints them (`20.00 MiB`), so CLI flags and messages agree with torch.

use std::fmt;

/// A size string that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {input:?} as a size: {reason} (write e.g. 2GiB, 512MiB, 1.5GB or a plain number of bytes)")]
pub struct SizeParseError {
    pub input: String,
    pub reason: String,
}

/// Parses a byte size. Binary suffixes (KiB, MiB, GiB, TiB, PiB, EiB) are
/// powers of 1024; decimal ones (KB, MB, GB, TB, PB, EB) powers of 1000, as
/// their names say. A bare number is bytes; `B` may follow it. Past 2^62
/// bytes (4 EiB, [`MAX_BYTES`](super::constants::MAX_BYTES)) is an error.
pub fn parse_size(input: &str) -> Result<u64, SizeParseError> {
    let err = |reason: &str| SizeParseError {
        input: input.to_string(),
        reason: reason.to_string(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() && s.starts_with('-') {
        return Err(err("a size is not negative"));
    }
    if num.is_empty() {
        return Err(err("no number"));
    }
    let value: f64 = num.parse().map_err(|_| err("bad number"))?;
    let unit = unit.trim().to_ascii_lowercase();
    // Bytes come whole; `1.5` is most likely a unit left out.
    if matches!(unit.as_str(), "" | "b") && value.fract() != 0.0 {
        return Err(err("a fraction of a byte: is a unit missing?"));
    }
    let mult: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "t" => 1024.0f64.powi(4),
        // Messages print sizes up to "4 EiB", so those units read back. No
        // bare "e": it reads as an exponent (1e9), not as an exbibyte.
        "pib" | "p" => 1024.0f64.powi(5),
        "eib" => 1024.0f64.powi(6),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        "eb" => 1e18,
        other => return Err(err(&format!("unknown unit {other:?}"))),
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 {
        return Err(err("out of range"));
    }
    if bytes > super::constants::MAX_BYTES as f64 {
        return Err(err("more than 2^62 bytes (4 EiB), the most vramlab models"));
    }
    Ok(bytes.round() as u64)
}

/// PyTorch's `format_size` (CUDACachingAllocator.cpp): "1024 bytes", "1.50 KiB",
/// "20.00 MiB", "2.00 GiB". Used in out-of-memory messages.
pub fn format_size(size: u64) -> String {
    let s = size as f64;
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", s / 1024.0)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", s / 1048576.0)
    } else {
        format!("{:.2} GiB", s / 1073741824.0)
    }
}

/// Bytes in MiB (2^20), as the articles print `memory_allocated() / 1024**2`.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// Bytes shown in MiB with two decimals, the way the articles print
/// `memory_allocated() / 1024**2`; a size those decimals would show as
/// 0.00 but that is not zero keeps its own unit (`format_size`), so a small
/// block never reads as nothing.
pub struct Mib(pub u64);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = format!("{:.2}", self.0 as f64 / 1048576.0);
        if shown == "0.00" && self.0 > 0 {
            f.write_str(&format_size(self.0))
        } else {
            write!(f, "{shown} MiB")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_sizes_and_fractions_of_a_byte_say_so() {
        let reason = |s: &str| parse_size(s).unwrap_err().reason;
        assert_eq!(reason("-1"), "a size is not negative");
        assert_eq!(reason("-2GiB"), "a size is not negative");
        assert!(reason("1.5").starts_with("a fraction of a byte"));
        assert!(reason("2.5B").starts_with("a fraction of a byte"));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("1.0"), Ok(1));
    }

    #[test]
    fn mib_keeps_small_sizes_visible() {
        assert_eq!(Mib(0).to_string(), "0.00 MiB");
        assert_eq!(Mib(1000).to_string(), "1000 bytes");
        assert_eq!(Mib(5242).to_string(), "5.12 KiB");
        assert_eq!(Mib(5243).to_string(), "0.01 MiB");
        assert_eq!(Mib(3 << 20).to_string(), "3.00 MiB");
    }

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size(" 7 B ").unwrap(), 7);
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("3 parsecs")
            .unwrap_err()
            .to_string()
            .contains("parsecs"));
    }

    #[test]
    fn reads_the_units_messages_print_up_to_the_most_modelled() {
        assert_eq!(parse_size("2PiB").unwrap(), 2 << 50);
        assert_eq!(parse_size("1p").unwrap(), 1 << 50);
        assert_eq!(parse_size("4 EiB").unwrap(), 1 << 62);
        assert_eq!(parse_size("3PB").unwrap(), 3_000_000_000_000_000);
        assert_eq!(parse_size("2EB").unwrap(), 2_000_000_000_000_000_000);
        for big in ["5EiB", "5EB", "99999PiB"] {
            let e = parse_size(big).unwrap_err().to_string();
            assert!(e.contains("more than 2^62 bytes (4 EiB)"), "{big}: {e}");
        }
        assert!(parse_size("1e").is_err() && parse_size("1e9").is_err());
    }

    #[test]
    fn formats_like_pytorch() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
    }
}
