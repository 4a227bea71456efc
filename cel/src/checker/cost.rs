//! The compile-time cost estimate, in cel-go's units, as Kubernetes computes
//! it for a selector: cel-go's `checker/cost.go` (with presence tests free,
//! as Kubernetes sets it), the extension libraries' estimators (sets, lists
//! v3), Kubernetes' library estimator (`apiserver/pkg/cel/library/cost.go`)
//! and the DRA size estimator, which bounds what is reachable through
//! `device` by the API's limits (32 attributes per device, 64-byte values,
//! 63-byte domains, 32-byte names).
//!
//! The apiserver refuses a new selector whose estimated maximum exceeds
//! `CELSelectorExpressionMaxCost` (1,000,000); the scheduler does not
//! estimate, it only meters.

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

use super::checked::Checked;
use super::decls::Overload;
use super::types::{ObjectType, Type};

const STRING_TRAVERSAL_FACTOR: f64 = 0.1;
const REGEX_LENGTH_FACTOR: f64 = 0.25;
const LIST_CREATE_BASE: u64 = 10;
const MAP_CREATE_BASE: u64 = 30;
const STRUCT_CREATE_BASE: u64 = 40;

/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice`.
const MAX_ATTRIBUTES_PER_DEVICE: u64 = 32;
/// `DeviceAttributeMaxValueLength`.
const MAX_ATTRIBUTE_VALUE_LENGTH: u64 = 64;
/// `DeviceMaxDomainLength`.
const MAX_DOMAIN_LENGTH: u64 = 63;
/// `DeviceMaxIDLength`.
const MAX_ID_LENGTH: u64 = 32;
/// `DriverNameMaxLength`.
const MAX_DRIVER_NAME_LENGTH: u64 = 63;
/// `ResourceSliceMaxAttributeValuesPerDevice`: the longest list attribute.
const MAX_ATTRIBUTE_VALUES: u64 = 48;

/// A range of costs, or of sizes: cel-go's `CostEstimate` / `SizeEstimate`,
/// with its saturating arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostEstimate {
    pub min: u64,
    pub max: u64,
}

type Size = CostEstimate;

const UNKNOWN: Size = CostEstimate { min: 0, max: u64::MAX };
/// The identity of [`CostEstimate::union`].
const EMPTY_UNION: Size = CostEstimate { min: u64::MAX, max: 0 };

impl CostEstimate {
    pub const fn fixed(n: u64) -> Self {
        CostEstimate { min: n, max: n }
    }

    fn add(self, other: Self) -> Self {
        CostEstimate { min: self.min.saturating_add(other.min), max: self.max.saturating_add(other.max) }
    }

    fn multiply(self, other: Self) -> Self {
        CostEstimate { min: self.min.saturating_mul(other.min), max: self.max.saturating_mul(other.max) }
    }

    fn union(self, other: Self) -> Self {
        CostEstimate { min: self.min.min(other.min), max: self.max.max(other.max) }
    }

    fn factor(self, factor: f64) -> Self {
        CostEstimate { min: by_factor(self.min, factor), max: by_factor(self.max, factor) }
    }
}

/// `multiplyByCostFactor`: rounds up, saturates.
fn by_factor(x: u64, factor: f64) -> u64 {
    let product = (x as f64 * factor).ceil();
    if product >= 18_446_744_073_709_551_616.0 { u64::MAX } else { product as u64 }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    List,
    Map,
}

/// Sizes of a container's keys and values.
#[derive(Debug, Clone, Copy)]
struct EntrySize {
    container: Container,
    key: Size,
    value: Size,
}

impl EntrySize {
    fn union(self, other: EntrySize) -> EntrySize {
        EntrySize { container: self.container, key: self.key.union(other.key), value: self.value.union(other.value) }
    }
}

#[derive(Debug, Clone)]
struct LocalVar {
    path: Vec<String>,
    size: Option<Size>,
    entry: Option<EntrySize>,
}

/// What sizes the estimate may assume of values reached by a path from a
/// variable (cel-go's `EstimateSize`).
pub trait SizeEstimator {
    fn estimate_size(&self, path: &[String], ty: &Type) -> Option<CostEstimate>;
}

/// DRA's size estimator: the API's limits on what `device` holds.
pub struct DeviceSizes;

impl SizeEstimator for DeviceSizes {
    fn estimate_size(&self, path: &[String], _: &Type) -> Option<CostEstimate> {
        dra_size(path)
    }
}

/// The estimated cost of a checked selector, as Kubernetes estimates it.
pub fn estimate(expr: &IdedExpr, checked: &Checked) -> CostEstimate {
    estimate_with(expr, checked, &DeviceSizes)
}

/// The estimated cost of a checked expression with `sizes`.
pub fn estimate_with(expr: &IdedExpr, checked: &Checked, sizes: &dyn SizeEstimator) -> CostEstimate {
    let mut coster = Coster {
        checked,
        sizes_of: sizes,
        paths: HashMap::new(),
        sizes: HashMap::new(),
        entries: HashMap::new(),
        locals: HashMap::new(),
    };
    coster.cost(expr)
}

struct Coster<'a> {
    checked: &'a Checked,
    sizes_of: &'a dyn SizeEstimator,
    paths: HashMap<u64, Vec<String>>,
    sizes: HashMap<u64, Size>,
    entries: HashMap<u64, EntrySize>,
    locals: HashMap<String, Vec<LocalVar>>,
}

/// An argument as the estimators see it: its type, path and size.
struct Node {
    ty: Type,
    path: Vec<String>,
    size: Option<Size>,
    literal_int: Option<i64>,
    id: u64,
}

impl Node {
    fn size(&self) -> Size {
        self.size.unwrap_or(UNKNOWN)
    }
}

/// What a call may cost and the size of its result.
struct CallEstimate {
    cost: CostEstimate,
    result: Option<Size>,
}

impl CallEstimate {
    fn cost(cost: CostEstimate) -> Self {
        CallEstimate { cost, result: None }
    }
}

impl Coster<'_> {
    fn ty(&self, e: &IdedExpr) -> Type {
        self.checked.types.get(&e.id).cloned().unwrap_or(Type::Dyn)
    }

    fn local(&self, name: &str) -> Option<&LocalVar> {
        self.locals.get(name).and_then(|stack| stack.last())
    }

    fn push_local(&mut self, name: &str, var: LocalVar) {
        self.locals.entry(name.to_owned()).or_default().push(var);
    }

    fn pop_local(&mut self, name: &str) {
        if let Some(stack) = self.locals.get_mut(name) {
            stack.pop();
        }
    }

    fn path(&self, e: &IdedExpr) -> Vec<String> {
        if let Expr::Ident(name) = &e.expr
            && let Some(var) = self.local(name)
        {
            return var.path.clone();
        }
        self.paths.get(&e.id).cloned().unwrap_or_default()
    }

    fn node(&mut self, e: &IdedExpr) -> Node {
        let mut path = self.path(e);
        if path.first().is_some_and(|p| p == "@result" || p == "__result__") {
            path.clear();
        }
        let literal_int = match &e.expr {
            Expr::Literal(LiteralValue::Int(i)) => Some(*i.inner()),
            _ => None,
        };
        Node { ty: self.ty(e), path, size: self.size(e), literal_int, id: e.id }
    }

    fn size_or_unknown(&mut self, e: &IdedExpr) -> Size {
        self.size(e).unwrap_or(UNKNOWN)
    }

    /// `computeSize`.
    fn size(&mut self, e: &IdedExpr) -> Option<Size> {
        if let Some(size) = self.sizes.get(&e.id) {
            return Some(*size);
        }
        if let Some(size) = literal_size(e) {
            return Some(size);
        }
        let ty = self.ty(e);
        if let Some(size) = self.sizes_of.estimate_size(&self.path(e), &ty) {
            self.sizes.insert(e.id, size);
            return Some(size);
        }
        if is_scalar(&self.ty(e)) {
            return Some(CostEstimate::fixed(1));
        }
        if let Expr::Ident(name) = &e.expr {
            return self.local(name).and_then(|v| v.size);
        }
        None
    }

    fn entry(&self, e: &IdedExpr) -> Option<EntrySize> {
        if let Some(entry) = self.entries.get(&e.id) {
            return Some(*entry);
        }
        if let Expr::Ident(name) = &e.expr {
            return self.local(name).and_then(|v| v.entry);
        }
        None
    }

    fn cost(&mut self, e: &IdedExpr) -> CostEstimate {
        match &e.expr {
            Expr::Literal(_) | Expr::Unspecified => CostEstimate::fixed(0),
            Expr::Ident(name) => {
                let path = self.local(name).map_or_else(|| vec![name.clone()], |v| v.path.clone());
                self.paths.insert(e.id, path);
                CostEstimate::fixed(1)
            }
            Expr::Select(select) => {
                // Presence tests are free (Kubernetes: PresenceTestHasCost(false)).
                let mut sum = self.cost(&select.operand);
                if select.test {
                    return sum;
                }
                if matches!(self.ty(&select.operand), Type::Map(..) | Type::Object(_) | Type::Param(_)) {
                    sum = sum.add(CostEstimate::fixed(1));
                }
                let mut path = self.path(&select.operand);
                path.push(select.field.clone());
                self.paths.insert(e.id, path);
                sum
            }
            Expr::Call(_) => self.cost_call(e),
            Expr::List(list) => {
                let mut sum = CostEstimate::fixed(0);
                let mut item = if list.elements.is_empty() { CostEstimate { min: 0, max: 0 } } else { EMPTY_UNION };
                for element in &list.elements {
                    sum = sum.add(self.cost(element));
                    item = item.union(self.size_or_unknown(element));
                }
                self.entries
                    .insert(e.id, EntrySize { container: Container::List, key: CostEstimate::fixed(1), value: item });
                sum.add(CostEstimate::fixed(LIST_CREATE_BASE))
            }
            Expr::Map(map) => {
                let mut sum = CostEstimate::fixed(0);
                let empty = map.entries.is_empty();
                let (mut key, mut value) = if empty {
                    (CostEstimate { min: 0, max: 0 }, CostEstimate { min: 0, max: 0 })
                } else {
                    (EMPTY_UNION, EMPTY_UNION)
                };
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(entry) = &entry.expr {
                        sum = sum.add(self.cost(&entry.key)).add(self.cost(&entry.value));
                        key = key.union(self.size_or_unknown(&entry.key));
                        value = value.union(self.size_or_unknown(&entry.value));
                    }
                }
                self.entries.insert(e.id, EntrySize { container: Container::Map, key, value });
                sum.add(CostEstimate::fixed(MAP_CREATE_BASE))
            }
            Expr::Struct(s) => {
                let mut sum = CostEstimate::fixed(STRUCT_CREATE_BASE);
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        sum = sum.add(self.cost(&f.value));
                    }
                }
                sum
            }
            Expr::Comprehension(c) => {
                let is_bind = matches!(&c.iter_range.expr, Expr::List(l) if l.elements.is_empty())
                    && matches!(&c.loop_cond.expr, Expr::Literal(LiteralValue::Boolean(b)) if !*b.inner())
                    && c.accu_var != "@result"
                    && c.accu_var != "__result__";
                if is_bind { self.cost_bind(e) } else { self.cost_comprehension(e) }
            }
        }
    }

    fn accumulator(&mut self, init: &IdedExpr) -> LocalVar {
        LocalVar { path: self.path(init), size: self.size(init), entry: self.entry(init) }
    }

    fn cost_bind(&mut self, e: &IdedExpr) -> CostEstimate {
        let Expr::Comprehension(c) = &e.expr else { return CostEstimate::fixed(0) };
        let mut sum = self.cost(&c.iter_range).add(self.cost(&c.accu_init));
        let accu = self.accumulator(&c.accu_init);
        self.push_local(&c.accu_var, accu);
        sum = sum.add(self.cost(&c.result));
        self.pop_local(&c.accu_var);
        if let Some(size) = self.size(&c.result) {
            self.sizes.insert(e.id, size);
        }
        if let Some(entry) = self.entry(&c.result) {
            self.entries.insert(e.id, entry);
        }
        sum
    }

    fn cost_comprehension(&mut self, e: &IdedExpr) -> CostEstimate {
        let Expr::Comprehension(c) = &e.expr else { return CostEstimate::fixed(0) };
        let mut sum = self.cost(&c.iter_range).add(self.cost(&c.accu_init));
        let accu = self.accumulator(&c.accu_init);
        self.push_local(&c.accu_var, accu);
        let entry = self.entry(&c.iter_range);
        let container = entry.map(|e| e.container).or(match self.ty(&c.iter_range) {
            Type::List(_) => Some(Container::List),
            Type::Map(..) => Some(Container::Map),
            _ => None,
        });
        let range_path = self.path(&c.iter_range);
        let with_sub = |sub: &str| {
            let mut p = range_path.clone();
            p.push(sub.to_owned());
            p
        };
        match &c.iter_var2 {
            Some(second) => {
                let (key_sub, value_sub) =
                    if container == Some(Container::List) { ("@indices", "@items") } else { ("@keys", "@values") };
                let key = LocalVar { path: with_sub(key_sub), size: entry.map(|e| e.key), entry: None };
                let value = LocalVar { path: with_sub(value_sub), size: entry.map(|e| e.value), entry: None };
                self.push_local(&c.iter_var, key);
                self.push_local(second, value);
            }
            None => {
                let var = if container == Some(Container::List) {
                    LocalVar { path: with_sub("@items"), size: entry.map(|e| e.value), entry: None }
                } else {
                    LocalVar { path: with_sub("@keys"), size: entry.map(|e| e.key), entry: None }
                };
                self.push_local(&c.iter_var, var);
            }
        }
        let loop_cost = self.cost(&c.loop_cond);
        let step_cost = self.cost(&c.loop_step);
        self.pop_local(&c.iter_var);
        if let Some(second) = &c.iter_var2 {
            self.pop_local(second);
        }
        sum = sum.add(self.cost(&c.result));
        self.pop_local(&c.accu_var);
        let count = self.size_or_unknown(&c.iter_range);
        sum = sum.add(count.multiply(step_cost.add(loop_cost)));
        match &c.accu_init.expr {
            Expr::Literal(_) => {
                if let Some(size) = self.size(&c.accu_init) {
                    self.sizes.insert(e.id, size);
                }
            }
            Expr::List(_) | Expr::Map(_) => {
                self.sizes.insert(e.id, count);
                if let Some(step_entry) = self.entry(&c.loop_step) {
                    self.entries.insert(e.id, step_entry);
                }
            }
            _ => {}
        }
        sum
    }

    fn cost_call(&mut self, e: &IdedExpr) -> CostEstimate {
        let Expr::Call(call) = &e.expr else { return CostEstimate::fixed(0) };
        if call.func_name == "dyn" && call.target.is_none() && call.args.len() == 1 {
            let arg = &call.args[0];
            let cost = CostEstimate::fixed(1).add(self.cost(arg));
            if let Some(size) = self.size(arg) {
                self.sizes.insert(e.id, size);
            }
            if let Some(entry) = self.entry(arg) {
                self.entries.insert(e.id, entry);
            }
            return cost;
        }
        let Some(resolved) = self.checked.calls.get(&e.id) else { return CostEstimate::fixed(0) };
        let function = resolved.function.clone();
        let overloads = resolved.overloads.clone();
        // A namespaced function's "target" is its namespace, not a value.
        let member = call.target.is_some() && !function.contains('.');
        let mut arg_costs = Vec::with_capacity(call.args.len());
        let mut args = Vec::with_capacity(call.args.len());
        for arg in &call.args {
            arg_costs.push(self.cost(arg));
            args.push(self.node(arg));
        }
        let mut sum = CostEstimate::fixed(0);
        let target = match call.target.as_deref() {
            Some(t) if member => {
                sum = sum.add(self.cost(t));
                Some(self.node(t))
            }
            _ => None,
        };
        let candidates: Vec<Option<&Overload>> =
            if overloads.is_empty() { vec![None] } else { overloads.iter().map(Some).collect() };
        let mut fn_cost = EMPTY_UNION;
        let mut result: Option<Size> = None;
        for overload in candidates {
            let estimate = self.function_cost(e, &function, overload, target.as_ref(), &args, &arg_costs);
            fn_cost = fn_cost.union(estimate.cost);
            if let Some(size) = estimate.result {
                result = Some(result.map_or(size, |r| r.union(size)));
            }
            if function == "_[_]"
                && let (Some(container), Some(overload)) = (call.args.first(), overload)
            {
                let (list, sub) = match overload.params.first() {
                    Some(Type::List(_)) => (true, "@items"),
                    Some(Type::Map(..)) => (false, "@values"),
                    _ => (false, ""),
                };
                if !sub.is_empty() {
                    let _ = list;
                    result = self.entry(container).map(|entry| entry.value);
                    let mut path = self.path(container);
                    path.push(sub.to_owned());
                    self.paths.insert(e.id, path);
                }
            }
            if result.is_none() {
                result = self.size(e);
            }
        }
        if let Some(size) = result {
            self.sizes.insert(e.id, size);
        }
        sum.add(fn_cost)
    }

    /// `functionCost`: an extension's estimator, then Kubernetes', then
    /// cel-go's own rules, then one.
    fn function_cost(
        &mut self,
        e: &IdedExpr,
        function: &str,
        overload: Option<&Overload>,
        target: Option<&Node>,
        args: &[Node],
        arg_costs: &[CostEstimate],
    ) -> CallEstimate {
        let arg_sum = arg_costs.iter().fold(CostEstimate::fixed(0), |a, c| a.add(*c));
        let with_args = |mut estimate: CallEstimate| {
            estimate.cost = estimate.cost.add(arg_sum);
            estimate
        };
        if let Some(estimate) = extension_estimate(function, overload, target, args) {
            return with_args(estimate);
        }
        let includes_by_size = self.checked.environment.includes_costs_target_size();
        if let Some(estimate) = kubernetes_estimate(self.sizes_of, function, target, args, includes_by_size) {
            return with_args(estimate);
        }
        let first_param = overload.and_then(|o| o.params.first());
        let string_or_bytes = matches!(first_param, Some(Type::String | Type::Bytes));
        match function {
            "format" if target.is_some() => {
                CallEstimate::cost(target.map_or(UNKNOWN, Node::size).factor(STRING_TRAVERSAL_FACTOR).add(arg_sum))
            }
            "bytes" if first_param == Some(&Type::String) && args.len() == 1 => {
                let size = args[0].size();
                CallEstimate {
                    cost: size.factor(STRING_TRAVERSAL_FACTOR).add(arg_sum),
                    result: Some(CostEstimate { min: size.min, max: size.max.saturating_mul(4) }),
                }
            }
            "string" if first_param == Some(&Type::Bytes) && args.len() == 1 => {
                let size = args[0].size();
                CallEstimate {
                    cost: size.factor(STRING_TRAVERSAL_FACTOR).add(arg_sum),
                    result: Some(CostEstimate { min: size.min / 4, max: size.max }),
                }
            }
            "strings.quote" if args.len() == 1 => {
                let size = args[0].size();
                CallEstimate {
                    cost: size.factor(STRING_TRAVERSAL_FACTOR).add(arg_sum),
                    result: Some(CostEstimate {
                        min: size.min.saturating_add(2),
                        max: size.max.saturating_mul(2).saturating_add(2),
                    }),
                }
            }
            "startsWith" | "endsWith" if args.len() == 1 => {
                CallEstimate::cost(args[0].size().factor(STRING_TRAVERSAL_FACTOR).add(arg_sum))
            }
            "@in" if matches!(overload.and_then(|o| o.params.get(1)), Some(Type::List(_))) && args.len() == 2 => {
                CallEstimate::cost(args[1].size().factor(1.0).add(arg_sum))
            }
            "matches" if target.is_some() && args.len() == 1 => {
                let text =
                    target.map_or(UNKNOWN, Node::size).add(CostEstimate::fixed(1)).factor(STRING_TRAVERSAL_FACTOR);
                let regex = args[0].size().factor(REGEX_LENGTH_FACTOR);
                CallEstimate::cost(text.multiply(regex).add(arg_sum))
            }
            "contains" if target.is_some() && args.len() == 1 => {
                let text = target.map_or(UNKNOWN, Node::size).factor(STRING_TRAVERSAL_FACTOR);
                let needle = args[0].size().factor(STRING_TRAVERSAL_FACTOR);
                CallEstimate::cost(text.multiply(needle).add(arg_sum))
            }
            "_||_" | "_&&_" if arg_costs.len() == 2 => {
                let (lhs, rhs) = (arg_costs[0], arg_costs[1]);
                CallEstimate::cost(CostEstimate { min: lhs.min, max: lhs.add(rhs).max })
            }
            "_?_:_" if args.len() == 3 && arg_costs.len() == 3 => {
                let size = args[1].size().union(args[2].size());
                let (a, b) = (self.entry_by_id(args[1].id), self.entry_by_id(args[2].id));
                if let (Some(a), Some(b)) = (a, b) {
                    self.entries.insert(e.id, a.union(b));
                }
                CallEstimate { cost: arg_costs[0].add(arg_costs[1].union(arg_costs[2])), result: Some(size) }
            }
            "_+_" if args.len() == 2 && matches!(first_param, Some(Type::String | Type::Bytes | Type::List(_))) => {
                let size = args[0].size().add(args[1].size());
                let (a, b) = (self.entry_by_id(args[0].id), self.entry_by_id(args[1].id));
                if let (Some(a), Some(b)) = (a, b) {
                    self.entries.insert(e.id, a.union(b));
                }
                let cost = if matches!(first_param, Some(Type::List(_))) {
                    CostEstimate::fixed(1)
                } else {
                    size.factor(STRING_TRAVERSAL_FACTOR)
                };
                CallEstimate { cost: cost.add(arg_sum), result: Some(size) }
            }
            "_==_" | "_!=_" => compare_cost(args, arg_sum),
            "_<_" | "_<=_" | "_>_" | "_>=_" if string_or_bytes => compare_cost(args, arg_sum),
            _ => CallEstimate::cost(CostEstimate::fixed(1).add(arg_sum)),
        }
    }

    fn entry_by_id(&self, id: u64) -> Option<EntrySize> {
        self.entries.get(&id).copied()
    }
}

/// Equality, and ordering of strings and bytes: a tenth per unit of the
/// smaller operand.
fn compare_cost(args: &[Node], arg_sum: CostEstimate) -> CallEstimate {
    let (Some(lhs), Some(rhs)) = (args.first(), args.get(1)) else {
        return CallEstimate::cost(CostEstimate::fixed(1).add(arg_sum));
    };
    let smallest_max = lhs.size().max.min(rhs.size().max);
    let min = u64::from(smallest_max > 0);
    CallEstimate::cost(CostEstimate { min, max: smallest_max }.factor(STRING_TRAVERSAL_FACTOR).add(arg_sum))
}

/// The estimators cel-go's extension libraries register by overload:
/// sets, and the lists extension v3.
fn extension_estimate(
    function: &str,
    overload: Option<&Overload>,
    target: Option<&Node>,
    args: &[Node],
) -> Option<CallEstimate> {
    let call = CostEstimate::fixed(1);
    let allocating = |factor: f64, size: Size| CallEstimate {
        cost: size.factor(factor).add(call).add(CostEstimate::fixed(LIST_CREATE_BASE)),
        result: Some(size),
    };
    match (function, target, args) {
        ("sets.contains" | "sets.intersects" | "sets.equivalent", None, [a, b]) => {
            let factor = if function == "sets.equivalent" { 2.0 } else { 1.0 };
            Some(CallEstimate::cost(a.size().multiply(b.size()).factor(factor).add(call)))
        }
        ("slice", Some(list), [start, end]) => {
            let size = list.size();
            let start = start.literal_int.map_or(0, |i| i as u64);
            let end = end.literal_int.map_or(size.max, |i| i as u64);
            Some(allocating(1.0, CostEstimate::fixed(end.wrapping_sub(start))))
        }
        ("lists.range", None, [n]) => {
            Some(allocating(1.0, CostEstimate::fixed(n.literal_int.map_or(u64::MAX, |i| i as u64))))
        }
        ("reverse", Some(list), []) if matches!(list.ty, Type::List(_) | Type::Dyn) => {
            Some(allocating(1.0, list.size()))
        }
        ("flatten", Some(list), rest) if rest.len() <= 1 => {
            let depth = rest.first().map_or(1, |d| d.literal_int.map_or(u64::MAX, |i| i as u64));
            Some(allocating(depth as f64, list.size()))
        }
        ("distinct", Some(list), []) => Some(allocating(2.0, list.size().multiply(list.size()))),
        ("@sortByAssociatedKeys", Some(_), [keys]) => {
            let key = overload.and_then(|o| match o.params.get(1) {
                Some(Type::List(e)) => Some((**e).clone()),
                _ => None,
            });
            let factor = if matches!(key, Some(Type::String | Type::Bytes)) { 2.1 } else { 2.0 };
            Some(allocating(factor, keys.size().multiply(keys.size())))
        }
        ("sort", Some(list), []) => {
            let element = overload.and_then(|o| match o.params.first() {
                Some(Type::List(e)) => Some((**e).clone()),
                _ => None,
            });
            let factor = if matches!(element, Some(Type::String | Type::Bytes)) { 2.1 } else { 2.0 };
            Some(allocating(factor, list.size().multiply(list.size())))
        }
        _ => None,
    }
}

/// Kubernetes' library estimator (and DRA's `includes`), by function name.
/// `includes_by_size`: 1.37's lists library estimates `includes` as the
/// other O(n) list functions (one per element of the target's size); 1.36's
/// DRA `includes` charged the longest list attribute, flat.
fn kubernetes_estimate(
    sizes: &dyn SizeEstimator,
    function: &str,
    target: Option<&Node>,
    args: &[Node],
    includes_by_size: bool,
) -> Option<CallEstimate> {
    // `listElementNode`: the element of a list, for its size.
    let element_size = |list: &Node, element: &Type| {
        let mut path = list.path.clone();
        if !path.is_empty() {
            path.push("@items".to_owned());
        }
        sizes.estimate_size(&path, element).unwrap_or(UNKNOWN)
    };
    let one = CostEstimate::fixed(1);
    let traversal = |size: Size| size.factor(STRING_TRAVERSAL_FACTOR);
    let estimate = match function {
        "includes" if target.is_some() && !includes_by_size => {
            CallEstimate::cost(CostEstimate { min: 0, max: MAX_ATTRIBUTE_VALUES })
        }
        "includes" if target.is_some() => {
            let target = target?;
            let mut element_cost = one;
            if let Type::List(element) = &target.ty
                && matches!(**element, Type::String | Type::Bytes)
            {
                element_cost = element_cost.add(traversal(element_size(target, element)));
            }
            CallEstimate::cost(target.size().multiply(element_cost))
        }
        "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" => {
            let target = target?;
            match &target.ty {
                Type::List(element) => {
                    let mut element_cost = one;
                    if matches!(**element, Type::String | Type::Bytes) {
                        element_cost = element_cost.add(traversal(element_size(target, element)));
                    }
                    CallEstimate::cost(target.size().multiply(element_cost))
                }
                _ => CallEstimate::cost(traversal(target.size())),
            }
        }
        "url" if args.len() == 1 => {
            let size = args[0].size();
            CallEstimate { cost: traversal(size), result: Some(size) }
        }
        "lowerAscii" | "upperAscii" | "substring" | "trim" => {
            let size = target?.size();
            CallEstimate { cost: traversal(size), result: Some(size) }
        }
        "replace" if args.len() >= 2 => replace_estimate(target?.size(), args[0].size(), args[1].size()),
        "split" => {
            let size = target?.size();
            let max = args.get(1).and_then(|n| n.literal_int).map_or(size.max, |n| n as u64);
            CallEstimate {
                cost: size.factor(2.0 * STRING_TRAVERSAL_FACTOR),
                result: Some(CostEstimate { min: 0, max }),
            }
        }
        "join" => {
            let target = target?;
            let list = target.size();
            let mut size = match &target.ty {
                Type::List(element) => list.multiply(element_size(target, element)),
                _ => CostEstimate::fixed(0),
            };
            if let Some(separator) = args.first() {
                let separators = CostEstimate { min: list.min.saturating_sub(1), max: list.max.saturating_sub(1) };
                size = size.add(separator.size().multiply(separators));
            }
            CallEstimate { cost: traversal(size), result: Some(size) }
        }
        "find" | "findAll" if !args.is_empty() => {
            let size = target?.size();
            let text = size.add(one).factor(STRING_TRAVERSAL_FACTOR);
            let regex = args[0].size().factor(REGEX_LENGTH_FACTOR);
            CallEstimate { cost: text.multiply(regex), result: Some(CostEstimate { min: 0, max: size.max }) }
        }
        "cidr" | "isIP" | "isCIDR" if !args.is_empty() => CallEstimate::cost(traversal(args[0].size())),
        "ip" if target.is_some() => CallEstimate::cost(one),
        "ip" if !args.is_empty() => CallEstimate::cost(traversal(args[0].size())),
        "ip.isCanonical" if !args.is_empty() => {
            CallEstimate::cost(args[0].size().factor(2.0 * STRING_TRAVERSAL_FACTOR))
        }
        "masked"
        | "prefixLength"
        | "family"
        | "isUnspecified"
        | "isLoopback"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isGlobalUnicast" => CallEstimate::cost(one),
        "containsIP" | "containsCIDR" if !args.is_empty() => {
            let address = CostEstimate { min: 4, max: 16 };
            let mut cost = traversal(address.add(address));
            if function == "containsCIDR" {
                cost = cost.add(traversal(address)).add(one);
            }
            if args[0].ty == Type::String {
                cost = cost.add(traversal(args[0].size()));
            }
            CallEstimate::cost(cost)
        }
        // cel-go's `MaxNameFormatRegexSize` (128) regex steps per byte tenth.
        "validate" if !args.is_empty() => {
            CallEstimate::cost(traversal(args[0].size()).factor(128.0 * REGEX_LENGTH_FACTOR))
        }
        "quantity" | "isQuantity" | "semver" | "isSemver" if !args.is_empty() => {
            CallEstimate::cost(traversal(args[0].size()))
        }
        "format.named" | "sign" | "asInteger" | "isInteger" | "asApproximateFloat" | "isGreaterThan" | "isLessThan"
        | "compareTo" | "add" | "sub" | "major" | "minor" | "patch" | "getScheme" | "getHostname" | "getHost"
        | "getPort" | "getEscapedPath" | "getQuery" => CallEstimate::cost(one),
        "_==_" if args.len() == 2 && args[0].ty == args[1].ty => match &args[0].ty {
            Type::Object(ObjectType::Quantity | ObjectType::Semver | ObjectType::Ip | ObjectType::Cidr) => {
                CallEstimate::cost(one)
            }
            // cel-go's `MaxFormatSize` (64) bytes compared.
            Type::Object(ObjectType::NamedFormat) => {
                CallEstimate::cost(CostEstimate { min: 1, max: 64 }.factor(STRING_TRAVERSAL_FACTOR))
            }
            Type::Object(ObjectType::Url) => {
                let size = match (args[0].size, args[1].size) {
                    (Some(a), Some(b)) => a.union(b),
                    _ => CostEstimate::fixed(1),
                };
                CallEstimate::cost(CostEstimate { min: 1, max: size.max }.factor(STRING_TRAVERSAL_FACTOR))
            }
            _ => return None,
        },
        _ => return None,
    };
    Some(estimate)
}

/// One bound of `replace`'s estimate, as (replacements, characters kept):
/// an empty `old` matches between every character and keeps them all; a
/// replacement no longer than what it replaces (`shrinks`) keeps the string's
/// size and adds nothing; otherwise the string holds `size / old` matches.
fn replace_bound(size: u64, old: u64, shrinks: bool) -> (u64, u64) {
    if old == 0 {
        (if size < u64::MAX { size + 1 } else { size }, size)
    } else if shrinks {
        (0, size)
    } else {
        ((size as f64 / old as f64).ceil() as u64, 0)
    }
}

/// Kubernetes' estimate of `s.replace(old, new)`.
fn replace_estimate(size: Size, old: Size, new: Size) -> CallEstimate {
    let (count_max, retained_max) = replace_bound(size.max, old.min, new.max <= old.min);
    let (count_min, retained_min) = replace_bound(size.min, old.max, old.max <= new.min);
    let count = CostEstimate { min: count_min, max: count_max };
    let retained = CostEstimate { min: retained_min, max: retained_max };
    let result = count.multiply(new).add(retained);
    CallEstimate { cost: size.factor(2.0 * STRING_TRAVERSAL_FACTOR), result: Some(result) }
}

/// `computeExprSize`: the size of a literal.
fn literal_size(e: &IdedExpr) -> Option<Size> {
    let n = match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => s.inner().chars().count() as u64,
        Expr::Literal(LiteralValue::Bytes(b)) => b.len() as u64,
        Expr::Literal(_) => 1,
        Expr::List(l) => l.elements.len() as u64,
        Expr::Map(m) => m.entries.len() as u64,
        _ => return None,
    };
    Some(CostEstimate::fixed(n))
}

/// `computeTypeSize`: scalars have size one.
fn is_scalar(t: &Type) -> bool {
    match t {
        Type::Bool | Type::Double | Type::Duration | Type::Int | Type::Timestamp | Type::Uint => true,
        Type::Optional(inner) => is_scalar(inner),
        _ => false,
    }
}

/// What DRA's size estimator knows of a path from `device`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Decl {
    Device,
    Driver,
    MultiAlloc,
    OuterAttributes,
    InnerAttributes,
    Attribute,
    OuterCapacity,
    InnerCapacity,
    Quantity,
    Domain,
    Id,
}

impl Decl {
    fn max_elements(self) -> u64 {
        match self {
            Decl::Device | Decl::Quantity => 0,
            Decl::Driver => MAX_DRIVER_NAME_LENGTH,
            Decl::MultiAlloc => 1,
            Decl::OuterAttributes | Decl::InnerAttributes | Decl::OuterCapacity | Decl::InnerCapacity => {
                MAX_ATTRIBUTES_PER_DEVICE
            }
            Decl::Attribute => MAX_ATTRIBUTE_VALUE_LENGTH.max(MAX_ATTRIBUTE_VALUES),
            Decl::Domain => MAX_DOMAIN_LENGTH,
            Decl::Id => MAX_ID_LENGTH,
        }
    }

    fn element(self) -> Option<Decl> {
        match self {
            Decl::OuterAttributes => Some(Decl::InnerAttributes),
            Decl::InnerAttributes => Some(Decl::Attribute),
            Decl::OuterCapacity => Some(Decl::InnerCapacity),
            Decl::InnerCapacity => Some(Decl::Quantity),
            _ => None,
        }
    }

    fn key(self) -> Option<Decl> {
        match self {
            Decl::OuterAttributes | Decl::OuterCapacity => Some(Decl::Domain),
            Decl::InnerAttributes | Decl::InnerCapacity => Some(Decl::Id),
            _ => None,
        }
    }

    fn field(self, name: &str) -> Option<Decl> {
        match (self, name) {
            (Decl::Device, "driver") => Some(Decl::Driver),
            (Decl::Device, "attributes") => Some(Decl::OuterAttributes),
            (Decl::Device, "capacity") => Some(Decl::OuterCapacity),
            (Decl::Device, "allowMultipleAllocations") => Some(Decl::MultiAlloc),
            // Any field of an attribute map is an attribute.
            (Decl::InnerAttributes, _) => Some(Decl::Attribute),
            _ => None,
        }
    }
}

/// DRA's `sizeEstimator.EstimateSize`.
fn dra_size(path: &[String]) -> Option<Size> {
    let (root, rest) = path.split_first()?;
    if root != "device" {
        return None;
    }
    let mut node = Decl::Device;
    for name in rest {
        node = match name.as_str() {
            "@items" | "@values" => node.element()?,
            "@keys" => node.key()?,
            field => node.field(field)?,
        };
    }
    Some(CostEstimate { min: 0, max: node.max_elements() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::{Declarations, check};
    use crate::environment::CelEnvironment;

    /// Kubernetes' `testCostEstimator` (apiserver `library/cost_test.go`):
    /// any string or bytes value not otherwise known is at most 12 long.
    struct TestSizes;

    impl SizeEstimator for TestSizes {
        fn estimate_size(&self, _: &[String], ty: &Type) -> Option<CostEstimate> {
            matches!(ty, Type::String | Type::Bytes).then_some(CostEstimate { min: 0, max: 12 })
        }
    }

    fn estimated(expression: &str, sizes: &dyn SizeEstimator) -> CostEstimate {
        let env = crate::env::build().unwrap();
        let (ast, source) = env.parser().parse_with_source_info(expression).unwrap();
        let environment = CelEnvironment::default();
        let declarations = Declarations::for_environment(&environment);
        let checked = check(&ast, &source, &declarations, &environment).unwrap();
        estimate_with(&ast, &checked, sizes)
    }

    fn range(min: u64, max: u64) -> CostEstimate {
        CostEstimate { min, max }
    }

    /// The estimates of the apiserver's CEL library tests, restated; only
    /// the cases that are valid selectors (Kubernetes' selector environment
    /// requires homogeneous list literals, which those tests do not).
    #[test]
    fn library_estimates_match_kubernetes() {
        let strings = "['012345678901', '012345678901', '012345678901', '012345678901', '012345678901']";
        let cases: Vec<(String, CostEstimate)> = vec![
            ("[1, 2, 3, 4, 5].sum()".into(), range(15, 15)),
            ("[1.0, 2.0, 3.0, 4.0, 5.0].max()".into(), range(15, 15)),
            ("[false, true, false, true, false].isSorted()".into(), range(15, 15)),
            (format!("{strings}.min()"), range(15, 25)),
            (format!("{strings}.indexOf('x')"), range(15, 25)),
            ("[1, 2, 3, 4, 5].lastIndexOf(3)".into(), range(15, 15)),
            ("[uint(1), uint(2), uint(3), uint(4), uint(5)].indexOf(uint(3))".into(), range(21, 21)),
            ("'ABCDEFGHIJ abcdefghij'.lowerAscii()".into(), range(3, 3)),
            ("'ABCDEFGHIJ abcdefghij'.lowerAscii() == 'abcdefghij ABCDEFGHIJ'.lowerAscii()".into(), range(7, 9)),
            ("'ABCDEFGHIJ abcdefghij'.upperAscii() == 'abcdefghij ABCDEFGHIJ'.upperAscii()".into(), range(7, 9)),
            ("strings.quote('ABCDEFGHIJ abcdefghij')".into(), range(3, 3)),
            ("strings.quote('ABCDEFGHIJ abcdefghij') == strings.quote('ABCDEFGHIJ abcdefghij')".into(), range(7, 11)),
            ("'abc 123 def 123'.replace('123', '456')".into(), range(3, 3)),
            ("'abc 123 def 123'.replace('', 'x')".into(), range(3, 3)),
            ("'abc 123 def 123'.replace('123', '456', 1)".into(), range(3, 3)),
            ("'abc 123 def 123'.split(' ')".into(), range(3, 3)),
            ("'abc 123 def 123'.split(' ', 1)".into(), range(3, 3)),
            ("'abc 123 def 123'.substring(5, 8)".into(), range(2, 2)),
            ("'  abc 123 def 123  '.trim()".into(), range(2, 2)),
            ("['aa', 'bb', 'cc', 'd', 'e', 'f', 'g', 'h', 'i', 'j'].join(' ')".into(), range(11, 23)),
            ("['aa', 'bb', 'cc', 'd', 'e', 'f', 'g', 'h', 'i', 'j'].join()".into(), range(10, 22)),
            ("'abc 123 def 123'.find('123')".into(), range(2, 2)),
            ("'abc 123 def 123'.findAll('123', 1)".into(), range(2, 2)),
            (r#"quantity("12Mi")"#.into(), range(1, 1)),
            (r#"quantity("200M") == quantity("200M")"#.into(), range(3, 3)),
            (r#"quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")"#.into(), range(3, 6)),
            (r#"quantity("200M").compareTo(quantity("0.2G")) > 0"#.into(), range(4, 4)),
            (r#"quantity("50k").add(quantity("20")) == quantity("50.02k")"#.into(), range(5, 5)),
            (r#"quantity("50k").sub(20) == quantity("49980")"#.into(), range(4, 4)),
            (r#"quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() > 0"#.into(), range(7, 7)),
            (r#"quantity("50").isInteger()"#.into(), range(2, 2)),
            (r#"quantity("50.703k").asApproximateFloat() > 0.0"#.into(), range(3, 3)),
            ("sets.contains([], [])".into(), range(21, 21)),
            ("sets.contains([1], [1, 1])".into(), range(23, 23)),
            ("sets.contains([1, 2, 3, 4], [2, 3])".into(), range(29, 29)),
            ("!sets.contains([1], [1, 2])".into(), range(24, 24)),
            ("sets.equivalent([1], [1, 1])".into(), range(25, 25)),
            ("!sets.equivalent([2, 1], [1])".into(), range(26, 26)),
            ("sets.intersects([1], [1, 2])".into(), range(23, 23)),
            ("!sets.intersects([], [])".into(), range(22, 22)),
            (r#"semver("1234.56789012345.67890123456789")"#.into(), range(4, 4)),
            (r#"semver("1.2.3").major()"#.into(), range(2, 2)),
            (r#"semver("1.0.0").compareTo(semver("1.2.3"))"#.into(), range(3, 3)),
            (r#"format.named("dns1123Label").value().validate("my-name")"#.into(), range(34, 34)),
            (r#"format.named("dns1123Label").value() == format.named("dns1123Label").value()"#.into(), range(5, 11)),
            ("{'a': 1, 'b': 2}.all(k, v, v > 0)".into(), range(37, 41)),
            ("{'a': 1, 'b': 2}.exists(k, v, v > 0)".into(), range(39, 43)),
            ("{'a': 1, 'b': 2}.existsOne(k, v, v > 0)".into(), range(38, 40)),
            ("{'a': 1, 'b': 2}.transformMap(k, v, v + 1)".into(), range(71, 71)),
            ("{'a': 1, 'b': 2}.transformMap(k, v, v < 5, v + 1)".into(), range(67, 75)),
            ("{'a': 1, 'b': 2}.transformMapEntry(k, v, {k: v + 1})".into(), range(131, 131)),
            ("{'a': 1, 'b': 2}.transformMapEntry(k, v, v < 5, {k: v + 1})".into(), range(67, 135)),
            ("[1, 2].all(i, v, v > 0)".into(), range(17, 21)),
            ("[1, 2].exists(i, v, v > 0)".into(), range(19, 23)),
            ("[1, 2].existsOne(i, v, v > 0)".into(), range(18, 20)),
        ];
        for (expression, expected) in cases {
            assert_eq!(estimated(&expression, &TestSizes), expected, "{expression}");
        }
    }

    /// DRA's sizes bound what `device` holds: every estimate covers the
    /// actual cost Kubernetes measures in `cel/compile_test.go`.
    #[test]
    fn device_estimates_cover_kubernetes_actual_costs() {
        for (expression, actual) in [
            (r#"device.driver == """#, 2),
            (r#"device.driver == "dra.example.com""#, 4),
            (r#""dra.example.com" in device.attributes"#, 3),
            (r#"device.attributes["dra.example.com"].name"#, 4),
            (r#"device.attributes["dra.example.com"].name > 0"#, 5),
            (r#"cel.bind(dra, device.attributes["dra.example.com"], dra.name)"#, 15),
            (r#"device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))"#, 6),
            (r#"device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))"#, 6),
            (r#"device.attributes.exists_one(x, x == "dra.example.com")"#, 164),
            (r#"device.attributes["dra.example.com"].exists_one(x, x == "services")"#, 133),
            (r#"device.attributes["dra.example.com"].services.split("example").size() >= 2"#, 19),
            (r#"device.attributes["dra.example.com"].services.matches("[^a]?sym")"#, 18),
            ("device.allowMultipleAllocations == true", 3),
        ] {
            let estimate = estimated(expression, &DeviceSizes);
            assert!(estimate.max >= actual, "{expression}: {estimate:?} < {actual}");
        }
        assert_eq!(estimated(r#"device.driver == """#, &DeviceSizes), range(2, 2));
        assert_eq!(estimated(r#"device.attributes["dra.example.com"].name"#, &DeviceSizes), range(4, 4));
    }

    /// Five nested ten-element loops are within Kubernetes' limit; seven are
    /// not (the "expensive" case of `cel/compile_test.go`).
    #[test]
    fn nested_loops_are_estimated_per_level() {
        let nest = |levels: usize| {
            let mut expression = "int('1'.find('[0-9]*')) < 100".to_owned();
            for level in 0..levels {
                expression = format!("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x{level}, {expression})");
            }
            expression
        };
        let five = estimated(&nest(5), &DeviceSizes);
        assert!(five.max <= 1_000_000 && five.max >= 855_551, "{five:?}");
        assert!(estimated(&nest(7), &DeviceSizes).max > 1_000_000);
    }
}
