//! The list functions of the Kubernetes base environment: the apiserver's
//! lists library (`isSorted`, `sum`, `min`, `max`, `indexOf`, `lastIndexOf`),
//! cel-go's `sets` extension (`sets.contains`, `sets.equivalent`,
//! `sets.intersects`), the regex library's `find` / `findAll`, and DRA's
//! `includes` for list-typed attributes (`x.includes(v)`: membership for a
//! list, equality for a scalar). Each charges the meter for the elements it
//! visits.

use std::cmp::Ordering;

use cel::ParseError;
use cel::common::ast::{CallExpr, ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::types::{
    CelDouble, CelInt, CelList, CelOptional, CelString, CelUInt, DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE,
};
use cel::common::value::{CowVal, Val};
use cel::parser::{Macro, MacroExprHelper};
use cel::{DeclarationError, Env, ExecutionError};

use super::ops_lib::deep_units;
use crate::meter::{bytes_units, charge, check_list_len};

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;
type Elements<'a, 'v> = &'a [Box<dyn Val + 'v>];

/// `ResourceSliceMaxAttributeValuesPerDevice`: 1.36's DRA `includes` stops
/// with an error at this element of a longer list.
const MAX_INCLUDES_LIST: usize = 48;

/// Whether `includes` refuses long lists: 1.36's DRA function does (past
/// element 48, when the value was not found before); 1.37's lists library
/// function does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludesLimit {
    StopsAt48,
    Unlimited,
}

impl IncludesLimit {
    pub fn for_environment(environment: &crate::environment::CelEnvironment) -> Self {
        if environment.minor >= 37 { IncludesLimit::Unlimited } else { IncludesLimit::StopsAt48 }
    }
}

fn error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn list_at<'a, 'v>(
    function: &str,
    args: &'a [CowVal<'_, 'v>],
    i: usize,
) -> Result<&'a [Box<dyn Val + 'v>], ExecutionError> {
    args.get(i)
        .and_then(|v| v.downcast_ref::<CelList>())
        .map(|l| l.inner())
        .ok_or_else(|| error(function, format!("argument {i} must be a list")))
}

fn arg<'a, 'b, 'v>(function: &str, args: &'a [CowVal<'b, 'v>], i: usize) -> Result<&'a CowVal<'b, 'v>, ExecutionError> {
    args.get(i).ok_or_else(|| error(function, format!("missing argument {i}")))
}

fn cmp(function: &str, a: &dyn Val, b: &dyn Val) -> Result<Ordering, ExecutionError> {
    a.as_comparer()
        .ok_or_else(|| error(function, format!("{} values cannot be ordered", a.get_type().name())))?
        .compare(b)
        .map_err(|_| error(function, format!("cannot compare {} with {}", a.get_type().name(), b.get_type().name())))
}

/// `x.includes(v)`: membership for a list, equality for a scalar.
fn includes<'b, 'v>(args: Args<'b, 'v>, limit: IncludesLimit) -> Out<'b, 'v> {
    let target = arg("includes", &args, 0)?;
    let value = arg("includes", &args, 1)?;
    if let Some(list) = target.downcast_ref::<CelList>() {
        for (i, element) in list.inner().iter().enumerate() {
            if limit == IncludesLimit::StopsAt48 && i >= MAX_INCLUDES_LIST {
                return Err(error(
                    "includes",
                    format!("'includes' function cannot be applied to lists longer than {MAX_INCLUDES_LIST} values"),
                ));
            }
            charge(1)?;
            if element.equals(value.as_ref()) {
                return Ok(crate::meter::boolean(true));
            }
        }
        charge(1)?;
        return Ok(crate::meter::boolean(false));
    }
    charge(1)?;
    Ok(crate::meter::boolean(target.equals(value.as_ref())))
}

fn includes_stopping_at_48<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    includes(args, IncludesLimit::StopsAt48)
}

fn includes_unlimited<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    includes(args, IncludesLimit::Unlimited)
}

fn is_sorted<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("isSorted", &args, 0)?;
    charge(1 + list.len() as u64)?;
    for pair in list.windows(2) {
        if let [a, b] = pair
            && cmp("isSorted", a.as_ref(), b.as_ref())? == Ordering::Greater
        {
            return Ok(crate::meter::boolean(false));
        }
    }
    Ok(crate::meter::boolean(true))
}

fn sum<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("sum", &args, 0)?;
    charge(1 + list.len() as u64)?;
    let overflow = || error("sum", "integer overflow");
    let Some(first) = list.first() else {
        return Ok(CowVal::owned(CelInt::from(0)));
    };
    if first.downcast_ref::<CelDouble>().is_some() {
        let mut total = 0.0;
        for e in list {
            total +=
                e.downcast_ref::<CelDouble>().map(|d| *d.inner()).ok_or_else(|| error("sum", "mixed element types"))?;
        }
        return Ok(CowVal::owned(CelDouble::from(total)));
    }
    if first.downcast_ref::<CelUInt>().is_some() {
        let mut total: u64 = 0;
        for e in list {
            let v =
                e.downcast_ref::<CelUInt>().map(|u| *u.inner()).ok_or_else(|| error("sum", "mixed element types"))?;
            total = total.checked_add(v).ok_or_else(overflow)?;
        }
        return Ok(CowVal::owned(CelUInt::from(total)));
    }
    let mut total: i64 = 0;
    for e in list {
        let v = e
            .downcast_ref::<CelInt>()
            .map(|i| *i.inner())
            .ok_or_else(|| error("sum", format!("cannot sum {} values", e.get_type().name())))?;
        total = total.checked_add(v).ok_or_else(overflow)?;
    }
    Ok(CowVal::owned(CelInt::from(total)))
}

fn extreme<'b, 'v>(function: &str, args: &[CowVal<'b, 'v>], keep: Ordering) -> Out<'b, 'v> {
    let list = list_at(function, args, 0)?;
    charge(1 + list.len() as u64)?;
    let mut best = list.first().ok_or_else(|| error(function, "list is empty"))?;
    for e in list {
        if cmp(function, e.as_ref(), best.as_ref())? == keep {
            best = e;
        }
    }
    Ok(CowVal::Owned(best.clone()))
}

fn min<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    extreme("min", &args, Ordering::Less)
}

fn max<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    extreme("max", &args, Ordering::Greater)
}

fn position<'b, 'v>(function: &str, args: &[CowVal<'b, 'v>], last: bool) -> Out<'b, 'v> {
    let list = list_at(function, args, 0)?;
    let value = arg(function, args, 1)?;
    charge(1 + list.len() as u64 * deep_units(value.as_ref(), 1 << 20))?;
    let found = if last {
        list.iter().rposition(|e| e.equals(value.as_ref()))
    } else {
        list.iter().position(|e| e.equals(value.as_ref()))
    };
    Ok(CowVal::owned(CelInt::from(found.map_or(-1, |i| i as i64))))
}

fn index_of<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    position("indexOf", &args, false)
}

fn last_index_of<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    position("lastIndexOf", &args, true)
}

/// Charges for comparing every element of `a` with every element of `b`.
fn pairs<'a, 'v>(
    function: &str,
    args: &'a [CowVal<'_, 'v>],
) -> Result<(Elements<'a, 'v>, Elements<'a, 'v>), ExecutionError> {
    let a = list_at(function, args, 0)?;
    let b = list_at(function, args, 1)?;
    charge(1 + (a.len() as u64).saturating_mul(b.len() as u64))?;
    Ok((a, b))
}

fn sets_contains<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (a, b) = pairs("sets.contains", &args)?;
    Ok(crate::meter::boolean(b.iter().all(|x| a.iter().any(|y| y.equals(x.as_ref())))))
}

fn sets_equivalent<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (a, b) = pairs("sets.equivalent", &args)?;
    let within =
        |x: &[Box<dyn Val + 'v>], y: &[Box<dyn Val + 'v>]| x.iter().all(|e| y.iter().any(|f| f.equals(e.as_ref())));
    Ok(crate::meter::boolean(within(a, b) && within(b, a)))
}

fn sets_intersects<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (a, b) = pairs("sets.intersects", &args)?;
    Ok(crate::meter::boolean(a.iter().any(|x| b.iter().any(|y| y.equals(x.as_ref())))))
}

fn regex_args<'a>(function: &str, args: &'a [CowVal<'_, '_>]) -> Result<(&'a str, &'a str), ExecutionError> {
    let text = args.first().and_then(|v| v.downcast_ref::<CelString>()).map(|s| s.inner());
    let pattern = args.get(1).and_then(|v| v.downcast_ref::<CelString>()).map(|s| s.inner());
    match (text, pattern) {
        (Some(t), Some(p)) => {
            charge(bytes_units(t.len()) + bytes_units(p.len()))?;
            Ok((t, p))
        }
        _ => Err(error(function, "expects a string and a pattern")),
    }
}

fn find<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (text, pattern) = regex_args("find", &args)?;
    let re = super::strings_lib::cached_regex(pattern)?;
    let found = re.find(text).map(|m| m.as_str().to_owned()).unwrap_or_default();
    Ok(CowVal::owned(CelString::from(found)))
}

fn find_all<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let (text, pattern) = regex_args("findAll", &args)?;
    let limit = match args.get(2) {
        Some(n) => {
            n.downcast_ref::<CelInt>().map(|i| *i.inner()).ok_or_else(|| error("findAll", "limit must be an int"))?
        }
        None => -1,
    };
    let re = super::strings_lib::cached_regex(pattern)?;
    let take = if limit < 0 { usize::MAX } else { limit as usize };
    let found: Vec<Box<dyn Val>> = re
        .find_iter(text)
        .take(take)
        .map(|m| Box::new(CelString::from(m.as_str().to_owned())) as Box<dyn Val>)
        .collect();
    check_list_len("findAll", found.len())?;
    charge(1 + found.len() as u64)?;
    Ok(CowVal::owned(CelList::from(found)))
}

/// A new list of (clones of) `elements`, within the length limit.
fn new_list<'b, 'v>(function: &str, elements: Vec<Box<dyn Val + 'v>>) -> Out<'b, 'v> {
    check_list_len(function, elements.len())?;
    Ok(CowVal::owned(CelList::from(elements)))
}

fn cloned<'v>(elements: &[Box<dyn Val + 'v>]) -> Vec<Box<dyn Val + 'v>> {
    elements.iter().map(|e| e.clone_as_boxed()).collect()
}

/// cel-go lists v3 `sort()`: comparable elements of one type, ascending.
fn sort<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("sort", &args, 0)?;
    let order = sorted_order("sort", list)?;
    new_list("sort", order.into_iter().map(|i| list[i].clone_as_boxed()).collect())
}

/// `@sortByAssociatedKeys(keys)`, which the `sortBy` macro calls: the list
/// ordered by the key computed for each element (stable, as cel-go's).
fn sort_by_keys<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("sortBy", &args, 0)?;
    let keys = list_at("sortBy", &args, 1)?;
    if list.len() != keys.len() {
        return Err(error("sortBy", "the key list has a different length"));
    }
    let order = sorted_order("sortBy", keys)?;
    new_list("sortBy", order.into_iter().map(|i| list[i].clone_as_boxed()).collect())
}

/// The indices of `keys` in ascending (stable) order, charged as cel-go
/// charges a sort; `sort` and `sortBy` both refuse keys of mixed types.
fn sorted_order(function: &str, keys: &[Box<dyn Val + '_>]) -> Result<Vec<usize>, ExecutionError> {
    let n = keys.len() as u64;
    charge(1 + n.saturating_mul(64 - n.leading_zeros() as u64))?;
    if let Some(first) = keys.first() {
        let ty = first.get_type();
        if let Some(other) = keys.iter().find(|e| e.get_type() != ty) {
            return Err(error(
                function,
                format!("list elements must have the same type: {} and {}", ty.name(), other.get_type().name()),
            ));
        }
    }
    let mut order: Vec<usize> = (0..keys.len()).collect();
    let mut failure = None;
    order.sort_by(|&a, &b| match cmp(function, keys[a].as_ref(), keys[b].as_ref()) {
        Ok(o) => o,
        Err(e) => {
            failure.get_or_insert(e);
            Ordering::Equal
        }
    });
    match failure {
        Some(e) => Err(e),
        None => Ok(order),
    }
}

/// `first()` / `last()`: the end element as an optional (cel-go's optional
/// library, version 2).
fn first<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("first", &args, 0)?;
    Ok(CowVal::owned(list.first().map_or_else(CelOptional::none, |e| CelOptional::of(e.clone_as_boxed()))))
}

fn last<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("last", &args, 0)?;
    Ok(CowVal::owned(list.last().map_or_else(CelOptional::none, |e| CelOptional::of(e.clone_as_boxed()))))
}

/// `optional.unwrap(list)` / `list.unwrapOpt()`: the values of the
/// optionals that have one.
fn unwrap<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("optional.unwrap", &args, 0)?;
    charge(list.len() as u64)?;
    let mut out = Vec::new();
    for element in list {
        let optional = element
            .downcast_ref::<CelOptional>()
            .ok_or_else(|| error("optional.unwrap", "list elements must be optionals"))?;
        if let Some(value) = optional.inner() {
            out.push(value.clone_as_boxed());
        }
    }
    new_list("optional.unwrap", out)
}

/// `distinct()`: the first occurrence of each value, in order.
fn distinct<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("distinct", &args, 0)?;
    let n = list.len() as u64;
    charge(1 + n.saturating_mul(n))?;
    let mut out: Vec<Box<dyn Val + 'v>> = Vec::new();
    for e in list {
        if !out.iter().any(|o| o.equals(e.as_ref())) {
            out.push(e.clone_as_boxed());
        }
    }
    new_list("distinct", out)
}

/// `flatten()` one level, `flatten(depth)` that many.
fn flatten<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("flatten", &args, 0)?;
    let depth = match args.get(1) {
        Some(d) => *d.downcast_ref::<CelInt>().ok_or_else(|| error("flatten", "depth must be an int"))?.inner(),
        None => 1,
    };
    if depth < 0 {
        return Err(error("flatten", "level must be non-negative"));
    }
    fn walk<'v>(
        elements: &[Box<dyn Val + 'v>],
        depth: i64,
        out: &mut Vec<Box<dyn Val + 'v>>,
    ) -> Result<(), ExecutionError> {
        for e in elements {
            match e.downcast_ref::<CelList>() {
                Some(inner) if depth > 0 => walk(inner.inner(), depth - 1, out)?,
                _ => {
                    charge(1)?;
                    out.push(e.clone_as_boxed());
                    check_list_len("flatten", out.len())?;
                }
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(list, depth, &mut out)?;
    new_list("flatten", out)
}

/// `slice(start, end)`: elements `start..end`.
fn slice<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("slice", &args, 0)?;
    let int = |i: usize| -> Result<i64, ExecutionError> {
        args.get(i)
            .and_then(|v| v.downcast_ref::<CelInt>())
            .map(|v| *v.inner())
            .ok_or_else(|| error("slice", "start and end must be ints"))
    };
    let (start, end) = (int(1)?, int(2)?);
    if start < 0 || end < 0 {
        return Err(error("slice", format!("cannot slice({start}, {end}), negative indexes not supported")));
    }
    if start > end {
        return Err(error(
            "slice",
            format!("cannot slice({start}, {end}), start index must be less than or equal to end index"),
        ));
    }
    if end as u64 > list.len() as u64 {
        return Err(error("slice", format!("cannot slice({start}, {end}), list is length {}", list.len())));
    }
    let part = list.get(start as usize..end as usize).unwrap_or_default();
    charge(1 + part.len() as u64)?;
    new_list("slice", cloned(part))
}

/// `reverse()` of a list (strings have none in the extension version
/// Kubernetes pins).
fn reverse<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let list = list_at("reverse", &args, 0)?;
    charge(1 + list.len() as u64)?;
    new_list("reverse", list.iter().rev().map(|e| e.clone_as_boxed()).collect())
}

/// `lists.range(n)`: `[0, 1, ..., n-1]` (empty for n ≤ 0).
fn range<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let n = args
        .first()
        .and_then(|v| v.downcast_ref::<CelInt>())
        .map(|v| *v.inner())
        .ok_or_else(|| error("lists.range", "argument must be an int"))?;
    let n = n.max(0);
    check_list_len("lists.range", usize::try_from(n).unwrap_or(usize::MAX))?;
    charge(1 + n as u64)?;
    new_list("lists.range", (0..n).map(|i| Box::new(CelInt::from(i)) as Box<dyn Val>).collect())
}

/// Registers the list functions on `env`.
pub fn register(env: &mut Env, includes_limit: IncludesLimit) -> Result<(), DeclarationError> {
    let includes = match includes_limit {
        IncludesLimit::StopsAt48 => includes_stopping_at_48,
        IncludesLimit::Unlimited => includes_unlimited,
    };
    env.add_member_overload("includes", "dyn_includes", DYN_TYPE, vec![DYN_TYPE], includes)?;
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], max)?;
    env.add_member_overload("indexOf", "list_index_of", LIST_TYPE, vec![DYN_TYPE], index_of)?;
    env.add_member_overload("lastIndexOf", "list_last_index_of", LIST_TYPE, vec![DYN_TYPE], last_index_of)?;
    // cel-go's lists extension, version 3 (what Kubernetes enables), but
    // `sortBy`, a macro.
    env.add_member_overload("sort", "list_sort", LIST_TYPE, vec![], sort)?;
    env.add_member_overload("distinct", "list_distinct", LIST_TYPE, vec![], distinct)?;
    env.add_member_overload("flatten", "list_flatten", LIST_TYPE, vec![], flatten)?;
    env.add_member_overload("flatten", "list_flatten_int", LIST_TYPE, vec![INT_TYPE], flatten)?;
    env.add_member_overload("slice", "list_slice", LIST_TYPE, vec![INT_TYPE, INT_TYPE], slice)?;
    env.add_member_overload("reverse", "list_reverse", LIST_TYPE, vec![], reverse)?;
    env.add_overload("lists.range", "lists_range", vec![INT_TYPE], range)?;
    env.add_member_overload("@sortByAssociatedKeys", "list_sort_by_keys", LIST_TYPE, vec![LIST_TYPE], sort_by_keys)?;
    env.add_macro(Macro::receiver("sortBy", 2, expand_sort_by))?;
    env.add_member_overload("first", "list_first", LIST_TYPE, vec![], first)?;
    env.add_member_overload("last", "list_last", LIST_TYPE, vec![], last)?;
    env.add_overload("optional.unwrap", "optional_unwrap", vec![LIST_TYPE], unwrap)?;
    env.add_member_overload("unwrapOpt", "optional_unwrap_opt", LIST_TYPE, vec![], unwrap)?;
    env.add_overload("sets.contains", "sets_contains", vec![LIST_TYPE, LIST_TYPE], sets_contains)?;
    env.add_overload("sets.equivalent", "sets_equivalent", vec![LIST_TYPE, LIST_TYPE], sets_equivalent)?;
    env.add_overload("sets.intersects", "sets_intersects", vec![LIST_TYPE, LIST_TYPE], sets_intersects)?;
    env.add_member_overload("find", "string_find", STRING_TYPE, vec![STRING_TYPE], find)?;
    env.add_member_overload("findAll", "string_find_all", STRING_TYPE, vec![STRING_TYPE], find_all)?;
    env.add_member_overload("findAll", "string_find_all_n", STRING_TYPE, vec![STRING_TYPE, INT_TYPE], find_all)?;
    Ok(())
}

/// The variable the `sortBy` expansion binds its input to.
const SORT_BY_INPUT: &str = "@__sortBy_input__";

/// cel-go's `sortBy` macro: `l.sortBy(x, key)` is
/// `cel.bind(@in, l, @in.@sortByAssociatedKeys(@in.map(x, key)))`.
fn expand_sort_by(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    let Some(target) = target.take() else { return Ok(None) };
    if !matches!(target.expr, Expr::List(_) | Expr::Select(_) | Expr::Ident(_) | Expr::Comprehension(_) | Expr::Call(_))
    {
        return Err(helper.new_error(
            target.id,
            "sortBy can only be applied to a list, identifier, comprehension, call or select expression",
        ));
    }
    let (Some(key), Some(var)) = (args.pop(), args.pop()) else {
        return Err(helper.new_error(target.id, "sortBy() takes a variable and a key expression"));
    };
    let Expr::Ident(var) = var.expr else {
        return Err(helper.new_error(var.id, "sortBy() variable name must be a simple identifier"));
    };
    // `@in.map(var, [key])` built as the map macro builds it.
    let input = |helper: &mut MacroExprHelper<'_>| helper.next_expr(Expr::Ident(SORT_BY_INPUT.to_owned()));
    let accu = |helper: &mut MacroExprHelper<'_>| helper.next_expr(Expr::Ident("@result".to_owned()));
    let element = helper.next_expr(Expr::List(ListExpr::new(vec![key])));
    let previous = accu(helper);
    let step = helper.next_expr(Expr::Call(CallExpr {
        func_name: "_+_".to_owned(),
        target: None,
        args: vec![previous, element],
    }));
    let empty = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let always = helper.next_expr(Expr::Literal(LiteralValue::Boolean(true.into())));
    let range = input(helper);
    let result = accu(helper);
    let keys = helper.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: range,
        iter_var: var,
        iter_var2: None,
        accu_var: "@result".to_owned(),
        accu_init: empty,
        loop_cond: always,
        loop_step: step,
        result,
    })));
    let receiver = input(helper);
    let sorted = helper.next_expr(Expr::Call(CallExpr {
        func_name: "@sortByAssociatedKeys".to_owned(),
        target: Some(Box::new(receiver)),
        args: vec![keys],
    }));
    let empty = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let never = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
    let value = input(helper);
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: empty,
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: SORT_BY_INPUT.to_owned(),
        accu_init: target,
        loop_cond: never,
        loop_step: value,
        result: sorted,
    })))))
}
