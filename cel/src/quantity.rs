//! Kubernetes' `resource.Quantity`, exact: parsed as
//! `resource.ParseQuantity` parses (`80Gi`, `500m`, `1e3`) and printed as
//! the apiserver prints (`80Gi`, `9856Mi`, `2k`).
//!
//! Values are held exactly as a count of nano-units in an `i128`, which is
//! what `resource.ParseQuantity` can represent: it rounds up to nano
//! precision and caps the magnitude of binary-suffixed values at 2^63-1
//! units. Comparisons and sums are exact integer arithmetic, never floating
//! point. The CEL library's `quantity()` values are this type (see
//! `quantity_lib`), and so are the allocator's counters and capacities.
//!
//! The apiserver re-serializes every quantity canonically; printing the same
//! form ([`bytes`], [`count`], [`Quantity::to_binary_si`]) means what a
//! driver sends equals what it reads back, so a publisher comparing desired
//! and actual objects sees no spurious difference.

use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

const NANOS_PER_UNIT: i128 = 1_000_000_000;
/// `resource.ParseQuantity` caps binary-suffixed values at max int64 units.
const MAX_NANOS: i128 = (i64::MAX as i128) * NANOS_PER_UNIT;

/// An exact quantity, in nano-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

/// Why a text is not a quantity, in the apiserver's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "{0:?} is not a valid quantity: quantities must match the regular expression \
         '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Invalid(String),
    /// A decimal value beyond `i128` nano-units, which Kubernetes keeps as
    /// a big decimal.
    #[error("{0:?} is too large: the supported range is ±1.7e29")]
    TooLarge(String),
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { nanos: 0 };

    /// The quantity of `units` whole units.
    pub fn from_units(units: i64) -> Self {
        Quantity { nanos: i128::from(units) * NANOS_PER_UNIT }
    }

    /// The quantity of `units` whole units, if it fits.
    pub fn checked_from_units(units: i128) -> Option<Self> {
        units.checked_mul(NANOS_PER_UNIT).map(Quantity::from_nanos)
    }

    /// The quantity of `nanos` nano-units.
    pub fn from_nanos(nanos: i128) -> Self {
        Quantity { nanos }
    }

    /// The value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// Parses a quantity the way `resource.ParseQuantity` does: an optional
    /// sign, digits with an optional fraction, then a binary suffix (`Ki`..`Ei`),
    /// a decimal one (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or an
    /// exponent (`e3`, `E-2`). Values are rounded up to nano precision;
    /// binary-suffixed ones are capped at 2^63-1 units.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let invalid = || QuantityError::Invalid(text.to_owned());
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, text.get(1..).unwrap_or_default()),
            Some(b'+') => (false, text.get(1..).unwrap_or_default()),
            _ => (false, text),
        };
        let number_len = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        let (number, suffix) = rest.split_at(number_len);
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(invalid());
        }
        let (binary_power, decimal_exp) = parse_suffix(suffix).ok_or_else(invalid)?;
        // `ParseQuantity` caps only binary-suffixed values at 2^63-1 units;
        // others keep their size (and then do not fit `asInteger`).
        let nanos = match scaled_nanos(int_part, frac_part, decimal_exp, binary_power) {
            Some(n) if binary_power > 0 => n.min(MAX_NANOS),
            Some(n) => n,
            None if binary_power > 0 => MAX_NANOS,
            None => return Err(QuantityError::TooLarge(text.to_owned())),
        };
        Ok(Quantity { nanos: if negative { -nanos } else { nanos } })
    }

    /// The quantity a field of an API object holds, read as the apiserver
    /// decodes it (`Quantity.UnmarshalJSON`): white space around the text
    /// is dropped, then it is [parsed](Quantity::parse).
    pub fn decode(text: &str) -> Result<Self, QuantityError> {
        Self::parse(text.trim())
    }

    /// `-1`, `0` or `1`.
    pub fn sign(&self) -> i64 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    /// The value as an int64, if it is a whole number that fits.
    pub fn as_i64(&self) -> Option<i64> {
        if self.nanos % NANOS_PER_UNIT != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANOS_PER_UNIT).ok()
    }

    /// The whole-unit value rounded up, as `Quantity.Value()` does.
    pub fn whole_units(&self) -> i128 {
        let q = self.nanos.div_euclid(NANOS_PER_UNIT);
        if self.nanos.rem_euclid(NANOS_PER_UNIT) == 0 { q } else { q + 1 }
    }

    /// The value as the nearest float (`AsApproximateFloat64`).
    pub fn as_approximate_f64(&self) -> f64 {
        self.nanos as f64 / NANOS_PER_UNIT as f64
    }

    pub fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        self.nanos.checked_add(other.nanos).map(Quantity::from_nanos)
    }

    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity { nanos: self.nanos.saturating_add(other.nanos) }
    }

    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity { nanos: self.nanos.saturating_sub(other.nanos) }
    }

    /// As `resource.NewQuantity(v, BinarySI)` prints a whole, non-negative
    /// number ([`bytes`]); other values in plain decimal nano form.
    pub fn to_binary_si(self) -> ApiQuantity {
        let units = self.whole_units();
        match u64::try_from(units) {
            Ok(u) if self.nanos.rem_euclid(NANOS_PER_UNIT) == 0 => bytes(u),
            _ => ApiQuantity(format!("{}n", self.nanos)),
        }
    }
}

/// A quantity field of an API object, as the apiserver decodes it
/// ([`Quantity::decode`]).
impl TryFrom<&ApiQuantity> for Quantity {
    type Error = QuantityError;

    fn try_from(q: &ApiQuantity) -> Result<Self, QuantityError> {
        Quantity::decode(&q.0)
    }
}

/// `(binary power of 1024, decimal exponent)` of a suffix.
fn parse_suffix(suffix: &str) -> Option<(u32, i64)> {
    let known = match suffix {
        "" => Some((0, 0)),
        "Ki" => Some((1, 0)),
        "Mi" => Some((2, 0)),
        "Gi" => Some((3, 0)),
        "Ti" => Some((4, 0)),
        "Pi" => Some((5, 0)),
        "Ei" => Some((6, 0)),
        "n" => Some((0, -9)),
        "u" => Some((0, -6)),
        "m" => Some((0, -3)),
        "k" => Some((0, 3)),
        "M" => Some((0, 6)),
        "G" => Some((0, 9)),
        "T" => Some((0, 12)),
        "P" => Some((0, 15)),
        "E" => Some((0, 18)),
        _ => None,
    };
    if known.is_some() {
        return known;
    }
    let exponent = suffix.strip_prefix('e').or_else(|| suffix.strip_prefix('E'))?;
    let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Beyond ±10^6 the value is capped or rounded the same way anyway.
    let exp = exponent.parse::<i64>().unwrap_or(if exponent.starts_with('-') { -1_000_000 } else { 1_000_000 });
    Some((0, exp.clamp(-1_000_000, 1_000_000)))
}

/// `int_part.frac_part × 10^decimal_exp × 1024^binary_power` in nano-units,
/// rounded up (away from zero) to an integer; `None` beyond `i128`. Works
/// digit by digit, without allocating.
fn scaled_nanos(int_part: &str, frac_part: &str, decimal_exp: i64, binary_power: u32) -> Option<i128> {
    // value = D × 10^shift nano-units, D being all the digits as one integer.
    let shift = decimal_exp + 9 - frac_part.len() as i64;
    let all = || int_part.bytes().chain(frac_part.bytes());
    let leading_zeros = all().take_while(|b| *b == b'0').count();
    let count = int_part.len() + frac_part.len();
    // Significant digits that stay before the point.
    let keep = ((count as i64 + shift).max(0) as usize).saturating_sub(leading_zeros);
    let mut value: i128 = 0;
    let mut cut_nonzero = false;
    for (i, b) in all().skip(leading_zeros).enumerate() {
        if i < keep {
            value = value.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
        } else if b != b'0' {
            cut_nonzero = true;
        }
    }
    if value != 0 && shift > 0 {
        // Overflows within ~38 steps, so a huge exponent ends quickly.
        for _ in 0..shift {
            value = value.checked_mul(10)?;
        }
    }
    if cut_nonzero {
        value += 1;
    }
    for _ in 0..binary_power {
        value = value.checked_mul(1024)?;
    }
    Some(value)
}

/// A byte count, as `resource.NewQuantity(n, BinarySI)` prints it: the largest
/// power-of-1024 suffix that divides exactly (`80Gi`, `9856Mi`); below 1024 the
/// decimal form.
pub fn bytes(n: u64) -> ApiQuantity {
    if n < 1024 {
        return count(n);
    }
    fold(n, 1024, &["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
}

/// A plain count, as `resource.NewQuantity(n, DecimalSI)` prints it: trailing
/// zeros folded into `k`, `M`, `G`, ... in steps of three (`7`, `1500`, `2k`).
pub fn count(n: u64) -> ApiQuantity {
    if n == 0 {
        return ApiQuantity("0".to_string());
    }
    fold(n, 1000, &["k", "M", "G", "T", "P", "E"])
}

/// `n` as mantissa and the largest suffix whose power of `base` divides it.
fn fold(n: u64, base: u64, suffixes: &[&str]) -> ApiQuantity {
    let mut mantissa = n;
    let mut exponent = 0;
    while exponent < suffixes.len() && mantissa.is_multiple_of(base) {
        mantissa /= base;
        exponent += 1;
    }
    match exponent {
        0 => ApiQuantity(n.to_string()),
        e => ApiQuantity(format!("{mantissa}{}", suffixes[e - 1])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(text: &str) -> i128 {
        Quantity::parse(text).unwrap().nanos
    }

    /// As the allocator reads a field of a slice or claim.
    fn decoded(s: &str) -> i128 {
        Quantity::try_from(&ApiQuantity(s.into())).unwrap().nanos
    }

    #[test]
    fn suffixes_and_exponents_scale_exactly() {
        assert_eq!(nanos("1"), 1_000_000_000);
        assert_eq!(nanos("1Ki"), 1024 * 1_000_000_000);
        assert_eq!(nanos("40Gi"), 40 * (1i128 << 30) * 1_000_000_000);
        assert_eq!(nanos("1k"), nanos("1000"));
        assert_eq!(nanos("1e3"), nanos("1k"));
        assert_eq!(nanos("1E-3"), nanos("1m"));
        assert_eq!(nanos("500m"), 500_000_000);
        assert_eq!(nanos("1.5Gi"), nanos("1536Mi"));
        assert_eq!(nanos("-2k"), -2_000_000_000_000);
        assert_eq!(nanos("+.5"), 500_000_000);
        assert_eq!(nanos("0"), 0);
        assert_eq!(nanos("1n"), 1);
    }

    #[test]
    fn fields_decode_with_the_same_suffixes() {
        assert_eq!(decoded("1"), NANOS_PER_UNIT);
        assert_eq!(decoded("80Gi"), 80 * (1 << 30) * NANOS_PER_UNIT);
        assert_eq!(decoded("500m"), NANOS_PER_UNIT / 2);
        assert_eq!(decoded("1.5k"), 1500 * NANOS_PER_UNIT);
        assert_eq!(decoded("1e3"), 1000 * NANOS_PER_UNIT);
        assert_eq!(decoded("2E"), 2_000_000_000_000_000_000 * NANOS_PER_UNIT);
        assert_eq!(decoded("-3"), -3 * NANOS_PER_UNIT);
        assert_eq!(decoded("0.0000000001"), 1, "sub-nano rounds up");
        assert_eq!(decoded(" 4Gi "), 4 * (1 << 30) * NANOS_PER_UNIT, "white space around is dropped");
    }

    #[test]
    fn sub_nano_values_round_up_and_huge_values_are_capped() {
        assert_eq!(nanos("0.1n"), 1, "rounded up to the smallest representable value");
        assert_eq!(nanos("1.0000000001"), 1_000_000_001);
        assert_eq!(nanos("-0.1n"), -1);
        assert_eq!(nanos("99999999999Ei"), MAX_NANOS, "binary values are capped");
        assert_eq!(nanos("9223372036854775807"), MAX_NANOS, "max int64 units");
        assert_eq!(nanos("9223372036854775808"), MAX_NANOS + 1_000_000_000, "decimal values are not capped");
        assert!(Quantity::parse("1e100").unwrap_err().to_string().contains("too large"));
        assert!(Quantity::parse("9999999999999999999999999999999999999G").is_err());
        assert_eq!(nanos("1e-10"), 1);
        assert_eq!(nanos("100e-11"), 1, "exactly one nano-unit");
        assert_eq!(nanos("110e-11"), 2, "1.1 nano-units round up");
        assert_eq!(nanos("00012"), 12_000_000_000);
        assert_eq!(nanos("0.000"), 0);
        assert_eq!(nanos("1.50Gi"), nanos("1536Mi"));
        assert_eq!(nanos("0.5Ki"), 512_000_000_000);
    }

    #[test]
    fn malformed_quantities_are_rejected() {
        for bad in ["", "abc", "1.2.3", "1Gb", "1e", "--1", "1 Gi", "Gi", ".", "1KiB", "1e+", "1Xi"] {
            let err = Quantity::parse(bad).unwrap_err().to_string();
            assert!(err.contains("regular expression"), "{bad}: {err}");
        }
        for bad in ["", "Gi", "1.2.3", "1Xi", "abc", "1e"] {
            assert!(Quantity::try_from(&ApiQuantity(bad.into())).is_err(), "{bad}");
        }
    }

    #[test]
    fn integers_are_whole_values_that_fit_int64() {
        assert_eq!(Quantity::parse("2k").unwrap().as_i64(), Some(2000));
        assert_eq!(Quantity::parse("1500m").unwrap().as_i64(), None);
        assert_eq!(Quantity::parse("8Ei").unwrap().as_i64(), Some(i64::MAX), "capped");
        assert_eq!(Quantity::parse("50000000G").unwrap().as_i64(), Some(50_000_000_000_000_000));
        assert_eq!(Quantity::parse("1e19").unwrap().as_i64(), None, "beyond int64");
    }

    #[test]
    fn whole_units_round_up_and_print_binary() {
        assert_eq!(Quantity::from_nanos(NANOS_PER_UNIT + 1).whole_units(), 2);
        assert_eq!(Quantity::checked_from_units(4 << 30).unwrap().to_binary_si().0, "4Gi");
        assert_eq!(Quantity::checked_from_units(1500).unwrap().to_binary_si().0, "1500");
    }

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
