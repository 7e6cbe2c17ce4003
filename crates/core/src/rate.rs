//! A transfer rate limit written as users write one: `50MiB/s`, `10MB/s`, `500KiB/s`,
//! `1GiB/s` (binary and decimal units, `/s` optional).

use std::fmt;
use std::str::FromStr;

/// The accepted form, for messages.
pub const RATE_FORM: &str =
    "<number><unit>/s with unit B, KB, MB, GB (decimal) or KiB, MiB, GiB (binary), e.g. 50MiB/s";

/// The CEL rule a CRD field holding a rate is checked with (the same grammar).
pub const RATE_RULE: &str =
    "self.matches('^[0-9]+(\\\\.[0-9]+)?(B|KB|MB|GB|KiB|MiB|GiB|kB)(/s)?$')";

/// Slowest limit accepted: below this a transfer of a few megabytes takes hours, which is
/// a typo rather than a setting.
pub const MIN_BYTES_PER_SECOND: u64 = 64 * 1024;

/// Bytes per second, with the user's spelling for display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rate {
    bytes_per_second: u64,
    written: String,
}

/// Why a rate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid rate {value:?}: {problem}; expected {RATE_FORM}")]
pub struct RateError {
    pub value: String,
    pub problem: &'static str,
}

impl Rate {
    pub fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

impl FromStr for Rate {
    type Err = RateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |problem| RateError {
            value: s.chars().take(64).collect(),
            problem,
        };
        let t = s.trim();
        let t = t.strip_suffix("/s").unwrap_or(t);
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("no unit"))?;
        if split == 0 {
            return Err(err("no number"));
        }
        let (number, unit) = t.split_at(split);
        let factor: u64 = match unit {
            "B" => 1,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            _ => return Err(err("unknown unit")),
        };
        let value: f64 = number.parse().map_err(|_| err("not a number"))?;
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let bytes = (value * factor as f64) as u64;
        if bytes < MIN_BYTES_PER_SECOND {
            return Err(err("below 64KiB/s"));
        }
        Ok(Rate {
            bytes_per_second: bytes,
            written: s.trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_as_written() {
        let r: Rate = "50MiB/s".parse().unwrap();
        assert_eq!(r.bytes_per_second(), 50 << 20);
        assert_eq!(r.to_string(), "50MiB/s");
        assert_eq!(
            "10MB/s".parse::<Rate>().unwrap().bytes_per_second(),
            10_000_000
        );
        assert_eq!(
            "1.5GiB".parse::<Rate>().unwrap().bytes_per_second(),
            3 << 29
        );
        for bad in ["", "/s", "50", "50Mbit/s", "MiB/s", "1KB/s", "x5MiB/s"] {
            let e = bad.parse::<Rate>().unwrap_err().to_string();
            assert!(e.contains("expected <number><unit>/s"), "{bad}: {e}");
        }
    }
}
