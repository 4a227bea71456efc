//! TEMPORARY stand-in for `crate::selector` (branch `cel`) with the same
//! signatures, so the allocator builds and its tests run before the CEL
//! environment lands. Understands only `a == b`, `a != b`, `true`, `false`
//! and `&&` over `device.driver`, `device.allowMultipleAllocations` and
//! `device.attributes["domain"].id` with string, int and bool literals.
//! Deleted when `cel` is merged; never merge this file into shared branches.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CompileError(String);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct EvalError(String);

#[derive(Debug, Default)]
pub struct SelectorEnv;

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
}

#[derive(Debug, Clone)]
enum Operand {
    Lit(Value),
    Driver,
    Multi,
    Attr(String, String),
}

#[derive(Debug, Clone)]
enum Clause {
    Const(bool),
    Cmp(Operand, bool, Operand),
}

#[derive(Debug)]
pub struct CompiledSelector {
    expression: String,
    clauses: Vec<Clause>,
}

#[derive(Debug)]
pub struct CelDevice {
    driver: String,
    multi: bool,
    attrs: BTreeMap<String, BTreeMap<String, Value>>,
}

impl SelectorEnv {
    pub fn new() -> Self {
        Self
    }

    pub fn compile(&self, expression: &str) -> Result<Arc<CompiledSelector>, CompileError> {
        let clauses = expression.split("&&").map(|c| clause(c.trim())).collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(CompiledSelector { expression: expression.to_string(), clauses }))
    }
}

fn clause(c: &str) -> Result<Clause, CompileError> {
    match c {
        "true" => return Ok(Clause::Const(true)),
        "false" => return Ok(Clause::Const(false)),
        _ => {}
    }
    let (lhs, eq, rhs) = if let Some((l, r)) = c.split_once("==") {
        (l, true, r)
    } else if let Some((l, r)) = c.split_once("!=") {
        (l, false, r)
    } else {
        return Err(CompileError(format!("ERROR: <input>: undeclared reference to '{c}'")));
    };
    Ok(Clause::Cmp(operand(lhs.trim())?, eq, operand(rhs.trim())?))
}

fn operand(s: &str) -> Result<Operand, CompileError> {
    if s == "device.driver" {
        return Ok(Operand::Driver);
    }
    if s == "device.allowMultipleAllocations" {
        return Ok(Operand::Multi);
    }
    if let Some(rest) = s.strip_prefix("device.attributes[\"")
        && let Some((domain, id)) = rest.split_once("\"].")
    {
        return Ok(Operand::Attr(domain.to_string(), id.to_string()));
    }
    if let Some(v) = s.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        return Ok(Operand::Lit(Value::Str(v.to_string())));
    }
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Operand::Lit(Value::Int(i)));
    }
    match s {
        "true" => Ok(Operand::Lit(Value::Bool(true))),
        "false" => Ok(Operand::Lit(Value::Bool(false))),
        _ => Err(CompileError(format!("ERROR: <input>: undeclared reference to '{s}'"))),
    }
}

impl CompiledSelector {
    #[allow(dead_code)]
    pub fn expression(&self) -> &str {
        &self.expression
    }

    pub fn matches(&self, device: &CelDevice) -> Result<bool, EvalError> {
        let mut error = None;
        for c in &self.clauses {
            match eval(c, device) {
                Ok(false) => return Ok(false),
                Ok(true) => {}
                Err(e) => error = Some(e),
            }
        }
        error.map_or(Ok(true), Err)
    }
}

fn eval(c: &Clause, d: &CelDevice) -> Result<bool, EvalError> {
    match c {
        Clause::Const(b) => Ok(*b),
        Clause::Cmp(l, eq, r) => Ok((value(l, d)? == value(r, d)?) == *eq),
    }
}

fn value(o: &Operand, d: &CelDevice) -> Result<Value, EvalError> {
    match o {
        Operand::Lit(v) => Ok(v.clone()),
        Operand::Driver => Ok(Value::Str(d.driver.clone())),
        Operand::Multi => Ok(Value::Bool(d.multi)),
        Operand::Attr(domain, id) => {
            d.attrs.get(domain).and_then(|m| m.get(id)).cloned().ok_or_else(|| EvalError(format!("no such key: {id}")))
        }
    }
}

impl CelDevice {
    pub fn new(driver: &str, device: &Device) -> Result<Self, EvalError> {
        let mut attrs: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
        for (name, a) in device.attributes.iter().flatten() {
            let (domain, id) = name.split_once('/').unwrap_or((driver, name));
            let v = match (&a.string, a.int, a.bool, &a.version) {
                (Some(s), _, _, _) | (_, _, _, Some(s)) => Value::Str(s.clone()),
                (_, Some(i), _, _) => Value::Int(i),
                (_, _, Some(b), _) => Value::Bool(b),
                _ => return Err(EvalError(format!("attribute {name}: no value"))),
            };
            attrs.entry(domain.to_string()).or_default().insert(id.to_string(), v);
        }
        Ok(Self { driver: driver.to_string(), multi: device.allow_multiple_allocations.unwrap_or(false), attrs })
    }
}
