//! Kubernetes quantities (`10Gi`, `500M`) as numbers.

/// A Kubernetes quantity (`10Gi`, `500M`, `1073741824`) in bytes; `None` for a form not
/// read here (exponents, fractions of a byte).
pub fn bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    if split == 0 {
        return None;
    }
    let (number, suffix) = q.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    // Whole bytes: a limit rounds down.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let bytes = (value * factor as f64) as u64;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_read() {
        assert_eq!(bytes("1073741824"), Some(1 << 30));
        assert_eq!(bytes("10Gi"), Some(10 << 30));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("500M"), Some(500_000_000));
        for odd in ["", "Gi", "1e9", "12Qi"] {
            assert_eq!(bytes(odd), None, "{odd}");
        }
    }
}
