//! List-typed attributes (DRAListTypeAttributes) in selectors: the cases of
//! `k8s.io/dynamic-resource-allocation@v0.37.2/cel/compile_test.go` that
//! involve lists, `includes` or comprehensions over attributes, restated as
//! data (expression, attributes, gate, kind of expression, outcome, the
//! estimated cost Kubernetes computes), plus what the version rules imply.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use super::*;

const DRIVER: &str = "dra.example.com";
/// `max(DeviceAttributeMaxValueLength, ResourceSliceMaxAttributeValuesPerDevice)`.
const MAX_ELEMENTS: u64 = 64;

#[derive(Debug, Clone)]
enum Value {
    Int(i64),
    Bool(bool),
    Str(&'static str),
    Version(&'static str),
    Ints(Vec<i64>),
    Bools(Vec<bool>),
    Strs(Vec<String>),
    Versions(Vec<&'static str>),
}

fn attribute(value: &Value) -> DeviceAttribute {
    let mut a = DeviceAttribute::default();
    match value {
        Value::Int(i) => a.int = Some(*i),
        Value::Bool(b) => a.bool = Some(*b),
        Value::Str(s) => a.string = Some((*s).to_owned()),
        Value::Version(v) => a.version = Some((*v).to_owned()),
        Value::Ints(v) => a.ints = Some(v.clone()),
        Value::Bools(v) => a.bools = Some(v.clone()),
        Value::Strs(v) => a.strings = Some(v.clone()),
        Value::Versions(v) => a.versions = Some(v.iter().map(|s| (*s).to_owned()).collect()),
    }
    a
}

fn strs(values: &[&str]) -> Value {
    Value::Strs(values.iter().map(|s| (*s).to_owned()).collect())
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Match(bool),
    EvalError(&'static str),
    CompileError(&'static str),
}

struct Case {
    name: &'static str,
    /// `None`: both gate values (the upstream case sets no features).
    gate: Option<bool>,
    /// `None`: both kinds of expression.
    kind: Option<ExpressionKind>,
    expression: String,
    /// Attribute `name` (or `names`) of driver `dra.example.com`.
    attribute: Option<(&'static str, Value)>,
    outcome: Outcome,
    /// Kubernetes' estimate (checked when the expression compiles).
    cost: u64,
}

fn attr(expression_tail: &str) -> String {
    format!(r#"device.attributes["dra.example.com"].{expression_tail}"#)
}

/// One case as a table row, in `Case`'s field order.
type Row = (&'static str, Option<bool>, Option<ExpressionKind>, String, Option<(&'static str, Value)>, Outcome, u64);

/// `compile_test.go`'s list cases (v0.37.2), by name, one row a case
/// (left unformatted so that a row reads as one line of the table).
#[rustfmt::skip]
fn upstream_cases() -> Vec<Case> {
    use ExpressionKind::New;
    use Outcome::*;
    let on = Some(true);
    let off = Some(false);
    let includes = 4 + MAX_ELEMENTS;
    let rows: Vec<Row> = vec![
        ("macro-compilation-error-new-expressions", off, Some(New), attr("ids.exists(id, id == 1)"), None, CompileError("expression of type 'any' cannot be range of a comprehension"), 0),
        ("macro-exists-on-int", on, None, attr("name.exists(x, x > 0)"), Some(("name", Value::Int(1))), EvalError("int"), 5 + (3 + 3) * MAX_ELEMENTS),
        ("macro-exists-on-bool", on, None, attr("name.exists(x, x == true)"), Some(("name", Value::Bool(true))), EvalError("bool"), 5 + (3 + 3) * MAX_ELEMENTS),
        ("macro-exists-on-string", on, None, attr(r#"name.exists(x, x == "fish")"#), Some(("name", Value::Str("fish"))), EvalError("string"), 5 + (3 + 3) * MAX_ELEMENTS),
        ("list-result-type-causes-match-error", None, None, attr("names"), Some(("names", strs(&["fish", "bird"]))), EvalError("bool"), 4),
        ("includes-function-can-evaluate", on, None, attr(r#"name.includes("fish")"#), Some(("name", strs(&["fish", "bird"]))), Match(true), includes),
        ("list-of-bool", None, None, attr("names.size() == 2"), Some(("names", Value::Bools(vec![true, false]))), Match(true), 6),
        ("list-of-int", None, None, attr("names.size() == 2"), Some(("names", Value::Ints(vec![1, 2]))), Match(true), 6),
        ("list-of-string", None, None, attr("names.size() == 2"), Some(("names", strs(&["fish", "bird"]))), Match(true), 6),
        ("list-of-semver", None, None, attr("names.size() == 2"), Some(("names", Value::Versions(vec!["1.0.0", "2.0.0"]))), Match(true), 6),
        ("macro-on-list-of-int", on, None, attr("names.exists(x, x > 0)"), Some(("names", Value::Ints(vec![1, 2]))), Match(true), 5 + (3 + 3) * MAX_ELEMENTS),
        ("macro-on-list-of-string", on, None, attr(r#"names.all(x, x != "")"#), Some(("names", strs(&["fish", "bird"]))), Match(true), 5 + (2 + 2) * MAX_ELEMENTS),
        ("macro-on-list-of-semver", on, None, attr(r#"names.all(x, x.isGreaterThan(semver("0.0.1")))"#), Some(("names", Value::Versions(vec!["1.0.0", "2.0.0"]))), Match(true), 5 + (2 + 4) * MAX_ELEMENTS),
        ("includes-function-compilation-error", off, Some(New), attr(r#"attr.includes("fish")"#), None, CompileError("undeclared reference to 'includes'"), 0),
        ("includes-function-compilation-and-eval-success", on, None, attr(r#"attr.includes("fish")"#), Some(("attr", Value::Str("fish"))), Match(true), includes),
        ("includes-function-on-bool-scalar-positive", on, None, attr("name.includes(true)"), Some(("name", Value::Bool(true))), Match(true), includes),
        ("includes-function-on-bool-scalar-negative", on, Some(New), attr("name.includes(true)"), Some(("name", Value::Bool(false))), Match(false), includes),
        ("includes-function-on-bool-list-positive", on, None, attr("name.includes(true)"), Some(("name", Value::Bools(vec![true, false]))), Match(true), includes),
        ("includes-function-on-bool-list-negative", on, None, attr("name.includes(false)"), Some(("name", Value::Bools(vec![true, true]))), Match(false), includes),
        ("includes-function-on-int-scalar-positive", on, None, attr("name.includes(1)"), Some(("name", Value::Int(1))), Match(true), includes),
        ("includes-function-on-int-scalar-negative", on, None, attr("name.includes(1)"), Some(("name", Value::Int(2))), Match(false), includes),
        ("includes-function-on-int-list-positive", on, None, attr("name.includes(1)"), Some(("name", Value::Ints(vec![1, 2]))), Match(true), includes),
        ("includes-function-on-int-list-negative", on, None, attr("name.includes(3)"), Some(("name", Value::Ints(vec![1, 2]))), Match(false), includes),
        ("includes-function-on-string-scalar-positive", on, None, attr(r#"name.includes("fish")"#), Some(("name", Value::Str("fish"))), Match(true), includes),
        ("includes-function-on-string-scalar-negative", on, None, attr(r#"name.includes("bird")"#), Some(("name", Value::Str("fish"))), Match(false), includes),
        ("includes-function-on-string-list-positive", on, None, attr(r#"name.includes("fish")"#), Some(("name", strs(&["fish", "bird"]))), Match(true), includes),
        ("includes-function-on-string-list-negative", on, None, attr(r#"name.includes("cat")"#), Some(("name", strs(&["fish", "bird"]))), Match(false), includes),
        ("includes-function-on-semver-scalar-positive", on, None, attr(r#"name.includes(semver("1.0.0"))"#), Some(("name", Value::Version("1.0.0"))), Match(true), includes + 1),
        ("includes-function-on-semver-scalar-negative", on, None, attr(r#"name.includes(semver("2.0.0"))"#), Some(("name", Value::Version("1.0.0"))), Match(false), includes + 1),
        ("includes-function-on-semver-list-positive", on, None, attr(r#"name.includes(semver("1.0.0"))"#), Some(("name", Value::Versions(vec!["1.0.0", "2.0.0"]))), Match(true), includes + 1),
        ("includes-function-on-semver-list-negative", on, None, attr(r#"name.includes(semver("3.0.0"))"#), Some(("name", Value::Versions(vec!["1.0.0", "2.0.0"]))), Match(false), includes + 1),
        ("includes-function-on-very-long-list-positive", on, None, attr(r#"name.includes("value-48")"#), Some(("name", Value::Strs((0..48).map(|i| format!("value-{i}")).collect()))), Match(false), includes),
        ("in-operator-on-list", None, None, format!("1 in {}", attr("names")), Some(("names", Value::Ints(vec![1, 2, 3]))), Match(true), includes),
        ("macro-exists-on-version", on, None, attr(r#"name.exists(x, x.isGreaterThan(semver("0.0.1")))"#), Some(("name", Value::Version("1.0.0"))), EvalError("Semver"), 5 + (3 + 4) * MAX_ELEMENTS),
    ];
    rows.into_iter()
        .map(|(name, gate, kind, expression, attribute, outcome, cost)| Case { name, gate, kind, expression, attribute, outcome, cost })
        .collect()
}

fn device_with(attribute: &Option<(&'static str, Value)>) -> Device {
    let mut attributes = BTreeMap::new();
    if let Some((name, value)) = attribute {
        attributes.insert((*name).to_owned(), self::attribute(value));
    }
    Device { name: "d".to_owned(), attributes: Some(attributes), ..Default::default() }
}

fn environment(kind: ExpressionKind, gate: bool) -> CelEnvironment {
    let base = match kind {
        ExpressionKind::Stored => CelEnvironment::stored_expressions(37),
        ExpressionKind::New => CelEnvironment::new_expressions(37),
    };
    CelEnvironment { list_type_attributes: gate, ..base }
}

/// Runs one case in one environment; the failure, if any, as text.
fn run(case: &Case, env: CelEnvironment) -> Result<(), String> {
    let compiled = match (SelectorEnv::for_environment(env).compile(&case.expression), case.outcome) {
        (Err(e), Outcome::CompileError(needle)) if e.to_string().contains(needle) => return Ok(()),
        (Err(e), _) => return Err(format!("compile error {e}")),
        (Ok(_), Outcome::CompileError(needle)) => return Err(format!("compiled, expected an error with {needle:?}")),
        (Ok(c), _) => c,
    };
    if compiled.estimated_cost().max != case.cost {
        return Err(format!("estimated cost {}, Kubernetes {}", compiled.estimated_cost().max, case.cost));
    }
    let device = CelDevice::new(DRIVER, &device_with(&case.attribute)).map_err(|e| e.to_string())?;
    match (compiled.matches(&device), case.outcome) {
        (Ok(got), Outcome::Match(want)) if got == want => Ok(()),
        (Err(e), Outcome::EvalError(needle)) if e.to_string().contains(needle) => Ok(()),
        (got, want) => Err(format!("evaluated to {got:?}, expected {want:?}")),
    }
}

/// Every upstream case in every environment it runs in, at 1.37.
#[test]
fn kubernetes_list_attribute_cases() {
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in upstream_cases() {
        let gates = case.gate.map_or(vec![true, false], |g| vec![g]);
        let kinds = case.kind.map_or(vec![ExpressionKind::New, ExpressionKind::Stored], |k| vec![k]);
        for &gate in &gates {
            for &kind in &kinds {
                runs += 1;
                if let Err(e) = run(&case, environment(kind, gate)) {
                    failures.push(format!("{} (gate {gate}, {kind:?}): {e}", case.name));
                }
            }
        }
    }
    assert!(runs > 60, "{runs} runs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn numa(values: Vec<i64>) -> Device {
    device_with(&Some(("numaNodes", Value::Ints(values))))
}

/// A 1.37 scheduler evaluates stored selectors with attributes declared
/// `dyn` whatever the gate says: a comprehension over a list attribute is
/// valid there (cel-go: a `dyn` range), and refused only in the
/// apiserver's new-expression check with the gate off.
#[test]
fn stored_selectors_range_over_list_attributes_in_1_37_whatever_the_gate() {
    let exists = attr("numaNodes.exists(n, n == 1)");
    let scheduler = SelectorEnv::for_environment(CelEnvironment::stored_expressions(37));
    let compiled = scheduler.compile(&exists).expect("a 1.37 scheduler type-checks a dyn range");
    let device = CelDevice::new(DRIVER, &numa(vec![0, 1])).expect("device");
    assert_eq!(compiled.matches(&device), Ok(true));
    let device = CelDevice::new(DRIVER, &numa(vec![2])).expect("device");
    assert_eq!(compiled.matches(&device), Ok(false));

    let apiserver = SelectorEnv::for_environment(CelEnvironment::new_expressions(37));
    let err = apiserver.compile(&exists).expect_err("gate off: the attribute is `any`").to_string();
    assert!(err.contains("expression of type 'any' cannot be range of a comprehension"), "{err}");
    let gated = CelEnvironment { list_type_attributes: true, ..CelEnvironment::new_expressions(37) };
    assert!(SelectorEnv::for_environment(gated).compile(&exists).is_ok());

    // 1.36 picks the type from the gate for both kinds.
    let stored_136 = SelectorEnv::for_environment(CelEnvironment::stored_expressions(36));
    let err = stored_136.compile(&exists).expect_err("1.36, gate off").to_string();
    assert!(err.contains("'any' cannot be range"), "{err}");
    let gated_136 = CelEnvironment { list_type_attributes: true, ..CelEnvironment::stored_expressions(36) };
    assert!(SelectorEnv::for_environment(gated_136).compile(&exists).is_ok());
    // Before 1.36 there is no such gate.
    let old = CelEnvironment { list_type_attributes: true, ..CelEnvironment::stored_expressions(35) };
    assert!(SelectorEnv::for_environment(old).compile(&exists).is_err());
}

/// Every comprehension macro ranges over a list attribute and evaluates as
/// cel-go does, estimated as Kubernetes 1.37 estimates it (figures from
/// `CompileCELExpression` of dynamic-resource-allocation v0.37.2, gate on,
/// new expressions). A two-variable comprehension over an attribute has no
/// bound there (cel-go sizes no index of a `dyn` range), so it is refused
/// as new and evaluated as stored.
#[test]
fn every_comprehension_over_a_list_attribute() {
    let gated = CelEnvironment { list_type_attributes: true, ..CelEnvironment::new_expressions(37) };
    let env = SelectorEnv::for_environment(gated);
    let device = CelDevice::new(DRIVER, &numa(vec![0, 1, 2])).expect("device");
    let bound = |tail: &str| format!(r#"cel.bind(a, device.attributes["dra.example.com"], {tail})"#);
    for (expression, want, cost) in [
        (attr("numaNodes.all(n, n < 3)"), true, 325),
        (attr("numaNodes.all(n, n < 2)"), false, 325),
        (attr("numaNodes.exists(n, n == 2)"), true, 389),
        (attr("numaNodes.exists_one(n, n > 1)"), true, 262),
        (attr("numaNodes.exists_one(n, n > 0)"), false, 262),
        (attr("numaNodes.map(n, n * 2).exists(m, m == 4)"), true, 1296),
        (attr("numaNodes.filter(n, n % 2 == 0).size() == 2"), true, 1041),
        (attr("numaNodes.map(n, n > 0, n * 10) == [10, 20]"), true, 1050),
        (bound("a.numaNodes.includes(1) && !a.numaNodes.includes(7)"), true, 146),
        (bound("a.numaNodes.size() == 3 && 2 in a.numaNodes"), true, 83),
    ] {
        let compiled = env.compile(&expression).unwrap_or_else(|e| panic!("{expression}: {e}"));
        assert_eq!(compiled.estimated_cost().max, cost, "{expression}");
        assert_eq!(compiled.matches(&device), Ok(want), "{expression}");
    }
    let two_variables = attr("numaNodes.all(i, n, i == n)");
    assert!(matches!(env.compile(&two_variables), Err(CompileError::TooComplex { .. })));
    let stored = SelectorEnv::for_environment(CelEnvironment::stored_expressions(37));
    assert_eq!(stored.compile(&two_variables).expect("stored").matches(&device), Ok(true));
}

/// `includes`: 1.36's DRA function stops with an error past element 48 of a
/// longer list when the value was not found before, and is estimated at 48
/// flat; 1.37's lists library function has no limit and is estimated by the
/// target's size.
#[test]
fn includes_differs_between_1_36_and_1_37() {
    let long: Vec<String> = (0..60).map(|i| i.to_string()).collect();
    let literal = format!("[{}].includes(59)", long.join(", "));
    let early = format!("[{}].includes(3)", long.join(", "));
    let v136 = SelectorEnv::for_environment(CelEnvironment {
        list_type_attributes: true,
        ..CelEnvironment::stored_expressions(36)
    });
    let v137 = SelectorEnv::for_environment(CelEnvironment::stored_expressions(37));
    let none = CelDevice::new(DRIVER, &device_with(&None)).expect("device");
    let err = v136.compile(&literal).expect("compiles").matches(&none).expect_err("past 48");
    assert!(err.to_string().contains("cannot be applied to lists longer than 48 values"), "{err}");
    assert_eq!(v136.compile(&early).expect("compiles").matches(&none), Ok(true), "found before the limit");
    assert_eq!(v137.compile(&literal).expect("compiles").matches(&none), Ok(true));

    let on_attribute = attr("name.includes(1)");
    assert_eq!(v136.compile(&on_attribute).expect("compiles").estimated_cost().max, 4 + 48);
    assert_eq!(v137.compile(&on_attribute).expect("compiles").estimated_cost().max, 4 + MAX_ELEMENTS);
    // A literal list's size is known: three ints, one each (plus the list).
    assert_eq!(v137.compile("[1, 2, 3].includes(2)").expect("compiles").estimated_cost().max, 10 + 3);
}

/// The result may be the attribute's declared type: `dyn` where attributes
/// are `dyn` (a list there is then a runtime error), `any` otherwise.
#[test]
fn the_result_may_be_the_declared_attribute_type() {
    let dyn_result = "dyn(true)";
    let stored_137 = SelectorEnv::for_environment(CelEnvironment::stored_expressions(37));
    assert!(stored_137.compile(dyn_result).is_ok());
    let new_137 = SelectorEnv::for_environment(CelEnvironment::new_expressions(37));
    let err = new_137.compile(dyn_result).expect_err("attributes are `any` there").to_string();
    assert!(err.contains("must evaluate to bool or the unknown type, not dyn"), "{err}");
    assert!(new_137.compile(&attr("name")).is_ok(), "`any` is the attribute type there");
}
