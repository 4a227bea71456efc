//! Kubernetes `resource.Quantity` as a CEL value, and the apiserver's quantity
//! library (`k8s.io/apiserver/pkg/cel/library/quantity.go`): `quantity()`,
//! `isQuantity()`, `sign`, `isInteger`, `asInteger`, `asApproximateFloat`,
//! `add`, `sub`, `compareTo`, `isGreaterThan`, `isLessThan`.
//!
//! Values are held exactly as a count of nano-units in an `i128`, which is
//! what `resource.ParseQuantity` can represent: it rounds up to nano
//! precision and caps the magnitude at 2^63-1 units. Comparisons are exact
//! integer comparisons, never floating point.

use std::any::Any;
use std::cmp::Ordering;

use cel::common::traits::Comparer;
use cel::common::types::{CelDouble, CelInt, CelString, INT_TYPE, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// The CEL type of quantities (`type(q)` prints this name).
pub static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");

const NANOS_PER_UNIT: i128 = 1_000_000_000;
/// `resource.ParseQuantity` caps binary-suffixed values at max int64 units.
const MAX_NANOS: i128 = (i64::MAX as i128) * NANOS_PER_UNIT;

/// An exact quantity, in nano-units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    /// The quantity of `units` whole units.
    pub fn from_units(units: i64) -> Self {
        Quantity { nanos: i128::from(units) * NANOS_PER_UNIT }
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
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = || {
            format!(
                "{text:?} is not a valid quantity: quantities must match the regular expression \
                 '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            )
        };
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
            None => return Err(format!("{text:?} is too large: the supported range is ±1.7e29")),
        };
        Ok(Quantity { nanos: if negative { -nanos } else { nanos } })
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

    fn as_f64(&self) -> f64 {
        self.nanos as f64 / NANOS_PER_UNIT as f64
    }

    fn checked_add(&self, other: &Quantity) -> Option<Quantity> {
        self.nanos.checked_add(other.nanos).map(|nanos| Quantity { nanos })
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

impl Val for Quantity {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    /// Equal by value, as `resource.Quantity.Equal`: `1Gi == 1073741824`.
    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Quantity>().is_some_and(|o| o.nanos == self.nanos)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
        Box::new(*self)
    }

    /// Serves `isGreaterThan` / `isLessThan`, which the compile-time rewrite
    /// turns into the interpreter's native `>` / `<` (a member call costs
    /// several times more); a `<` the user writes never reaches it, see
    /// `ops_lib`.
    fn as_comparer(&self) -> Option<&dyn Comparer> {
        Some(self)
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl StaticVal for Quantity {}

impl Comparer for Quantity {
    fn compare(&self, rhs: &dyn Val) -> Result<Ordering, ExecutionError> {
        rhs.downcast_ref::<Quantity>().map(|other| self.cmp(other)).ok_or_else(|| {
            ExecutionError::no_such_member_overload(
                "isGreaterThan",
                vec![QUANTITY_TYPE.name().to_owned(), rhs.get_type().name().to_owned()],
            )
        })
    }
}

fn error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn quantity_arg<'a>(function: &str, value: Option<&'a CowVal<'_, '_>>) -> Result<&'a Quantity, ExecutionError> {
    value.and_then(|v| v.downcast_ref::<Quantity>()).ok_or_else(|| error(function, "expects a quantity"))
}

fn string_arg<'a, 'v>(function: &str, value: Option<&'a CowVal<'_, 'v>>) -> Result<&'a str, ExecutionError> {
    value
        .and_then(|v| v.downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| error(function, "expects a string"))
}

/// The right-hand operand of `add`/`sub`: a quantity, or an int of whole units.
fn operand(function: &str, value: Option<&CowVal<'_, '_>>) -> Result<Quantity, ExecutionError> {
    if let Some(q) = value.and_then(|v| v.downcast_ref::<Quantity>()) {
        return Ok(*q);
    }
    value
        .and_then(|v| v.downcast_ref::<CelInt>())
        .map(|i| Quantity::from_units(*i.inner()))
        .ok_or_else(|| error(function, "expects a quantity or an int"))
}

fn owned<'b, 'v, T: Val + 'v>(value: T) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::owned(value))
}

fn quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = string_arg("quantity", args.first())?;
    crate::cost::charge(crate::cost::bytes_units(text.len()))?;
    owned(Quantity::parse(text).map_err(|e| error("quantity", e))?)
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = string_arg("isQuantity", args.first())?;
    crate::cost::charge(crate::cost::bytes_units(text.len()))?;
    Ok(super::cost::boolean(Quantity::parse(text).is_ok()))
}

fn sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    owned(CelInt::from(quantity_arg("sign", args.first())?.sign()))
}

fn is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(super::cost::boolean(quantity_arg("isInteger", args.first())?.as_i64().is_some()))
}

fn as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = quantity_arg("asInteger", args.first())?;
    let value = q.as_i64().ok_or_else(|| error("asInteger", "cannot convert value to integer"))?;
    owned(CelInt::from(value))
}

fn as_approximate_float<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    owned(CelDouble::from(quantity_arg("asApproximateFloat", args.first())?.as_f64()))
}

fn add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let lhs = quantity_arg("add", args.first())?;
    let rhs = operand("add", args.get(1))?;
    owned(lhs.checked_add(&rhs).ok_or_else(|| error("add", "quantity overflow"))?)
}

fn sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let lhs = quantity_arg("sub", args.first())?;
    let rhs = operand("sub", args.get(1))?;
    let negated = Quantity { nanos: -rhs.nanos };
    owned(lhs.checked_add(&negated).ok_or_else(|| error("sub", "quantity overflow"))?)
}

fn compare(function: &str, args: &[CowVal<'_, '_>]) -> Result<Ordering, ExecutionError> {
    let lhs = quantity_arg(function, args.first())?;
    let rhs = quantity_arg(function, args.get(1))?;
    Ok(lhs.cmp(rhs))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let ordering = compare("compareTo", &args)?;
    owned(CelInt::from(ordering as i64))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(super::cost::boolean(compare("isGreaterThan", &args)? == Ordering::Greater))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(super::cost::boolean(compare("isLessThan", &args)? == Ordering::Less))
}

/// Registers the quantity library on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let q = || QUANTITY_TYPE.to_owned();
    env.add_type(q())?;
    env.add_overload("quantity", "string_to_quantity", vec![STRING_TYPE], quantity)?;
    env.add_overload("isQuantity", "is_quantity_string", vec![STRING_TYPE], is_quantity)?;
    // Kubernetes declares `sign` as a global function (`sign(q)`), though
    // its doc comment shows `q.sign()`; the checker refuses the method form.
    env.add_overload("sign", "quantity_sign", vec![q()], sign)?;
    env.add_member_overload("isInteger", "quantity_is_integer", q(), vec![], is_integer)?;
    env.add_member_overload("asInteger", "quantity_as_integer", q(), vec![], as_integer)?;
    env.add_member_overload("asApproximateFloat", "quantity_as_float", q(), vec![], as_approximate_float)?;
    env.add_member_overload("add", "quantity_add", q(), vec![q()], add)?;
    env.add_member_overload("add", "quantity_add_int", q(), vec![INT_TYPE], add)?;
    env.add_member_overload("sub", "quantity_sub", q(), vec![q()], sub)?;
    env.add_member_overload("sub", "quantity_sub_int", q(), vec![INT_TYPE], sub)?;
    env.add_member_overload("compareTo", "quantity_compare_to", q(), vec![q()], compare_to)?;
    env.add_member_overload("isGreaterThan", "quantity_greater_than", q(), vec![q()], is_greater_than)?;
    env.add_member_overload("isLessThan", "quantity_less_than", q(), vec![q()], is_less_than)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(text: &str) -> i128 {
        Quantity::parse(text).unwrap().nanos
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
    fn sub_nano_values_round_up_and_huge_values_are_capped() {
        assert_eq!(nanos("0.1n"), 1, "rounded up to the smallest representable value");
        assert_eq!(nanos("1.0000000001"), 1_000_000_001);
        assert_eq!(nanos("-0.1n"), -1);
        assert_eq!(nanos("99999999999Ei"), MAX_NANOS, "binary values are capped");
        assert_eq!(nanos("9223372036854775807"), MAX_NANOS, "max int64 units");
        assert_eq!(nanos("9223372036854775808"), MAX_NANOS + 1_000_000_000, "decimal values are not capped");
        assert!(Quantity::parse("1e100").unwrap_err().contains("too large"));
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
        for bad in ["", "abc", "1.2.3", "1Gb", "1e", "--1", "1 Gi", "Gi", ".", "1KiB", "1e+"] {
            let err = Quantity::parse(bad).unwrap_err();
            assert!(err.contains("regular expression"), "{bad}: {err}");
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
}
