//! Integer quantities in the canonical form the apiserver itself prints.
//!
//! The apiserver re-serializes every quantity canonically; emitting the same
//! form means what we send equals what we read back, so a publisher comparing
//! desired and actual slices sees no spurious difference.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A byte count, as `resource.NewQuantity(n, BinarySI)` prints it: the largest
/// power-of-1024 suffix that divides exactly (`80Gi`, `9856Mi`); below 1024 the
/// decimal form.
pub fn bytes(n: u64) -> Quantity {
    if n < 1024 {
        return count(n);
    }
    fold(n, 1024, &["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
}

/// A plain count, as `resource.NewQuantity(n, DecimalSI)` prints it: trailing
/// zeros folded into `k`, `M`, `G`, ... in steps of three (`7`, `1500`, `2k`).
pub fn count(n: u64) -> Quantity {
    if n == 0 {
        return Quantity("0".to_string());
    }
    fold(n, 1000, &["k", "M", "G", "T", "P", "E"])
}

/// `n` as mantissa and the largest suffix whose power of `base` divides it.
fn fold(n: u64, base: u64, suffixes: &[&str]) -> Quantity {
    let mut mantissa = n;
    let mut exponent = 0;
    while exponent < suffixes.len() && mantissa.is_multiple_of(base) {
        mantissa /= base;
        exponent += 1;
    }
    match exponent {
        0 => Quantity(n.to_string()),
        e => Quantity(format!("{mantissa}{}", suffixes[e - 1])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_the_largest_exact_binary_suffix() {
        assert_eq!(bytes(80 * 1024 * 1024 * 1024).0, "80Gi");
        assert_eq!(bytes(9856 * 1024 * 1024).0, "9856Mi");
        assert_eq!(bytes(1536).0, "1536");
        assert_eq!(bytes(1024).0, "1Ki");
        assert_eq!(bytes(1000).0, "1k", "below 1024 the apiserver prints DecimalSI");
        assert_eq!(bytes(7).0, "7");
        assert_eq!(bytes(0).0, "0");
    }

    #[test]
    fn counts_fold_thousands() {
        assert_eq!(count(7).0, "7");
        assert_eq!(count(132).0, "132");
        assert_eq!(count(2000).0, "2k");
        assert_eq!(count(1500).0, "1500");
        assert_eq!(count(3_000_000).0, "3M");
    }
}
