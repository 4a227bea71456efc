//! The runtime cost bound.
//!
//! The `cel` crate has no cost accounting and no cancellation, so the bound is
//! built around it, in two halves:
//!
//! * **At compile time** the parsed AST is rewritten (see [`rewrite`]): every
//!   comprehension's range is wrapped in `@range(range, weight)`, where
//!   `weight` is the number of AST nodes of the loop body; `_+_` on
//!   non-accumulator operands becomes `@add`; `==`, `!=`, `<`, `<=`, `>`,
//!   `>=`, `in` and `[]` between two non-literal operands become metered
//!   calls (`ops_lib`); values the interpreter copies (list and map literal
//!   elements, `cel.bind` values) are wrapped in `@copy`; the size-dependent
//!   standard functions (`contains`, `startsWith`, `endsWith`, `matches`,
//!   `size`) are renamed to metered versions. The string and list library
//!   functions are our own and meter themselves. (Two rewrites are for speed
//!   only: `device.a.b` becomes `device["a"]["b"]`, and constant
//!   `quantity("..")` / `semver("..")` calls are evaluated once.)
//! * **At run time** a thread-local meter (`meter`) counts units. `@range` charges
//!   `len(range) × weight` *before* the loop runs (a conservative upper bound:
//!   `all`/`exists` may stop early), so a comprehension that would exceed the
//!   budget never starts; it also pays for copying each element into the loop
//!   variable. Functions that build or scan strings and lists charge
//!   one unit per [`crate::meter::BYTES_PER_UNIT`] bytes or per element, before doing the
//!   work, and refuse results above [`crate::meter::MAX_STRING_BYTES`] /
//!   [`crate::meter::MAX_LIST_LEN`].
//!
//! Every evaluated node is either outside all loops (at most the AST size,
//! itself bounded by the 10 Ki expression limit) or inside a loop whose
//! iterations were paid for, and no single node can touch more than the
//! size caps allow, so the work of one evaluation is bounded by roughly
//! `budget × (one node or BYTES_PER_UNIT bytes)`. Once the budget is exceeded
//! every further charge fails at once (the flag is sticky), so even an error
//! absorbed by `||` or `&&` ends the evaluation quickly, and
//! `CompiledSelector::matches` reports the overrun whatever the result was.
//! The units follow cel-go's cost model where it decides what passes: one
//! per identifier, field selection, call or aggregate evaluated, nothing for
//! a literal, and a sixteenth per byte scanned or built (cel-go: a tenth);
//! a loop iteration is charged the most its body may cost outside nested
//! loops, which charge their own iterations when they start. They are an
//! upper bound of cel-go's, close to it: five nested ten-element `all()`
//! (855,551 cel-go units) pass the budget of 1,000,000, Kubernetes'
//! `CELSelectorExpressionMaxCost`, and seven (85,555,551) fail, as there.

use cel::ExecutionError;
use cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, operators};
use cel::common::types::{CelBytes, CelList, CelString, Kind};
use cel::common::value::{CowVal, Val};

use crate::meter::{BUDGET, bytes_units, charge, check_list_len, check_string_len};
use crate::ops_lib::{METERED_OPERATORS, deep_units};
use crate::quantity::Quantity;
use crate::semver_lib::Semver;

/// The deepest AST accepted; the parser's own recursion limit catches most
/// nesting, this catches long left-deep operator chains (`1+1+1+...`) that
/// would make evaluation recurse as deep.
pub const MAX_AST_DEPTH: usize = 100;

/// `@range(range, weight)`: charges for every iteration of a comprehension up
/// front and hands the range back untouched.
pub fn range<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut args = args.into_iter();
    let (Some(range), Some(weight)) = (args.next(), args.next()) else {
        return Err(ExecutionError::function_error("@range", "expects two arguments"));
    };
    let weight = weight.downcast_ref::<cel::common::types::CelInt>().map_or(1, |w| (*w.inner()).max(1) as u64);
    let len = match range.get_type().kind() {
        Kind::List | Kind::Map => range.as_sizer().map_or(0, |s| (*s.size().inner()).max(0) as u64),
        _ => 0,
    };
    // Each element is copied into the loop variable: pay for those copies
    // too (a scalar's copy is part of the iteration's weight).
    charge(1 + len.saturating_mul(weight))?;
    charge(element_units(range.as_ref()))?;
    Ok(range)
}

/// Units to copy every element of a list (or key of a map) once.
fn element_units(range: &dyn Val) -> u64 {
    let mut units = 0u64;
    if let Some(list) = range.downcast_ref::<CelList>() {
        for element in list.inner() {
            units = units.saturating_add(deep_units(element.as_ref(), BUDGET));
            if units > BUDGET {
                break;
            }
        }
    } else if range.get_type().kind() == Kind::Map {
        // Keys are scalars: their copies are part of the iteration's weight,
        // but string keys are charged by size.
        units = deep_units(range, BUDGET);
    }
    units
}

/// `@add(a, b)`: `a + b`, charged by the size of the result and refused above
/// the size caps, so repeated doubling cannot exhaust memory.
pub fn add<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut args = args.into_iter();
    let (Some(lhs), Some(rhs)) = (args.next(), args.next()) else {
        return Err(ExecutionError::function_error("_+_", "expects two arguments"));
    };
    if let (Some(a), Some(b)) = (lhs.downcast_ref::<CelString>(), rhs.downcast_ref::<CelString>()) {
        let len = a.inner().len() + b.inner().len();
        check_string_len("_+_", len)?;
        charge(bytes_units(len))?;
    } else if let (Some(a), Some(b)) = (lhs.downcast_ref::<CelList>(), rhs.downcast_ref::<CelList>()) {
        let len = a.inner().len() + b.inner().len();
        check_list_len("_+_", len)?;
        charge(1 + len as u64)?;
    } else if let (Some(a), Some(b)) = (lhs.downcast_ref::<CelBytes>(), rhs.downcast_ref::<CelBytes>()) {
        let len = a.inner().len() + b.inner().len();
        check_string_len("_+_", len)?;
        charge(bytes_units(len))?;
    }
    let adder = lhs.as_adder().ok_or_else(|| {
        ExecutionError::no_such_overload(
            operators::ADD,
            vec![lhs.get_type().name().to_owned(), rhs.get_type().name().to_owned()],
        )
    })?;
    Ok(CowVal::Owned(adder.add(rhs.as_ref())?.into_owned()))
}

/// Functions of the standard library whose cost depends on the size of their
/// arguments: calls to them are renamed to the metered version `@<name>`.
pub const METERED_STDLIB: [&str; 5] = ["contains", "startsWith", "endsWith", "matches", "size"];

/// Why an AST was refused.
#[derive(Debug)]
pub struct TooDeep;

/// Stack one level of AST nesting may take while evaluating: measured at
/// ~38 KiB in a debug build (the interpreter's frames are large), with margin.
const STACK_PER_LEVEL: usize = if cfg!(debug_assertions) { 64 * 1024 } else { 16 * 1024 };

/// Rewrites a parsed expression for metering (see the module doc). Returns
/// the stack its evaluation may need; fails when the AST is deeper than
/// [`MAX_AST_DEPTH`].
pub fn rewrite(expr: &mut IdedExpr) -> Result<Rewritten, TooDeep> {
    let mut rw = Rewritten { stack: 0, constants: Vec::new(), next_id: FIRST_REWRITE_ID };
    rewrite_at(expr, 0, None, &mut rw)?;
    rw.stack = (rw.stack + 4) * STACK_PER_LEVEL;
    Ok(rw)
}

/// Refuses an AST deeper than [`MAX_AST_DEPTH`], without recursing, so
/// that the recursive passes after it (the type checker, the rewrite) are
/// safe on any expression the parser accepts.
pub fn check_depth(expr: &IdedExpr) -> Result<(), TooDeep> {
    let mut stack = vec![(expr, 0usize)];
    while let Some((e, depth)) = stack.pop() {
        if depth > MAX_AST_DEPTH {
            return Err(TooDeep);
        }
        let next = depth + 1;
        match &e.expr {
            Expr::Call(call) => {
                stack.extend(call.target.as_deref().map(|t| (t, next)));
                stack.extend(call.args.iter().map(|a| (a, next)));
            }
            Expr::Comprehension(c) => {
                stack.extend([&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result].map(|e| (e, next)));
            }
            Expr::List(l) => stack.extend(l.elements.iter().map(|e| (e, next))),
            Expr::Map(m) => {
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(e) => stack.extend([(&e.key, next), (&e.value, next)]),
                        EntryExpr::StructField(f) => stack.push((&f.value, next)),
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(e) => stack.extend([(&e.key, next), (&e.value, next)]),
                        EntryExpr::StructField(f) => stack.push((&f.value, next)),
                    }
                }
            }
            Expr::Select(s) => stack.push((&s.operand, next)),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    Ok(())
}

/// What the rewrite found out about an expression.
pub struct Rewritten {
    /// Stack its evaluation may need (while rewriting: the deepest level).
    pub stack: usize,
    /// Values of the constant calls `quantity("..")` and `semver("..")`,
    /// computed once here; the AST refers to them as `@c<index>`, which the
    /// evaluation's variable resolver hands out. Parsing `"40Gi"` on every
    /// evaluation would otherwise be most of a typical selector's cost.
    pub constants: Vec<Box<dyn Val>>,
    /// The id of the last node the rewrite created.
    pub next_id: u64,
}

/// Ids of nodes the rewrite creates start here, far above the parser's.
const FIRST_REWRITE_ID: u64 = 1 << 40;

/// The name of constant `index`, and back.
pub fn constant_name(index: usize) -> String {
    format!("@c{index}")
}

/// The index of a constant's name.
pub fn constant_index(name: &str) -> Option<usize> {
    name.strip_prefix("@c")?.parse().ok()
}

/// The value of `quantity("lit")`, `semver("lit")` or `semver("lit", bool)`,
/// if `call` is one and the literal is valid (an invalid one stays a call, to
/// fail at run time as in Kubernetes).
fn constant_value(call: &CallExpr) -> Option<Box<dyn Val>> {
    if call.target.is_some() {
        return None;
    }
    let text = match call.args.first().map(|a| &a.expr) {
        Some(Expr::Literal(LiteralValue::String(s))) => s.inner(),
        _ => return None,
    };
    match (call.func_name.as_str(), call.args.get(1).map(|a| &a.expr), call.args.len()) {
        ("quantity", None, 1) => Quantity::parse(text).ok().map(|q| Box::new(q) as Box<dyn Val>),
        ("semver", None, 1) => Semver::parse(text, false).ok().map(|v| Box::new(v) as Box<dyn Val>),
        ("semver", Some(Expr::Literal(LiteralValue::Boolean(normalize))), 2) => {
            Semver::parse(text, *normalize.inner()).ok().map(|v| Box::new(v) as Box<dyn Val>)
        }
        _ => None,
    }
}

fn rewrite_at(expr: &mut IdedExpr, depth: usize, accu: Option<&str>, rw: &mut Rewritten) -> Result<(), TooDeep> {
    if depth > MAX_AST_DEPTH {
        return Err(TooDeep);
    }
    rw.stack = rw.stack.max(depth);
    let id = expr.id;
    match &mut expr.expr {
        Expr::Call(call) => {
            if let Some(target) = call.target.as_deref_mut() {
                rewrite_at(target, depth + 1, accu, rw)?;
            }
            for arg in &mut call.args {
                rewrite_at(arg, depth + 1, accu, rw)?;
            }
            rename_call(call, accu);
            if let Some(value) = constant_value(call) {
                expr.expr = Expr::Ident(constant_name(rw.constants.len()));
                rw.constants.push(value);
            }
        }
        Expr::Comprehension(c) => {
            crate::two_var::lower(c, depth, &mut rw.next_id);
            rewrite_at(&mut c.iter_range, depth + 1, accu, rw)?;
            rewrite_at(&mut c.accu_init, depth + 1, accu, rw)?;
            charge_copy(&mut c.accu_init);
            let inner = Some(c.accu_var.clone());
            rewrite_at(&mut c.loop_cond, depth + 1, inner.as_deref(), rw)?;
            rewrite_at(&mut c.loop_step, depth + 1, inner.as_deref(), rw)?;
            rewrite_at(&mut c.result, depth + 1, inner.as_deref(), rw)?;
            let weight = iteration_units(&c.loop_cond) + iteration_units(&c.loop_step);
            let range = std::mem::take(&mut c.iter_range);
            let weight_expr = IdedExpr { id, expr: Expr::Literal(LiteralValue::Int((weight as i64).into())) };
            c.iter_range = IdedExpr {
                id: range.id,
                expr: Expr::Call(CallExpr {
                    func_name: "@range".to_owned(),
                    target: None,
                    args: vec![range, weight_expr],
                }),
            };
        }
        Expr::List(ListExpr { elements, .. }) => {
            for e in elements {
                rewrite_at(e, depth + 1, accu, rw)?;
                charge_copy(e);
            }
        }
        Expr::Map(map) => {
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(e) = &mut entry.expr {
                    rewrite_at(&mut e.key, depth + 1, accu, rw)?;
                    rewrite_at(&mut e.value, depth + 1, accu, rw)?;
                    charge_copy(&mut e.key);
                    charge_copy(&mut e.value);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &mut s.entries {
                match &mut entry.expr {
                    EntryExpr::StructField(f) => rewrite_at(&mut f.value, depth + 1, accu, rw)?,
                    EntryExpr::MapEntry(e) => {
                        rewrite_at(&mut e.key, depth + 1, accu, rw)?;
                        rewrite_at(&mut e.value, depth + 1, accu, rw)?;
                    }
                }
            }
        }
        Expr::Select(select) => {
            rewrite_at(&mut select.operand, depth + 1, accu, rw)?;
            // `device.a.b` is resolved by the interpreter as a qualified name
            // (joining the segments and trying `device.a.b`, then `device.a`,
            // as variables and types) on every evaluation. On a map, selecting
            // a field is indexing with its name, so `device["a"]["b"]` means
            // the same and resolves just `device`.
            if !select.test && rooted_at_device(&select.operand) {
                let operand = std::mem::take(&mut *select.operand);
                let field = IdedExpr { id, expr: Expr::Literal(LiteralValue::String(select.field.clone().into())) };
                expr.expr = Expr::Call(CallExpr {
                    func_name: operators::INDEX.to_owned(),
                    target: None,
                    args: vec![operand, field],
                });
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
    Ok(())
}

/// Renames a call to its metered version where there is one. `@result + [x]`
/// and `@result + 1`, the steps the macros generate, stay as they are: the
/// interpreter appends those in place, and their iterations are paid for by
/// `@range`.
fn rename_call(call: &mut CallExpr, accu: Option<&str>) {
    // `a.isGreaterThan(b)` / `a.isLessThan(b)` (quantities, versions) become
    // the native `a > b` / `a < b`, served by their `Comparer`: a member call
    // costs several times more. Other types than those two are then compared
    // natively instead of failing with "no such overload"; Kubernetes rejects
    // that at compile time with its type checker, which we do not have.
    let native = match call.func_name.as_str() {
        "isGreaterThan" => Some(operators::GREATER),
        "isLessThan" => Some(operators::LESS),
        _ => None,
    };
    if let (Some(op), Some(_), 1) = (native, call.target.as_ref(), call.args.len())
        && let Some(target) = call.target.take()
    {
        call.args.insert(0, *target);
        call.func_name = op.to_owned();
        return;
    }
    if call.func_name == operators::ADD {
        // Only the macros' own accumulator (`@result`, which no user can
        // name); a `cel.bind` variable is a user's and its `+` is metered.
        let on_accu = matches!(call.args.first().map(|a| &a.expr),
            Some(Expr::Ident(name)) if Some(name.as_str()) == accu && name.starts_with('@'));
        if !on_accu {
            call.func_name = "@add".to_owned();
        }
    } else if METERED_STDLIB.contains(&call.func_name.as_str()) && !is_namespace(call.target.as_deref()) {
        call.func_name = format!("@{}", call.func_name);
    } else if let Some((_, metered)) = METERED_OPERATORS.iter().find(|(op, _)| *op == call.func_name)
        && call.target.is_none()
        && !has_bounded_operand(&call.func_name, &call.args)
    {
        call.func_name = (*metered).to_owned();
    }
}

/// Whether a call's target is a function namespace (`sets.contains(..)` is
/// the function `sets.contains`, not `contains` called on `sets`).
fn is_namespace(target: Option<&IdedExpr>) -> bool {
    matches!(target.map(|t| &t.expr), Some(Expr::Ident(name)) if name == "sets")
}

/// Whether an operand's size is bounded by the expression text: a literal,
/// or for `in` a list or map literal on the right.
fn has_bounded_operand(op: &str, args: &[IdedExpr]) -> bool {
    // A folded `quantity("..")` constant is as bounded as a literal, but the
    // ordering operators must see it to refuse `<` on quantities.
    let ordering =
        matches!(op, operators::LESS | operators::LESS_EQUALS | operators::GREATER | operators::GREATER_EQUALS);
    let literal = |e: &IdedExpr| match &e.expr {
        Expr::Literal(_) => true,
        Expr::Ident(name) => !ordering && constant_index(name).is_some(),
        _ => false,
    };
    match (op, args) {
        (operators::IN, [_, haystack]) => matches!(haystack.expr, Expr::List(_) | Expr::Map(_)),
        (operators::INDEX, [_, idx]) => literal(idx),
        (_, [a, b]) => literal(a) || literal(b),
        _ => true,
    }
}

/// Wraps a value the interpreter copies (a list or map literal's element, a
/// `cel.bind` value) in `@copy(..)`, which charges its full size before the
/// copy is made: `[s, s, s, ...]` of a large `s` would otherwise copy it
/// many times unpaid. Literals are left alone: the expression text bounds them.
fn charge_copy(expr: &mut IdedExpr) {
    if matches!(expr.expr, Expr::Literal(_)) {
        return;
    }
    let inner = std::mem::take(expr);
    *expr = IdedExpr {
        id: inner.id,
        expr: Expr::Call(CallExpr { func_name: "@copy".to_owned(), target: None, args: vec![inner] }),
    };
}

/// `@copy(value)`: charges the full size of a value about to be copied.
pub fn copy<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let value = args.into_iter().next().ok_or_else(|| ExecutionError::function_error("@copy", "expects a value"))?;
    charge(deep_units(value.as_ref(), BUDGET))?;
    Ok(value)
}

/// Whether `expr` is `device` followed by field selections or indexing.
fn rooted_at_device(expr: &IdedExpr) -> bool {
    let mut expr = expr;
    loop {
        match &expr.expr {
            Expr::Ident(name) => return name == "device",
            Expr::Select(select) if !select.test => expr = &select.operand,
            Expr::Call(call) if call.func_name == operators::INDEX && call.target.is_none() => {
                match call.args.first() {
                    Some(operand) => expr = operand,
                    None => return false,
                }
            }
            _ => return false,
        }
    }
}

/// Units of one evaluation of `expr` outside nested loops, for the weight
/// of one loop iteration: as in cel-go's cost model, an identifier, a field
/// selection, a call or an aggregate costs one and a literal nothing. A
/// nested comprehension counts its range, start and result; its iterations
/// are charged by its own `@range` when it runs, so nested loops are
/// charged once per iteration actually started, not once per level.
fn iteration_units(expr: &IdedExpr) -> usize {
    let entries = |entries: &[cel::common::ast::IdedEntryExpr]| -> usize {
        entries
            .iter()
            .map(|e| match &e.expr {
                EntryExpr::MapEntry(e) => iteration_units(&e.key) + iteration_units(&e.value),
                EntryExpr::StructField(f) => iteration_units(&f.value),
            })
            .sum()
    };
    match &expr.expr {
        Expr::Call(call) => {
            1 + call.target.as_deref().map_or(0, iteration_units) + call.args.iter().map(iteration_units).sum::<usize>()
        }
        Expr::Comprehension(c) => {
            1 + iteration_units(&c.iter_range) + iteration_units(&c.accu_init) + iteration_units(&c.result)
        }
        Expr::List(l) => 1 + l.elements.iter().map(iteration_units).sum::<usize>(),
        Expr::Map(m) => 1 + entries(&m.entries),
        Expr::Struct(s) => 1 + entries(&s.entries),
        Expr::Select(s) => 1 + iteration_units(&s.operand),
        Expr::Ident(_) => 1,
        Expr::Literal(_) | Expr::Unspecified => 0,
    }
}
