//! Quantities as exact integers, for arithmetic on counters and capacity.
//!
//! A Kubernetes quantity is a decimal with a suffix (`80Gi`, `500m`, `1e3`).
//! We hold it as a count of nano-units in an `i128`: exact for every suffix
//! up to `Ei` (2^60 · 10^9 < 2^127), and sub-nano values round up as the
//! apiserver does. Comparisons and sums then never lose precision.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const NANO: i128 = 1_000_000_000;

/// An exact amount in nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct Amount(pub(crate) i128);

/// A quantity that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub(crate) struct BadQuantity(pub(crate) String);

impl Amount {
    pub(crate) const ZERO: Amount = Amount(0);

    pub(crate) fn parse(q: &Quantity) -> Result<Self, BadQuantity> {
        Self::parse_str(&q.0)
    }

    pub(crate) fn parse_str(q: &str) -> Result<Self, BadQuantity> {
        parse(q).ok_or_else(|| BadQuantity(q.to_owned()))
    }

    pub(crate) fn saturating_add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }

    pub(crate) fn saturating_sub(self, other: Amount) -> Amount {
        Amount(self.0.saturating_sub(other.0))
    }

    /// The whole-unit value rounded up, as `Quantity.Value()` does.
    pub(crate) fn whole_units(self) -> i128 {
        let q = self.0.div_euclid(NANO);
        if self.0.rem_euclid(NANO) == 0 { q } else { q + 1 }
    }

    pub(crate) fn from_units(units: i128) -> Option<Amount> {
        units.checked_mul(NANO).map(Amount)
    }

    /// As `resource.NewQuantity(v, BinarySI)` prints a whole, non-negative
    /// number; other values in plain decimal nano form.
    pub(crate) fn to_binary_si(self) -> Quantity {
        let units = self.whole_units();
        match u64::try_from(units) {
            Ok(u) if self.0.rem_euclid(NANO) == 0 => crate::quantity::bytes(u),
            _ => Quantity(format!("{}n", self.0)),
        }
    }
}

fn parse(s: &str) -> Option<Amount> {
    let s = s.trim();
    let (negative, rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let digits_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(digits_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    // Mantissa as an integer with `frac_part.len()` decimal places.
    let mut mantissa: i128 = 0;
    for c in int_part.chars().chain(frac_part.chars()) {
        mantissa = mantissa.checked_mul(10)?.checked_add(i128::from(c.to_digit(10)?))?;
    }
    let mut decimal_exp: i32 = -i32::try_from(frac_part.len()).ok()?;
    let mut binary_mul: i128 = 1;
    match suffix {
        "" => {}
        "n" => decimal_exp -= 9,
        "u" => decimal_exp -= 6,
        "m" => decimal_exp -= 3,
        "k" => decimal_exp += 3,
        "M" => decimal_exp += 6,
        "G" => decimal_exp += 9,
        "T" => decimal_exp += 12,
        "P" => decimal_exp += 15,
        "E" => decimal_exp += 18,
        "Ki" => binary_mul = 1 << 10,
        "Mi" => binary_mul = 1 << 20,
        "Gi" => binary_mul = 1 << 30,
        "Ti" => binary_mul = 1 << 40,
        "Pi" => binary_mul = 1 << 50,
        "Ei" => binary_mul = 1 << 60,
        other => {
            let exp = other.strip_prefix(['e', 'E'])?;
            decimal_exp += exp.parse::<i32>().ok()?;
        }
    }
    // value = mantissa * 10^decimal_exp * binary_mul, in nano-units.
    let mut nanos = mantissa.checked_mul(binary_mul)?;
    let shift = decimal_exp + 9;
    if shift >= 0 {
        nanos = nanos.checked_mul(10_i128.checked_pow(u32::try_from(shift).ok()?)?)?;
    } else {
        let div = 10_i128.checked_pow(u32::try_from(-shift).ok()?).unwrap_or(i128::MAX);
        let rounded_up = nanos % div != 0;
        nanos = nanos / div + i128::from(rounded_up);
    }
    Some(Amount(if negative { -nanos } else { nanos }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> i128 {
        Amount::parse(&Quantity(s.into())).unwrap().0
    }

    #[test]
    fn suffixes() {
        assert_eq!(a("1"), NANO);
        assert_eq!(a("80Gi"), 80 * (1 << 30) * NANO);
        assert_eq!(a("500m"), NANO / 2);
        assert_eq!(a("1.5k"), 1500 * NANO);
        assert_eq!(a("1e3"), 1000 * NANO);
        assert_eq!(a("2E"), 2_000_000_000_000_000_000 * NANO);
        assert_eq!(a("-3"), -3 * NANO);
        assert_eq!(a("0.0000000001"), 1, "sub-nano rounds up");
    }

    #[test]
    fn garbage_is_rejected() {
        for bad in ["", "Gi", "1.2.3", "1Xi", "abc", "1e"] {
            assert!(Amount::parse(&Quantity(bad.into())).is_err(), "{bad}");
        }
    }

    #[test]
    fn whole_units_round_up_and_print_binary() {
        assert_eq!(Amount(NANO + 1).whole_units(), 2);
        assert_eq!(Amount::from_units(4 << 30).unwrap().to_binary_si().0, "4Gi");
        assert_eq!(Amount::from_units(1500).unwrap().to_binary_si().0, "1500");
    }
}
