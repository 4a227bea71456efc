//! The CEL environment of device selectors: the `cel` crate's standard
//! library and macros, plus what Kubernetes' base environment and DRA add
//! (quantity, semver, string extensions, `cel.bind`), plus the metering
//! functions the compile-time rewrite calls (see `cost`).

use std::sync::Arc;

use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::types::{DYN_TYPE, INT_TYPE};
use cel::parser::{Macro, MacroExprHelper};
use cel::{Context, DeclarationError, Env, ParseError, Value};

use crate::error::CompileError;
use crate::{cost, format_lib, ip_lib, lists_lib, ops_lib, quantity_lib, semver_lib, strings_lib, two_var, url_lib};

/// Builds the selector environment (the default one's runtime).
#[cfg(test)]
pub fn build() -> Result<Env, DeclarationError> {
    build_for(&crate::environment::CelEnvironment::default())
}

/// Builds the runtime of the selector environment `environment`.
pub fn build_for(environment: &crate::environment::CelEnvironment) -> Result<Env, DeclarationError> {
    let mut env = Env::stdlib();
    env.add_macro(Macro::receiver("bind", 3, expand_bind))?;
    quantity_lib::register(&mut env)?;
    semver_lib::register(&mut env)?;
    strings_lib::register(&mut env)?;
    ops_lib::register(&mut env)?;
    lists_lib::register(&mut env, lists_lib::IncludesLimit::for_environment(environment))?;
    two_var::register(&mut env)?;
    url_lib::register(&mut env)?;
    ip_lib::register(&mut env)?;
    format_lib::register(&mut env)?;
    env.add_overload("@range", "metered_range", vec![DYN_TYPE, INT_TYPE], cost::range)?;
    env.add_overload("@add", "metered_add", vec![DYN_TYPE, DYN_TYPE], cost::add)?;
    env.add_overload("@copy", "metered_copy", vec![DYN_TYPE], cost::copy)?;
    Ok(env)
}

/// `cel.bind(name, init, expr)`: evaluates `expr` with `name` bound to
/// `init`, as cel-go's `ext.Bindings` does it: a comprehension over an empty
/// list whose accumulator is the binding, so `init` is evaluated once.
fn expand_bind(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(name)) if name == "cel") {
        return Ok(None);
    }
    let (Some(result), Some(init), Some(var)) = (args.pop(), args.pop(), args.pop()) else {
        return Err(helper.new_error(0, "cel.bind() takes three arguments"));
    };
    let Expr::Ident(name) = var.expr else {
        return Err(helper.new_error(var.id, "cel.bind() variable name must be a simple identifier"));
    };
    let empty = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let never = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
    let step = helper.next_expr(Expr::Ident(name.clone()));
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: empty,
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: name,
        accu_init: init,
        loop_cond: never,
        loop_step: step,
        result,
    })))))
}

/// Kubernetes' AST validators for literal arguments: a constant `matches`
/// pattern must compile, and constant `duration("..")` / `timestamp("..")`
/// arguments must be valid, at compile time rather than on the first device.
pub fn check_literals(env: &Arc<Env>, expr: &IdedExpr) -> Result<(), CompileError> {
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        match &e.expr {
            Expr::Call(call) => {
                if let Some(Expr::Literal(LiteralValue::String(text))) = call.args.last().map(|a| &a.expr) {
                    match call.func_name.as_str() {
                        "matches" => {
                            strings_lib::compile_regex(text.inner())
                                .map_err(|e| CompileError::InvalidRegex(e.to_string()))?;
                        }
                        "duration" | "timestamp" if call.target.is_none() && call.args.len() == 1 => {
                            check_time_literal(env, &call.func_name, text.inner())?;
                        }
                        _ => {}
                    }
                }
                stack.extend(call.target.as_deref());
                stack.extend(call.args.iter());
            }
            Expr::Comprehension(c) => {
                stack.extend([&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result])
            }
            Expr::List(l) => stack.extend(l.elements.iter()),
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(e) = &entry.expr {
                        stack.push(&e.key);
                        stack.push(&e.value);
                    }
                }
            }
            Expr::Select(s) => stack.push(&s.operand),
            Expr::Struct(_) | Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    Ok(())
}

/// Evaluates `function("text")` as the runtime would, as cel-go's
/// validators do, and refuses it with the runtime's explanation.
fn check_time_literal(env: &Arc<Env>, function: &str, text: &str) -> Result<(), CompileError> {
    let call = IdedExpr {
        id: 1,
        expr: Expr::Call(CallExpr {
            func_name: function.to_owned(),
            target: None,
            args: vec![IdedExpr { id: 2, expr: Expr::Literal(LiteralValue::String(text.to_owned().into())) }],
        }),
    };
    let context = Context::with_env(Arc::clone(env));
    match Value::resolve_val(&call, &context) {
        Ok(_) => Ok(()),
        Err(e) => Err(CompileError::InvalidLiteral(runtime_message(&e.to_string()))),
    }
}

/// A runtime error as a person reads it: the `cel` crate prints some parse
/// failures with Rust debug output (`Parsing Error: Error { input: "x",
/// code: Float }`), and names a function it lacks as an undeclared reference.
pub fn runtime_message(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("Error executing function '")
        && let Some((function, detail)) = rest.split_once("': ")
        && detail.starts_with("Parsing Error: Error {")
    {
        let input = detail.split_once("input: \"").and_then(|(_, tail)| tail.split_once("\", code:"));
        let example = match function {
            "duration" => "; write one such as \"90s\" or \"1h30m\"",
            "timestamp" => "; write one such as \"2025-01-01T00:00:00Z\"",
            _ => "",
        };
        return match input {
            Some((text, _)) => format!("{function}(): \"{text}\" is not a valid {function}{example}"),
            None => format!("{function}(): the argument is not a valid {function}{example}"),
        };
    }
    if let Some(name) = message.strip_prefix("Undeclared reference to '").and_then(|r| r.strip_suffix('\'')) {
        return CompileError::Unsupported(name.to_string()).to_string();
    }
    message.to_string()
}
