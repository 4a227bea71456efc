//! The CEL environment of device selectors: the `cel` crate's standard
//! library and macros, plus what Kubernetes' base environment and DRA add
//! (quantity, semver, string extensions, `cel.bind`), plus the metering
//! functions the compile-time rewrite calls (see `cost`).

use cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::types::{DYN_TYPE, INT_TYPE};
use cel::parser::{Macro, MacroExprHelper};
use cel::{DeclarationError, Env, ParseError};

use super::{CompileError, cost, lists_lib, ops_lib, quantity_lib, semver_lib, strings_lib};

/// Builds the selector environment.
pub fn build() -> Result<Env, DeclarationError> {
    let mut env = Env::stdlib();
    env.add_macro(Macro::receiver("bind", 3, expand_bind))?;
    quantity_lib::register(&mut env)?;
    semver_lib::register(&mut env)?;
    strings_lib::register(&mut env)?;
    ops_lib::register(&mut env)?;
    lists_lib::register(&mut env)?;
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

/// Compiles every constant `matches` pattern, so a bad one is a compile error
/// as in Kubernetes, not a runtime error on the first device.
pub fn check_literal_patterns(expr: &IdedExpr) -> Result<(), String> {
    match &expr.expr {
        Expr::Call(call) => {
            if call.func_name == "@matches"
                && let Some(Expr::Literal(LiteralValue::String(pattern))) = call.args.last().map(|a| &a.expr)
            {
                strings_lib::compile_regex(pattern.inner())?;
            }
            if let Some(target) = call.target.as_deref() {
                check_literal_patterns(target)?;
            }
            call.args.iter().try_for_each(check_literal_patterns)
        }
        Expr::Comprehension(c) => [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result]
            .into_iter()
            .try_for_each(check_literal_patterns),
        Expr::List(l) => l.elements.iter().try_for_each(check_literal_patterns),
        Expr::Select(s) => check_literal_patterns(&s.operand),
        Expr::Map(_) | Expr::Struct(_) | Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Ok(()),
    }
}

/// Without a type checker, the one static check on the result type: a
/// literal, list or map at the root can never be a bool (Kubernetes: "must
/// evaluate to bool").
pub fn check_result_may_be_bool(expr: &IdedExpr) -> Result<(), CompileError> {
    let kind = match &expr.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => return Ok(()),
        Expr::Literal(LiteralValue::Int(_)) => "int",
        Expr::Literal(LiteralValue::UInt(_)) => "uint",
        Expr::Literal(LiteralValue::Double(_)) => "double",
        Expr::Literal(LiteralValue::String(_)) => "string",
        Expr::Literal(LiteralValue::Bytes(_)) => "bytes",
        Expr::Literal(LiteralValue::Null) => "null",
        Expr::List(_) => "list",
        Expr::Map(_) => "map",
        _ => return Ok(()),
    };
    Err(CompileError::NotBool(kind.to_owned()))
}

/// Names an expression may use without declaring them: the `device`
/// variable, type names, and the namespaces of qualified functions.
const KNOWN_NAMES: [&str; 16] = [
    "device",
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "optional_type",
    "google",
    "kubernetes",
    "sets",
    "optional",
];

/// Namespaces of functions that Kubernetes' CEL environment has and this
/// driver's does not (`lists.range`, `strings.quote`, `math.*`, `base64.*`).
const UNSUPPORTED_NAMESPACES: [&str; 4] = ["lists", "strings", "math", "base64"];

/// Functions and methods Kubernetes 1.34–1.36 offers selectors that this
/// driver's CEL lacks: the lists extension's `sortBy` macro, the `url`,
/// `ip` and `cidr` libraries, and `format`.
const UNSUPPORTED_FUNCTIONS: [&str; 12] = [
    "sortBy",
    "format",
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getQuery",
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "containsIP",
];

/// Namespaced functions this driver has in a namespace it otherwise lacks.
const SUPPORTED_NAMESPACED: [&str; 2] = ["lists.range", "strings.quote"];

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

/// Refuses an identifier that is neither `device`, a type or namespace, nor
/// a variable of an enclosing macro or `cel.bind`: Kubernetes' type checker
/// reports it at compile time ("undeclared reference"), so a typo such as
/// `devices.driver` fails before any device is evaluated.
pub fn check_identifiers(expr: &IdedExpr, scope: &mut Vec<String>) -> Result<(), CompileError> {
    match &expr.expr {
        Expr::Ident(name) => {
            let known =
                name.starts_with('@') || KNOWN_NAMES.contains(&name.as_str()) || scope.iter().any(|v| v == name);
            if known { Ok(()) } else { Err(CompileError::Undeclared(name.clone())) }
        }
        Expr::Call(call) => {
            // Innermost first: `url(x).getHost()` names `url`.
            if let Some(target) = call.target.as_deref() {
                let namespaced = match &target.expr {
                    Expr::Ident(namespace) if !scope.iter().any(|v| v == namespace) => {
                        Some((namespace.as_str(), format!("{namespace}.{}", call.func_name)))
                    }
                    _ => None,
                };
                match namespaced {
                    Some((_, name)) if SUPPORTED_NAMESPACED.contains(&name.as_str()) => {}
                    Some((namespace, name)) if UNSUPPORTED_NAMESPACES.contains(&namespace) => {
                        return Err(CompileError::Unsupported(name));
                    }
                    _ => check_identifiers(target, scope)?,
                }
            }
            // Strings v2 (what Kubernetes pins) has no reverse(); on a string
            // literal the apiserver's type checker refuses it at compile time.
            if call.func_name == "reverse"
                && call
                    .target
                    .as_deref()
                    .is_some_and(|t| matches!(&t.expr, Expr::Literal(cel::common::ast::LiteralValue::String(_))))
            {
                return Err(CompileError::ReverseUnsupported);
            }
            // Before the arguments: a macro's variables are not declared.
            if UNSUPPORTED_FUNCTIONS.contains(&call.func_name.as_str()) {
                return Err(CompileError::Unsupported(call.func_name.clone()));
            }
            call.args.iter().try_for_each(|a| check_identifiers(a, scope))?;
            Ok(())
        }
        Expr::Comprehension(c) => {
            check_identifiers(&c.iter_range, scope)?;
            check_identifiers(&c.accu_init, scope)?;
            let depth = scope.len();
            scope.push(c.iter_var.clone());
            scope.push(c.accu_var.clone());
            if let Some(second) = &c.iter_var2 {
                scope.push(second.clone());
            }
            let inner =
                [&c.loop_cond, &c.loop_step, &c.result].into_iter().try_for_each(|e| check_identifiers(e, scope));
            scope.truncate(depth);
            inner
        }
        Expr::List(l) => l.elements.iter().try_for_each(|e| check_identifiers(e, scope)),
        Expr::Map(m) => m.entries.iter().try_for_each(|entry| match &entry.expr {
            EntryExpr::MapEntry(e) => {
                check_identifiers(&e.key, scope)?;
                check_identifiers(&e.value, scope)
            }
            EntryExpr::StructField(f) => check_identifiers(&f.value, scope),
        }),
        Expr::Select(s) => check_identifiers(&s.operand, scope),
        Expr::Struct(_) | Expr::Literal(_) | Expr::Unspecified => Ok(()),
    }
}
