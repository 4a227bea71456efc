//! cel-go's two-variable comprehensions (`ext.TwoVarComprehensions`,
//! Kubernetes 1.32+): `all(k, v, p)`, `exists(k, v, p)`, `existsOne` /
//! `exists_one(k, v, p)`, `transformList`, `transformMap` and
//! `transformMapEntry`, expanded as cel-go expands them into comprehensions
//! with two iteration variables (the index and the element of a list, or the
//! key and the value of a map).
//!
//! The type checker and the cost estimate see those comprehensions as they
//! are. The `cel` crate's interpreter has one iteration variable only, so
//! before evaluation [`lower`] rewrites each into a one-variable loop over
//! `@pairs(range)` (the `[key, value]` pairs), the two variables read as
//! `@kvN[0]` and `@kvN[1]`.

use cel::common::ast::operators;
use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr};
use cel::common::types::{CelInt, CelList, CelMap, CelMapKey, DYN_TYPE, Kind as ValueKind, MAP_TYPE};
use cel::common::value::{CowVal, Val};
use cel::parser::{Macro, MacroExprHelper};
use cel::{DeclarationError, Env, ExecutionError, ParseError};

use crate::meter::{charge, check_list_len};

/// The accumulator cel-go's macros use, which no user can name.
const ACCUMULATOR: &str = "@result";
/// The map-building function of `transformMap` / `transformMapEntry`.
pub const MAP_INSERT: &str = "cel.@mapInsert";
/// The function that turns a list or map into its `[key, value]` pairs.
const PAIRS: &str = "@pairs";

#[derive(Clone, Copy)]
enum TwoVarMacro {
    All,
    Exists,
    ExistsOne,
    TransformList,
    TransformMap,
    TransformMapEntry,
}

/// Registers the macros and the runtime functions.
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    for (name, count, kind) in [
        ("all", 3, TwoVarMacro::All),
        ("exists", 3, TwoVarMacro::Exists),
        ("existsOne", 3, TwoVarMacro::ExistsOne),
        ("exists_one", 3, TwoVarMacro::ExistsOne),
        ("transformList", 3, TwoVarMacro::TransformList),
        ("transformList", 4, TwoVarMacro::TransformList),
        ("transformMap", 3, TwoVarMacro::TransformMap),
        ("transformMap", 4, TwoVarMacro::TransformMap),
        ("transformMapEntry", 3, TwoVarMacro::TransformMapEntry),
        ("transformMapEntry", 4, TwoVarMacro::TransformMapEntry),
    ] {
        env.add_macro(Macro::receiver(name, count, move |helper, target, args| expand(kind, helper, target, args)))?;
    }
    env.add_overload(PAIRS, "pairs", vec![DYN_TYPE], pairs)?;
    env.add_overload(MAP_INSERT, "map_insert_key_value", vec![MAP_TYPE, DYN_TYPE, DYN_TYPE], map_insert)?;
    env.add_overload(MAP_INSERT, "map_insert_map", vec![MAP_TYPE, MAP_TYPE], map_insert)?;
    Ok(())
}

fn ident_name(helper: &mut MacroExprHelper<'_>, e: IdedExpr, what: &str) -> Result<String, ParseError> {
    match e.expr {
        Expr::Ident(name) => Ok(name),
        _ => Err(helper.new_error(e.id, format!("{what} must be a simple identifier"))),
    }
}

fn call(helper: &mut MacroExprHelper<'_>, name: &str, args: Vec<IdedExpr>) -> IdedExpr {
    helper.next_expr(Expr::Call(CallExpr { func_name: name.to_owned(), target: None, args }))
}

fn accu(helper: &mut MacroExprHelper<'_>) -> IdedExpr {
    helper.next_expr(Expr::Ident(ACCUMULATOR.to_owned()))
}

fn boolean(helper: &mut MacroExprHelper<'_>, b: bool) -> IdedExpr {
    helper.next_expr(Expr::Literal(LiteralValue::Boolean(b.into())))
}

fn expand(
    kind: TwoVarMacro,
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    let Some(range) = target.take() else { return Ok(None) };
    let mut taken = std::mem::take(args).into_iter();
    let (Some(first), Some(second)) = (taken.next(), taken.next()) else {
        return Err(helper.new_error(range.id, "expected two iteration variables"));
    };
    let rest: Vec<IdedExpr> = taken.collect();
    let key = ident_name(helper, first, "the first iteration variable")?;
    let value = ident_name(helper, second, "the second iteration variable")?;
    if key == ACCUMULATOR || value == ACCUMULATOR {
        return Err(helper.new_error(range.id, "iteration variable overwrites accumulator variable"));
    }
    if key == value {
        return Err(helper.new_error(range.id, "duplicate variable name"));
    }
    let (filter, body) = match rest.len() {
        1 => (None, rest.into_iter().next()),
        2 => {
            let mut rest = rest.into_iter();
            (rest.next(), rest.next())
        }
        _ => (None, None),
    };
    let Some(body) = body else {
        return Err(helper.new_error(range.id, "unexpected number of arguments"));
    };
    let (init, cond, step, result) = match kind {
        TwoVarMacro::All => {
            let a = accu(helper);
            let cond = call(helper, operators::NOT_STRICTLY_FALSE, vec![a]);
            let a = accu(helper);
            let step = call(helper, operators::LOGICAL_AND, vec![a, body]);
            (boolean(helper, true), cond, step, accu(helper))
        }
        TwoVarMacro::Exists => {
            let a = accu(helper);
            let not = call(helper, operators::LOGICAL_NOT, vec![a]);
            let cond = call(helper, operators::NOT_STRICTLY_FALSE, vec![not]);
            let a = accu(helper);
            let step = call(helper, operators::LOGICAL_OR, vec![a, body]);
            (boolean(helper, false), cond, step, accu(helper))
        }
        TwoVarMacro::ExistsOne => {
            let zero = helper.next_expr(Expr::Literal(LiteralValue::Int(0.into())));
            let (a, one) = (accu(helper), helper.next_expr(Expr::Literal(LiteralValue::Int(1.into()))));
            let plus = call(helper, operators::ADD, vec![a, one]);
            let a = accu(helper);
            let step = call(helper, operators::CONDITIONAL, vec![body, plus, a]);
            let (a, one) = (accu(helper), helper.next_expr(Expr::Literal(LiteralValue::Int(1.into()))));
            let result = call(helper, operators::EQUALS, vec![a, one]);
            (zero, boolean(helper, true), step, result)
        }
        TwoVarMacro::TransformList => {
            let empty = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
            let element = helper.next_expr(Expr::List(ListExpr::new(vec![body])));
            let a = accu(helper);
            let append = call(helper, operators::ADD, vec![a, element]);
            let step = filtered(helper, filter, append);
            (empty, boolean(helper, true), step, accu(helper))
        }
        TwoVarMacro::TransformMap | TwoVarMacro::TransformMapEntry => {
            let empty = helper.next_expr(Expr::Map(MapExpr { entries: Vec::new() }));
            let a = accu(helper);
            let insert = if matches!(kind, TwoVarMacro::TransformMap) {
                let k = helper.next_expr(Expr::Ident(key.clone()));
                call(helper, MAP_INSERT, vec![a, k, body])
            } else {
                call(helper, MAP_INSERT, vec![a, body])
            };
            let step = filtered(helper, filter, insert);
            (empty, boolean(helper, true), step, accu(helper))
        }
    };
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: range,
        iter_var: key,
        iter_var2: Some(value),
        accu_var: ACCUMULATOR.to_owned(),
        accu_init: init,
        loop_cond: cond,
        loop_step: step,
        result,
    })))))
}

/// `filter ? step : @result`, or `step` without a filter.
fn filtered(helper: &mut MacroExprHelper<'_>, filter: Option<IdedExpr>, step: IdedExpr) -> IdedExpr {
    match filter {
        Some(filter) => {
            let a = accu(helper);
            call(helper, operators::CONDITIONAL, vec![filter, step, a])
        }
        None => step,
    }
}

/// Rewrites a two-variable comprehension into one the interpreter runs:
/// the range becomes `@pairs(range)`, the loop variable `@kv<depth>`, and
/// the two variables in the loop condition and step `@kv<depth>[0]` /
/// `@kv<depth>[1]` (where a nested comprehension does not rebind them).
/// `next_id` hands out ids for the nodes it creates.
pub fn lower(c: &mut ComprehensionExpr, depth: usize, next_id: &mut u64) {
    let Some(value) = c.iter_var2.take() else { return };
    let key = std::mem::take(&mut c.iter_var);
    let pair = format!("@kv{depth}");
    let range = std::mem::take(&mut c.iter_range);
    let range_id = range.id;
    c.iter_range = IdedExpr {
        id: range_id,
        expr: Expr::Call(CallExpr { func_name: PAIRS.to_owned(), target: None, args: vec![range] }),
    };
    c.iter_var = pair.clone();
    for e in [&mut c.loop_cond, &mut c.loop_step] {
        substitute(e, &[(key.as_str(), 0), (value.as_str(), 1)], &pair, next_id);
    }
}

fn fresh(next_id: &mut u64, expr: Expr) -> IdedExpr {
    *next_id += 1;
    IdedExpr { id: *next_id, expr }
}

/// Replaces each free `name` of `names` in `e` by `pair[index]`.
fn substitute(e: &mut IdedExpr, names: &[(&str, i64)], pair: &str, next_id: &mut u64) {
    if names.is_empty() {
        return;
    }
    match &mut e.expr {
        Expr::Ident(name) => {
            if let Some((_, index)) = names.iter().find(|(n, _)| n == name) {
                let base = fresh(next_id, Expr::Ident(pair.to_owned()));
                let index = fresh(next_id, Expr::Literal(LiteralValue::Int((*index).into())));
                e.expr = Expr::Call(CallExpr {
                    func_name: operators::INDEX.to_owned(),
                    target: None,
                    args: vec![base, index],
                });
            }
        }
        Expr::Call(call) => {
            if let Some(target) = call.target.as_deref_mut() {
                substitute(target, names, pair, next_id);
            }
            for arg in &mut call.args {
                substitute(arg, names, pair, next_id);
            }
        }
        Expr::Comprehension(inner) => {
            // The range and the start are in the enclosing scope; the rest
            // sees the inner loop's own variables, which may shadow.
            substitute(&mut inner.iter_range, names, pair, next_id);
            substitute(&mut inner.accu_init, names, pair, next_id);
            let bound = |n: &str| n == inner.iter_var || inner.iter_var2.as_deref() == Some(n) || n == inner.accu_var;
            let in_loop: Vec<(&str, i64)> = names.iter().copied().filter(|(n, _)| !bound(n)).collect();
            substitute(&mut inner.loop_cond, &in_loop, pair, next_id);
            substitute(&mut inner.loop_step, &in_loop, pair, next_id);
            let in_result: Vec<(&str, i64)> = names.iter().copied().filter(|(n, _)| *n != inner.accu_var).collect();
            substitute(&mut inner.result, &in_result, pair, next_id);
        }
        Expr::List(list) => list.elements.iter_mut().for_each(|e| substitute(e, names, pair, next_id)),
        Expr::Map(map) => {
            for entry in &mut map.entries {
                match &mut entry.expr {
                    EntryExpr::MapEntry(m) => {
                        substitute(&mut m.key, names, pair, next_id);
                        substitute(&mut m.value, names, pair, next_id);
                    }
                    EntryExpr::StructField(f) => substitute(&mut f.value, names, pair, next_id),
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &mut s.entries {
                if let EntryExpr::StructField(f) = &mut entry.expr {
                    substitute(&mut f.value, names, pair, next_id);
                }
            }
        }
        Expr::Select(select) => substitute(&mut select.operand, names, pair, next_id),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

type Args<'b, 'v> = Vec<CowVal<'b, 'v>>;
type Out<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// `@pairs(range)`: `[[0, e0], [1, e1], ...]` of a list, `[[k, v], ...]`
/// of a map.
fn pairs<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let range = args.into_iter().next().ok_or_else(|| ExecutionError::function_error(PAIRS, "expects a range"))?;
    let pair = |k: Box<dyn Val + 'v>, v: Box<dyn Val + 'v>| Box::new(CelList::from(vec![k, v])) as Box<dyn Val + 'v>;
    let unexpected =
        || ExecutionError::UnexpectedType { got: range.get_type().name().to_owned(), want: "list or map".to_owned() };
    let kind = range.get_type().kind();
    let iterable = range.as_iterable().ok_or_else(unexpected)?;
    let mut out: Vec<Box<dyn Val + 'v>> = Vec::new();
    let mut items = iterable.iter();
    match kind {
        ValueKind::List => {
            let mut index = 0i64;
            while let Some(element) = items.next() {
                out.push(pair(Box::new(CelInt::from(index)), element.clone_as_boxed()));
                index += 1;
            }
        }
        ValueKind::Map => {
            // Keys, then each key's value: the device's own maps are not
            // `CelMap`s, so go through the traits every map implements.
            let indexer = range.as_indexer().ok_or_else(unexpected)?;
            while let Some(key) = items.next() {
                let value = indexer.get(key)?.into_owned();
                out.push(pair(key.clone_as_boxed(), value));
            }
        }
        _ => return Err(unexpected()),
    }
    check_list_len(PAIRS, out.len())?;
    charge(out.len() as u64)?;
    Ok(CowVal::Owned(Box::new(CelList::from(out))))
}

/// `cel.@mapInsert(map, key, value)` / `cel.@mapInsert(map, other)`: a
/// new map with the entries added; a key already present is an error, as
/// in cel-go.
fn map_insert<'b, 'v>(args: Args<'b, 'v>) -> Out<'b, 'v> {
    let mut args = args.into_iter();
    let base = args.next().ok_or_else(|| ExecutionError::function_error(MAP_INSERT, "expects a map"))?;
    let Some(map) = base.downcast_ref::<CelMap>() else {
        return Err(ExecutionError::function_error(MAP_INSERT, "expects a map"));
    };
    let mut entries = map.inner().clone();
    let additions: Vec<(CowVal<'b, 'v>, CowVal<'b, 'v>)> = match (args.next(), args.next()) {
        (Some(key), Some(value)) => vec![(key, value)],
        (Some(other), None) => {
            let Some(other) = other.downcast_ref::<CelMap>() else {
                return Err(ExecutionError::function_error(MAP_INSERT, "transformMapEntry must produce a map"));
            };
            other
                .inner()
                .iter()
                .map(|(k, v)| (CowVal::Owned(k.inner().clone_as_boxed()), CowVal::Owned(v.clone_as_boxed())))
                .collect()
        }
        _ => return Err(ExecutionError::function_error(MAP_INSERT, "expects a key and a value, or a map")),
    };
    charge(entries.len() as u64 + additions.len() as u64)?;
    for (key, value) in additions {
        let key = CelMapKey::try_from(key)
            .map_err(|_| ExecutionError::function_error(MAP_INSERT, "unsupported map key type"))?;
        if entries.contains_key(&key) {
            let shown = match &key {
                CelMapKey::String(s) => format!("{:?}", s.inner()),
                CelMapKey::Int(i) => i.inner().to_string(),
                CelMapKey::UInt(u) => format!("{}u", u.inner()),
                CelMapKey::Bool(b) => b.inner().to_string(),
            };
            return Err(ExecutionError::function_error(
                MAP_INSERT,
                format!("insert failed: key {shown} already exists"),
            ));
        }
        entries.insert(key, value.into_owned());
    }
    check_list_len(MAP_INSERT, entries.len())?;
    Ok(CowVal::Owned(Box::new(CelMap::from(entries))))
}
