//! The static type checker: what cel-go's checker and Kubernetes' AST
//! validators refuse at compile time, refused here at compile time too, with
//! the same words (so a message can be searched for), the position, and the
//! types involved. It runs once per expression, on the parsed AST, before
//! the rewrite for metering.

mod checked;
mod cost;
mod decls;
mod types;

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, SourceInfo};

use checked::{Checked, ResolvedCall};
pub use cost::{CostEstimate, estimate};
pub use decls::{Declarations, Overload};
use types::Mapping;
pub use types::{ObjectType, Type};

use super::environment::CelEnvironment;

/// What to do when a selector needs list-typed attributes (an attribute
/// is `any`, or `includes` is not declared): the gate, in both places.
const LIST_ATTRIBUTES_HINT: &str =
    "; needs DRAListTypeAttributes=true (alpha) in the cluster's and this driver's feature gates";

/// Why an expression failed to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckFailure {
    /// Type errors, each `line:column: message`, in the order found.
    Types(Vec<String>),
    /// Kubernetes has this function (or macro); this driver does not.
    Unsupported(String),
    /// The result can be neither a bool nor unknown.
    NotBool(Type),
}

/// Checks `expr` against `decls` in `env`.
pub fn check(
    expr: &IdedExpr,
    source: &SourceInfo,
    decls: &Declarations,
    env: &CelEnvironment,
) -> Result<Checked, CheckFailure> {
    let mut checker = Checker {
        decls,
        env,
        source,
        mapping: Mapping::default(),
        types: HashMap::new(),
        scopes: Vec::new(),
        errors: Vec::new(),
        unsupported: None,
        calls: HashMap::new(),
    };
    checker.check(expr);
    if !checker.errors.is_empty() {
        return Err(CheckFailure::Types(checker.errors));
    }
    if let Some(name) = checker.unsupported {
        return Err(CheckFailure::Unsupported(name));
    }
    let types: HashMap<u64, Type> =
        checker.types.iter().map(|(id, t)| (*id, checker.mapping.substitute(t, true))).collect();
    let errors = homogeneous_literals(expr, &types, source);
    if !errors.is_empty() {
        return Err(CheckFailure::Types(errors));
    }
    let result = types.get(&expr.id).cloned().unwrap_or(Type::Dyn);
    let calls = std::mem::take(&mut checker.calls);
    Ok(Checked { result, types, calls, environment: *env })
}

/// DRA's rule for the result: a bool, or the unknown type of an attribute
/// (see [`CelEnvironment::accepts_result`]).
pub fn require_bool(checked: &Checked, env: &CelEnvironment) -> Result<(), CheckFailure> {
    let acceptable = match checked.result {
        Type::Bool => true,
        Type::Any => env.accepts_result(true),
        Type::Dyn => env.accepts_result(false),
        _ => false,
    };
    if acceptable { Ok(()) } else { Err(CheckFailure::NotBool(checked.result.clone())) }
}

struct Checker<'a> {
    decls: &'a Declarations,
    env: &'a CelEnvironment,
    source: &'a SourceInfo,
    mapping: Mapping,
    types: HashMap<u64, Type>,
    /// Variables of the enclosing comprehensions, innermost last.
    scopes: Vec<(String, Type)>,
    errors: Vec<String>,
    /// The first function Kubernetes has and this driver does not.
    unsupported: Option<String>,
    calls: HashMap<u64, ResolvedCall>,
}

/// `line:column` of node `id` (1-based, as cel-go prints them).
fn position(source: &SourceInfo, id: u64) -> String {
    let Some((start, _)) = source.offset_for(id) else {
        return "?:?".to_owned();
    };
    let before = source.source.get(..start as usize).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{line}:{column}")
}

impl Checker<'_> {
    fn error(&mut self, id: u64, message: String) {
        let at = position(self.source, id);
        self.errors.push(format!("{at}: {message}"));
    }

    fn set(&mut self, id: u64, t: Type) -> Type {
        self.types.insert(id, t.clone());
        t
    }

    fn check(&mut self, e: &IdedExpr) -> Type {
        let t = match &e.expr {
            Expr::Literal(lit) => literal_type(lit),
            Expr::Ident(name) => self.check_ident(e.id, name),
            Expr::Select(select) if !select.test && qualified_name(e).as_deref().and_then(object_type).is_some() => {
                let name = qualified_name(e).unwrap_or_default();
                Type::Type(object_type(&name).map(|o| Box::new(Type::Object(o))))
            }
            Expr::Select(select) => {
                let operand = self.check(&select.operand);
                let field = self.select_field(e.id, &operand, &select.field);
                if select.test { Type::Bool } else { field }
            }
            Expr::Call(_) => self.check_call(e),
            Expr::List(list) => {
                let mut elem: Option<Type> = None;
                for element in &list.elements {
                    let t = self.check(element);
                    elem = Some(self.join(element.id, elem, t));
                }
                let elem = elem.unwrap_or_else(|| self.mapping.fresh());
                Type::list(elem)
            }
            Expr::Map(map) => {
                let (mut key, mut value): (Option<Type>, Option<Type>) = (None, None);
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(entry) = &entry.expr {
                        let k = self.check(&entry.key);
                        key = Some(self.join(entry.key.id, key, k));
                        let v = self.check(&entry.value);
                        value = Some(self.join(entry.value.id, value, v));
                    }
                }
                match (key, value) {
                    (Some(k), Some(v)) => Type::map(k, v),
                    _ => Type::map(self.mapping.fresh(), self.mapping.fresh()),
                }
            }
            Expr::Struct(s) => {
                self.error(e.id, format!("undeclared reference to '{}' (in container '')", s.type_name));
                Type::Error
            }
            Expr::Comprehension(c) => {
                let range = self.check(&c.iter_range);
                let accu = self.check(&c.accu_init);
                let range = self.mapping.substitute(&range, false);
                let (var, var2) = match &range {
                    Type::List(elem) if c.iter_var2.is_some() => (Type::Int, Some((**elem).clone())),
                    Type::List(elem) => ((**elem).clone(), None),
                    Type::Map(key, value) => ((**key).clone(), c.iter_var2.as_ref().map(|_| (**value).clone())),
                    Type::Dyn | Type::Error | Type::Param(_) => {
                        self.mapping.assignable(&Type::Dyn, &range);
                        (Type::Dyn, c.iter_var2.as_ref().map(|_| Type::Dyn))
                    }
                    other => {
                        let hint = if *other == Type::Any { LIST_ATTRIBUTES_HINT } else { "" };
                        self.error(
                            c.iter_range.id,
                            format!(
                                "expression of type '{other}' cannot be range of a comprehension (must be list, map, or dynamic){hint}"
                            ),
                        );
                        (Type::Error, c.iter_var2.as_ref().map(|_| Type::Error))
                    }
                };
                let depth = self.scopes.len();
                self.scopes.push((c.accu_var.clone(), accu.clone()));
                self.scopes.push((c.iter_var.clone(), var));
                if let (Some(name), Some(t)) = (&c.iter_var2, var2) {
                    self.scopes.push((name.clone(), t));
                }
                let cond = self.check(&c.loop_cond);
                self.expect(c.loop_cond.id, &Type::Bool, &cond);
                let step = self.check(&c.loop_step);
                self.expect(c.loop_step.id, &accu, &step);
                // The result sees the accumulator, not the loop variables.
                self.scopes.truncate(depth + 1);
                let result = self.check(&c.result);
                self.scopes.truncate(depth);
                self.mapping.substitute(&result, false)
            }
            Expr::Unspecified => Type::Error,
        };
        self.set(e.id, t)
    }

    fn check_ident(&mut self, id: u64, name: &str) -> Type {
        if let Some((_, t)) = self.scopes.iter().rev().find(|(n, _)| n == name) {
            return t.clone();
        }
        match name {
            "device" if self.env.declares_device() => Type::Object(ObjectType::Device),
            "int" => Type::Type(Some(Box::new(Type::Int))),
            "uint" => Type::Type(Some(Box::new(Type::Uint))),
            "double" => Type::Type(Some(Box::new(Type::Double))),
            "bool" => Type::Type(Some(Box::new(Type::Bool))),
            "string" => Type::Type(Some(Box::new(Type::String))),
            "bytes" => Type::Type(Some(Box::new(Type::Bytes))),
            "list" => Type::Type(Some(Box::new(Type::list(Type::Dyn)))),
            "map" => Type::Type(Some(Box::new(Type::map(Type::Dyn, Type::Dyn)))),
            "null_type" => Type::Type(Some(Box::new(Type::Null))),
            "type" => Type::Type(Some(Box::new(Type::Type(None)))),
            _ => {
                self.error(id, format!("undeclared reference to '{name}' (in container '')"));
                Type::Error
            }
        }
    }

    /// The type of `operand.field`.
    fn select_field(&mut self, id: u64, operand: &Type, field: &str) -> Type {
        let operand = self.mapping.substitute(operand, false);
        let (target, optional) = match operand {
            Type::Optional(inner) => (*inner, true),
            other => (other, false),
        };
        let t = match &target {
            Type::Map(_, value) => (**value).clone(),
            Type::Object(ObjectType::Device) => match self.device_field(field) {
                Some(t) => t,
                None => {
                    self.error(id, format!("undefined field '{field}'"));
                    Type::Error
                }
            },
            Type::Object(_) => {
                self.error(id, format!("undefined field '{field}'"));
                Type::Error
            }
            Type::Param(_) => {
                self.mapping.assignable(&Type::Dyn, &target);
                Type::Dyn
            }
            t if t.is_dyn_or_error() => Type::Dyn,
            other => {
                self.error(id, format!("type '{other}' does not support field selection"));
                Type::Dyn
            }
        };
        if optional { Type::Optional(Box::new(t)) } else { t }
    }

    /// The fields of `device`, as `dynamic-resource-allocation/cel` declares them.
    fn device_field(&self, field: &str) -> Option<Type> {
        let attribute = if self.env.attributes_are_dyn() { Type::Dyn } else { Type::Any };
        Some(match field {
            "driver" => Type::String,
            "attributes" => Type::map(Type::String, Type::map(Type::String, attribute)),
            "capacity" => Type::map(Type::String, Type::map(Type::String, Type::Object(ObjectType::Quantity))),
            "allowMultipleAllocations" if self.env.has_allow_multiple_allocations() => Type::Bool,
            _ => return None,
        })
    }

    fn check_call(&mut self, e: &IdedExpr) -> Type {
        let Expr::Call(call) = &e.expr else { return Type::Error };
        let name = call.func_name.as_str();
        if name == "_?._" {
            return self.check_optional_select(e.id, &call.args);
        }
        let args: Vec<Type> = call.args.iter().map(|a| self.check(a)).collect();
        let Some(target) = call.target.as_deref() else {
            return match self.decls.function(name) {
                Some(overloads) => self.resolve(e.id, name, overloads, None, args, &call.args),
                None => {
                    self.error(e.id, format!("undeclared reference to '{name}' (in container '')"));
                    Type::Error
                }
            };
        };
        if let Some(prefix) = qualified_name(target) {
            let qualified = format!("{prefix}.{name}");
            if let Some(overloads) = self.decls.function(&qualified) {
                return self.resolve(e.id, &qualified, overloads, None, args, &call.args);
            }
        }
        let target_type = self.check(target);
        match self.decls.function(name) {
            Some(overloads) => self.resolve(e.id, name, overloads, Some(target_type), args, &call.args),
            None => {
                let hint = if name == "includes" { LIST_ATTRIBUTES_HINT } else { "" };
                self.error(e.id, format!("undeclared reference to '{name}' (in container ''){hint}"));
                Type::Error
            }
        }
    }

    /// `operand?.field` (`checkOptSelect`): an optional of the field's type.
    fn check_optional_select(&mut self, id: u64, args: &[IdedExpr]) -> Type {
        let [operand, field] = args else {
            self.error(
                id,
                format!("unsupported optional field selection: incorrect signature. argument count: {}", args.len()),
            );
            return Type::Error;
        };
        let Expr::Literal(LiteralValue::String(name)) = &field.expr else {
            self.error(field.id, "unsupported optional field selection".to_owned());
            return Type::Error;
        };
        let operand = self.check(operand);
        self.calls.insert(id, ResolvedCall { function: "_?._".to_owned(), overloads: Vec::new() });
        match self.select_field(id, &operand, name.inner()) {
            Type::Optional(t) => Type::Optional(t),
            t => Type::Optional(Box::new(t)),
        }
    }

    /// `resolveOverload`: the result type of the overloads that accept the
    /// arguments (`dyn` when they disagree), or an error naming the types.
    fn resolve(
        &mut self,
        id: u64,
        name: &str,
        overloads: &[Overload],
        target: Option<Type>,
        args: Vec<Type>,
        arg_exprs: &[IdedExpr],
    ) -> Type {
        let member = target.is_some();
        if name == "_&&_" || name == "_||_" {
            for (t, e) in args.iter().zip(arg_exprs) {
                self.expect(e.id, &Type::Bool, t);
            }
            self.calls.insert(id, ResolvedCall { function: name.to_owned(), overloads: overloads.to_vec() });
            return Type::Bool;
        }
        let arg_types: Vec<Type> = target.into_iter().chain(args).collect();
        let mut matched = Vec::new();
        let mut result: Option<Type> = None;
        let (mut supported, mut unsupported) = (false, false);
        for overload in overloads.iter().filter(|o| o.member == member) {
            let fresh: Vec<Type> = (0..overload.type_params).map(|_| self.mapping.fresh()).collect();
            let mut instantiate = |t: &Type| t.map_params(&mut |p| fresh.get(p as usize).cloned().unwrap_or(Type::Dyn));
            let params: Vec<Type> = overload.params.iter().map(&mut instantiate).collect();
            let overload_result = instantiate(&overload.result);
            if !self.mapping.assignable_all(&params, &arg_types) {
                continue;
            }
            if overload.unsupported {
                unsupported = true;
            } else {
                supported = true;
            }
            matched.push(overload.clone());
            let r = self.mapping.substitute(&overload_result, false);
            result = Some(match result {
                None => r,
                Some(previous) if !previous.is_dyn() && previous != r => Type::Dyn,
                Some(previous) => previous,
            });
        }
        self.calls.insert(id, ResolvedCall { function: name.to_owned(), overloads: matched });
        match result {
            Some(t) => {
                if unsupported && !supported {
                    self.unsupported.get_or_insert_with(|| name.to_owned());
                }
                t
            }
            None => {
                let shown: Vec<String> =
                    arg_types.iter().map(|t| self.mapping.substitute(t, true).to_string()).collect();
                let signature = if member {
                    format!("{}.({})", shown[0], shown[1..].join(", "))
                } else {
                    format!("({})", shown.join(", "))
                };
                let mut message = format!("found no matching overload for '{name}' applied to '{signature}'");
                if name == "reverse" && signature == "string.()" {
                    message.push_str(
                        " (strings have no reverse() in Kubernetes 1.34–1.37, which pin cel-go's strings extension at version 2)",
                    );
                }
                self.error(id, message);
                Type::Error
            }
        }
    }

    /// `joinTypes`: the element type of an aggregate literal so far.
    fn join(&mut self, id: u64, previous: Option<Type>, current: Type) -> Type {
        let Some(previous) = previous else { return current };
        if self.mapping.assignable(&previous, &current) {
            return types::most_general(&previous, &current).clone();
        }
        let (p, c) = (self.mapping.substitute(&previous, true), self.mapping.substitute(&current, true));
        self.error(id, format!("expected type '{p}' but found '{c}'"));
        Type::Error
    }

    /// `assertType`.
    fn expect(&mut self, id: u64, expected: &Type, actual: &Type) {
        if !self.mapping.assignable(expected, actual) {
            let (e, a) = (self.mapping.substitute(expected, true), self.mapping.substitute(actual, true));
            self.error(id, format!("expected type '{e}' but found '{a}'"));
        }
    }
}

fn literal_type(lit: &LiteralValue) -> Type {
    match lit {
        LiteralValue::Boolean(_) => Type::Bool,
        LiteralValue::Int(_) => Type::Int,
        LiteralValue::UInt(_) => Type::Uint,
        LiteralValue::Double(_) => Type::Double,
        LiteralValue::String(_) => Type::String,
        LiteralValue::Bytes(_) => Type::Bytes,
        LiteralValue::Null => Type::Null,
    }
}

/// The object type a qualified type name names (`net.IP` is a type value).
fn object_type(name: &str) -> Option<ObjectType> {
    [
        ObjectType::Quantity,
        ObjectType::Semver,
        ObjectType::Url,
        ObjectType::Ip,
        ObjectType::Cidr,
        ObjectType::NamedFormat,
    ]
    .into_iter()
    .find(|o| o.name() == name)
}

/// `a.b.c` as a name, if `expr` is only identifiers and field selections.
fn qualified_name(expr: &IdedExpr) -> Option<String> {
    match &expr.expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(select) if !select.test => Some(format!("{}.{}", qualified_name(&select.operand)?, select.field)),
        _ => None,
    }
}

/// Kubernetes' `ValidateHomogeneousAggregateLiterals`: the elements of a
/// list literal, and the keys and the values of a map literal, must have
/// equivalent types (`dyn` is not equivalent to `int`; wrap with `dyn(..)`
/// every element to mix them).
fn homogeneous_literals(expr: &IdedExpr, types: &HashMap<u64, Type>, source: &SourceInfo) -> Vec<String> {
    let mut errors = Vec::new();
    let type_of = |e: &IdedExpr| types.get(&e.id).cloned().unwrap_or(Type::Dyn);
    let mut mismatch = |id: u64, expected: &Type, found: &Type| {
        errors.push(format!("{}: expected type '{expected}' but found '{found}'", position(source, id)));
    };
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        match &e.expr {
            Expr::List(list) => {
                if let Some((first, rest)) = list.elements.split_first() {
                    let expected = type_of(first);
                    if let Some(odd) = rest.iter().find(|r| type_of(r) != expected) {
                        mismatch(odd.id, &expected, &type_of(odd));
                    }
                }
                stack.extend(list.elements.iter());
            }
            Expr::Map(map) => {
                let entries: Vec<_> = map
                    .entries
                    .iter()
                    .filter_map(|e| match &e.expr {
                        EntryExpr::MapEntry(m) => Some(m),
                        EntryExpr::StructField(_) => None,
                    })
                    .collect();
                if let Some((first, rest)) = entries.split_first() {
                    let (key, value) = (type_of(&first.key), type_of(&first.value));
                    for entry in rest {
                        if type_of(&entry.key) != key {
                            mismatch(entry.key.id, &key, &type_of(&entry.key));
                        }
                        if type_of(&entry.value) != value {
                            mismatch(entry.value.id, &value, &type_of(&entry.value));
                        }
                    }
                }
                for entry in entries {
                    stack.push(&entry.key);
                    stack.push(&entry.value);
                }
            }
            Expr::Call(call) => {
                stack.extend(call.target.as_deref());
                stack.extend(call.args.iter());
            }
            Expr::Comprehension(c) => {
                stack.extend([&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result]);
            }
            Expr::Select(s) => stack.push(&s.operand),
            Expr::Struct(s) => stack.extend(s.entries.iter().filter_map(|e| match &e.expr {
                EntryExpr::StructField(f) => Some(&f.value),
                EntryExpr::MapEntry(_) => None,
            })),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    errors
}
