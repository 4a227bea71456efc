//! The apiserver's quantity library (`k8s.io/apiserver/pkg/cel/library/quantity.go`)
//! on [`Quantity`] as a CEL value: `quantity()`, `isQuantity()`, `sign`,
//! `isInteger`, `asInteger`, `asApproximateFloat`, `add`, `sub`,
//! `compareTo`, `isGreaterThan`, `isLessThan`.

use std::any::Any;
use std::cmp::Ordering;

use cel::common::traits::Comparer;
use cel::common::types::{CelDouble, CelInt, CelString, INT_TYPE, STRING_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

use crate::quantity::Quantity;

/// The CEL type of quantities (`type(q)` prints this name).
pub static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");

impl Val for Quantity {
    fn get_type(&self) -> &Type {
        &QUANTITY_TYPE
    }

    fn cel_type() -> &'static Type {
        &QUANTITY_TYPE
    }

    /// Equal by value, as `resource.Quantity.Equal`: `1Gi == 1073741824`.
    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<Quantity>().is_some_and(|o| o == self)
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
    crate::meter::charge(crate::meter::bytes_units(text.len()))?;
    owned(Quantity::parse(text).map_err(|e| error("quantity", e))?)
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = string_arg("isQuantity", args.first())?;
    crate::meter::charge(crate::meter::bytes_units(text.len()))?;
    Ok(crate::meter::boolean(Quantity::parse(text).is_ok()))
}

fn sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    owned(CelInt::from(quantity_arg("sign", args.first())?.sign()))
}

fn is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(crate::meter::boolean(quantity_arg("isInteger", args.first())?.as_i64().is_some()))
}

fn as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let q = quantity_arg("asInteger", args.first())?;
    let value = q.as_i64().ok_or_else(|| error("asInteger", "cannot convert value to integer"))?;
    owned(CelInt::from(value))
}

fn as_approximate_float<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    owned(CelDouble::from(quantity_arg("asApproximateFloat", args.first())?.as_approximate_f64()))
}

fn add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let lhs = quantity_arg("add", args.first())?;
    let rhs = operand("add", args.get(1))?;
    owned(lhs.checked_add(&rhs).ok_or_else(|| error("add", "quantity overflow"))?)
}

fn sub<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let lhs = quantity_arg("sub", args.first())?;
    let rhs = operand("sub", args.get(1))?;
    let negated = Quantity::from_nanos(-rhs.nanos());
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
    Ok(crate::meter::boolean(compare("isGreaterThan", &args)? == Ordering::Greater))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(crate::meter::boolean(compare("isLessThan", &args)? == Ordering::Less))
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
