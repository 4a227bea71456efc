//! Metered versions of the operators whose work grows with their operands:
//! `==`, `!=`, `<`, `<=`, `>`, `>=`, `in` and `[]`. The compile-time rewrite
//! (see `cost`) only routes an operator here when neither operand is a
//! literal: comparing with a literal costs at most the literal's size, which
//! the 10 Ki expression limit bounds, so the common `x == "H100"` keeps the
//! interpreter's fast path.

use std::cmp::Ordering;

use cel::ExecutionError;
use cel::common::ast::operators;
use cel::common::types::{CelBytes, CelList, CelMap, CelOptional, CelString, DYN_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env};

use super::semver_lib::Semver;
use crate::meter::{BUDGET, bytes_units, charge};
use crate::quantity::Quantity;

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// The names the rewrite gives each operator, and the operator it stands for.
pub const METERED_OPERATORS: [(&str, &str); 8] = [
    (operators::EQUALS, "@m_eq"),
    (operators::NOT_EQUALS, "@m_ne"),
    (operators::LESS, "@m_lt"),
    (operators::LESS_EQUALS, "@m_le"),
    (operators::GREATER, "@m_gt"),
    (operators::GREATER_EQUALS, "@m_ge"),
    (operators::IN, "@m_in"),
    (operators::INDEX, "@m_index"),
];

/// Units to walk `value` in full, counted up to `cap`: what comparing,
/// hashing or copying it may cost beyond the call itself. A scalar is free
/// (the call pays for it); a container costs one plus at least one per
/// element, so that a list of empty strings is not free to copy.
pub fn deep_units(value: &dyn Val, cap: u64) -> u64 {
    if let Some(s) = value.downcast_ref::<CelString>() {
        return bytes_units(s.inner().len());
    }
    if let Some(b) = value.downcast_ref::<CelBytes>() {
        return bytes_units(b.inner().len());
    }
    if let Some(list) = value.downcast_ref::<CelList>() {
        let mut units = 1u64;
        for element in list.inner() {
            units = units.saturating_add(deep_units(element.as_ref(), cap).max(1));
            if units > cap {
                break;
            }
        }
        return units;
    }
    if let Some(map) = value.downcast_ref::<CelMap>() {
        let mut units = 1u64;
        for element in map.inner().values() {
            units = units.saturating_add(1 + deep_units(element.as_ref(), cap));
            if units > cap {
                break;
            }
        }
        return units;
    }
    0
}

fn two<'b, 'v>(op: &str, args: Args<'b, 'v>) -> Result<(CowVal<'b, 'v>, CowVal<'b, 'v>), ExecutionError> {
    let mut args = args.into_iter();
    match (args.next(), args.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(ExecutionError::function_error(op, "expects two operands")),
    }
}

fn bool_out<'b, 'v>(b: bool) -> Out<'b, 'v> {
    Ok(crate::meter::boolean(b))
}

/// Charges the cheaper of the two operands: equality and ordering stop at
/// the end of the shorter one.
fn charge_pair(a: &dyn Val, b: &dyn Val) -> Result<(), ExecutionError> {
    charge(deep_units(a, BUDGET).min(deep_units(b, BUDGET)))
}

fn eq<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (a, b) = two(operators::EQUALS, args)?;
    charge_pair(a.as_ref(), b.as_ref())?;
    bool_out(a.equals(b.as_ref()))
}

fn ne<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (a, b) = two(operators::NOT_EQUALS, args)?;
    charge_pair(a.as_ref(), b.as_ref())?;
    bool_out(!a.equals(b.as_ref()))
}

fn compare(op: &str, args: Args<'_, '_>) -> Result<Ordering, ExecutionError> {
    let (a, b) = two(op, args)?;
    charge_pair(a.as_ref(), b.as_ref())?;
    let overload =
        || ExecutionError::no_such_overload(op, vec![a.get_type().name().to_owned(), b.get_type().name().to_owned()]);
    // Quantities and versions compare only through their functions, as in
    // Kubernetes: `<` on them is no overload.
    let library_value = |v: &dyn Val| v.downcast_ref::<Quantity>().is_some() || v.downcast_ref::<Semver>().is_some();
    if library_value(a.as_ref()) || library_value(b.as_ref()) {
        return Err(overload());
    }
    a.as_comparer().ok_or_else(overload)?.compare(b.as_ref()).map_err(|_| overload())
}

fn lt<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    bool_out(compare(operators::LESS, args)? == Ordering::Less)
}

fn le<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    bool_out(compare(operators::LESS_EQUALS, args)? != Ordering::Greater)
}

fn gt<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    bool_out(compare(operators::GREATER, args)? == Ordering::Greater)
}

fn ge<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    bool_out(compare(operators::GREATER_EQUALS, args)? != Ordering::Less)
}

fn contains<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (needle, haystack) = two("in", args)?;
    // A list is scanned element by element; a map is one hashed lookup.
    let scan = match haystack.downcast_ref::<CelList>() {
        Some(list) => list.inner().len() as u64 * deep_units(needle.as_ref(), BUDGET).max(1),
        None => deep_units(needle.as_ref(), BUDGET),
    };
    charge(1 + scan)?;
    let overload = || {
        ExecutionError::no_such_overload(
            "@in",
            vec![needle.get_type().name().to_owned(), haystack.get_type().name().to_owned()],
        )
    };
    let container = haystack.as_container().ok_or_else(overload)?;
    bool_out(container.contains(needle.as_ref()).map_err(|_| overload())?)
}

/// `operand[index]`, with the interpreter's handling of an optional operand:
/// `optional.none()` stays none, `optional.of(x)[i]` is `optional.of(x[i])`,
/// or none when `x` has no `i`.
fn index<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (operand, idx) = two(operators::INDEX, args)?;
    charge(deep_units(idx.as_ref(), BUDGET))?;
    if let Some(optional) = operand.downcast_ref::<CelOptional>() {
        let Some(inner) = optional.inner() else {
            return Ok(CowVal::owned(CelOptional::none()));
        };
        let found = inner.as_indexer().and_then(|indexer| indexer.get(idx.as_ref()).ok());
        return Ok(CowVal::owned(match found {
            Some(value) => CelOptional::of(value.into_owned()),
            None => CelOptional::none(),
        }));
    }
    let overload = || {
        ExecutionError::no_such_overload(
            operators::INDEX,
            vec![operand.get_type().name().to_owned(), idx.get_type().name().to_owned()],
        )
    };
    match operand {
        CowVal::Borrowed(value) => value.as_indexer().ok_or_else(overload)?.get(idx.as_ref()),
        CowVal::Owned(ref value) => {
            let found = value.as_indexer().ok_or_else(overload)?.get(idx.as_ref())?;
            Ok(CowVal::Owned(found.into_owned()))
        }
    }
}

/// Registers the metered operators on `env`.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let functions: [(&str, cel::common::functions::Function); 8] = [
        ("@m_eq", eq),
        ("@m_ne", ne),
        ("@m_lt", lt),
        ("@m_le", le),
        ("@m_gt", gt),
        ("@m_ge", ge),
        ("@m_in", contains),
        ("@m_index", index),
    ];
    for (name, function) in functions {
        env.add_overload(name, name, vec![DYN_TYPE, DYN_TYPE], function)?;
    }
    Ok(())
}
