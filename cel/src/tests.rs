use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use super::*;

const DRIVER: &str = "gpu.nvidia.com";

fn attr_string(s: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.to_owned()), ..Default::default() }
}

fn h100() -> Device {
    let mut attributes = BTreeMap::new();
    attributes.insert("productName".to_owned(), attr_string("H100"));
    attributes.insert("index".to_owned(), DeviceAttribute { int: Some(3), ..Default::default() });
    attributes.insert("mig".to_owned(), DeviceAttribute { bool: Some(false), ..Default::default() });
    attributes.insert(
        "driverVersion".to_owned(),
        DeviceAttribute { version: Some("550.54.15".to_owned()), ..Default::default() },
    );
    attributes.insert("resource.kubernetes.io/pcieRoot".to_owned(), attr_string("pci0000:00"));
    let mut capacity = BTreeMap::new();
    capacity
        .insert("memory".to_owned(), DeviceCapacity { value: K8sQuantity("80Gi".to_owned()), ..Default::default() });
    capacity.insert(
        "example.com/slots".to_owned(),
        DeviceCapacity { value: K8sQuantity("4".to_owned()), ..Default::default() },
    );
    Device { name: "gpu-0".to_owned(), attributes: Some(attributes), capacity: Some(capacity), ..Default::default() }
}

fn eval(expression: &str) -> Result<bool, String> {
    let env = SelectorEnv::new();
    let device = CelDevice::new(DRIVER, &h100()).map_err(|e| e.to_string())?;
    let compiled = env.compile(expression).map_err(|e| format!("compile: {e}"))?;
    compiled.matches(&device).map_err(|e| e.to_string())
}

fn holds(expression: &str) {
    assert_eq!(eval(expression), Ok(true), "{expression}");
}

#[test]
fn driver_attributes_and_capacity() {
    holds(r#"device.driver == "gpu.nvidia.com""#);
    holds(r#"device.attributes["gpu.nvidia.com"].productName == "H100""#);
    holds(r#"device.attributes["gpu.nvidia.com"].index == 3 && !device.attributes["gpu.nvidia.com"].mig"#);
    holds(r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#);
    holds(r#"device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))"#);
    holds(r#"device.capacity["example.com"].slots == quantity("4")"#);
    holds("!device.allowMultipleAllocations");
}

fn fails_with(expression: &str, needle: &str) {
    match eval(expression) {
        Err(e) => assert!(e.contains(needle), "{expression}: error {e:?} does not mention {needle:?}"),
        Ok(v) => panic!("{expression}: expected an error mentioning {needle:?}, got {v}"),
    }
}

#[test]
fn unknown_domain_is_an_empty_map_and_unknown_id_an_error() {
    holds(r#"device.attributes["example.org"].size() == 0"#);
    holds(r#"!has(device.attributes["example.org"].foo)"#);
    holds(r#"!("foo" in device.attributes["example.org"])"#);
    holds(r#"!("example.org" in device.attributes) && "gpu.nvidia.com" in device.attributes"#);
    holds(r#""resource.kubernetes.io" in device.attributes && "example.com" in device.capacity"#);
    fails_with(r#"device.attributes["example.org"].foo == 1"#, "No such key: foo");
    fails_with(r#"device.attributes["example.org"]["foo"] == 1"#, "No such key: foo");
    fails_with(r#"device.attributes["gpu.nvidia.com"].nope == 1"#, "No such key: nope");
    fails_with(r#"device.capacity["gpu.nvidia.com"].nope.isGreaterThan(quantity("0"))"#, "No such key: nope");
}

#[test]
fn has_and_in_on_attributes() {
    holds(r#"has(device.attributes["gpu.nvidia.com"].productName)"#);
    holds(r#"!has(device.attributes["gpu.nvidia.com"].missing)"#);
    holds(r#""index" in device.attributes["gpu.nvidia.com"]"#);
    holds(r#"has(device.capacity["gpu.nvidia.com"].memory)"#);
    holds(r#"device.attributes.exists_one(d, d == "resource.kubernetes.io")"#);
    holds(r#"device.attributes["gpu.nvidia.com"].all(id, id != "")"#);
    holds(r#"device.capacity["gpu.nvidia.com"].exists(id, id == "memory")"#);
    holds(r#"[1, 2, 3].map(x, x * 2).filter(x, x > 2) == [4, 6]"#);
}

#[test]
fn result_must_be_bool() {
    fails_with(r#"device.attributes["gpu.nvidia.com"].index"#, "must evaluate to bool, got int");
    fails_with(r#"device.attributes["gpu.nvidia.com"].productName"#, "must evaluate to bool, got string");
    assert_eq!(eval("false"), Ok(false));
}

#[test]
fn compile_errors_say_what_is_wrong() {
    let env = SelectorEnv::new();
    let long = format!("device.driver == \"{}\"", "x".repeat(MAX_EXPRESSION_BYTES));
    let err = env.compile(&long).unwrap_err();
    assert!(err.to_string().contains("limit of 10240 bytes"), "{err}");
    let at_limit = format!("{}true", " ".repeat(MAX_EXPRESSION_BYTES - 4));
    assert!(env.compile(&at_limit).is_ok(), "exactly 10 Ki is allowed");
    let err = env.compile("?!").unwrap_err();
    assert!(matches!(err, CompileError::Syntax(_)), "{err}");
    let err = env.compile(r#"device.driver.matches("[unclosed")"#).unwrap_err();
    assert!(err.to_string().contains("invalid regular expression"), "{err}");
    let err = env.compile("1").unwrap_err();
    assert!(err.to_string().contains("must evaluate to bool"), "{err}");
    let err = env.compile("devices.driver == \"x\"").unwrap_err();
    assert_eq!(err.to_string(), "type error: 1:1: undeclared reference to 'devices' (in container '')");
    assert!(env.compile("[1].all(x, x > 0 && cel.bind(y, x, y == x)) && x > 0").is_err(), "x is out of scope");
    assert!(
        env.compile("type(device) == map && sets.contains([1], [1]) && optional.none() == optional.none()").is_ok()
    );
    let err = env.compile("cel.bind(a.b, 1, true)").unwrap_err();
    assert!(err.to_string().contains("simple identifier"), "{err}");
}

#[test]
fn compiled_programs_and_errors_are_cached_by_text() {
    let env = SelectorEnv::new();
    let a = env.compile("device.driver != \"\"").unwrap();
    let b = env.compile("device.driver != \"\"").unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.expression(), "device.driver != \"\"");
    assert_eq!(env.compile("?!").unwrap_err(), env.compile("?!").unwrap_err());
}

#[test]
fn selector_env_and_programs_are_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<SelectorEnv>();
    send_sync::<CompiledSelector>();
    send_sync::<CelDevice>();
    let env = Arc::new(SelectorEnv::new());
    let device = Arc::new(CelDevice::new(DRIVER, &h100()).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (env, device) = (Arc::clone(&env), Arc::clone(&device));
            std::thread::spawn(move || env.compile("device.driver == \"gpu.nvidia.com\"").unwrap().matches(&device))
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), Ok(true));
    }
}

#[test]
fn quantity_functions() {
    holds(r#"quantity("1Gi").isGreaterThan(quantity("1G"))"#);
    holds(r#"quantity("1000Mi").isLessThan(quantity("1Gi"))"#);
    holds(r#"quantity("1k") == quantity("1000") && quantity("1Ki") == quantity("1024")"#);
    holds(r#"quantity("1500m").compareTo(quantity("1.5")) == 0 && quantity("2").compareTo(quantity("1.5")) == 1"#);
    holds(r#"quantity("1e3").compareTo(quantity("1Ki")) == -1"#);
    holds(r#"device.capacity["gpu.nvidia.com"].memory == quantity("81920Mi")"#);
    holds(r#"quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi") && quantity("1").add(2) == quantity("3")"#);
    holds(r#"quantity("1Gi").sub(quantity("512Mi")) == quantity("512Mi") && sign(quantity("5").sub(7)) == -1"#);
    holds(r#"quantity("2k").asInteger() == 2000 && quantity("1.5").isInteger() == false"#);
    holds(r#"quantity("500m").asApproximateFloat() == 0.5 && sign(quantity("0")) == 0"#);
    holds(r#"isQuantity("1.5Gi") && !isQuantity("1.5GiB") && !isQuantity("")"#);
    fails_with(r#"quantity("1.5").asInteger() == 1"#, "cannot convert value to integer");
    fails_with(r#"sign(quantity("12 apples")) == 1"#, "not a valid quantity");
    fails_with(r#"quantity("1").isGreaterThan(1)"#, "no matching overload");
    fails_with(r#"quantity("1") < quantity("2")"#, "no matching overload");
    fails_with(r#"device.capacity["gpu.nvidia.com"].memory > quantity("2")"#, "no matching overload");
    fails_with(r#"semver("1.0.0").isLessThan(quantity("2"))"#, "no matching overload");
    holds(r#"!quantity("1").isGreaterThan(quantity("1")) && !quantity("1").isLessThan(quantity("1"))"#);
}

#[test]
fn semver_functions_and_version_attributes() {
    holds(r#"device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))"#);
    holds(r#"device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("550.54.15")) == 0"#);
    holds(r#"device.attributes["gpu.nvidia.com"].driverVersion == semver("550.54.15+build")"#);
    holds(r#"semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3"#);
    holds(r#"semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))"#);
    holds(r#"semver("1.10.0").isGreaterThan(semver("1.9.0"))"#);
    fails_with(r#"semver("1.0.0") < semver("2.0.0")"#, "no matching overload");
    holds(r#"isSemver("1.2.3") && !isSemver("v1.2.3") && isSemver("v1.2", true)"#);
    holds(r#"semver("v1.2", true) == semver("1.2.0")"#);
    fails_with(r#"semver("1.2").major() == 1"#, "not a valid semantic version");
}

#[test]
fn string_extension_functions() {
    holds(r#""H100".lowerAscii() == "h100" && "h100".upperAscii() == "H100""#);
    holds(r#""a,b,c".split(",") == ["a", "b", "c"] && "a,b,c".split(",", 2) == ["a", "b,c"]"#);
    holds(r#""a,b".split(",", 0) == [] && "ab".split("") == ["a", "b"]"#);
    holds(r#"["a", "b"].join("-") == "a-b" && ["a", "b"].join() == "ab""#);
    holds(r#""aaa".replace("a", "b") == "bbb" && "aaa".replace("a", "b", 2) == "bba""#);
    holds(r#""hello".substring(1) == "ello" && "hello".substring(1, 3) == "el""#);
    holds(r#""hello".indexOf("l") == 2 && "hello".indexOf("l", 3) == 3 && "hello".indexOf("z") == -1"#);
    holds(r#""hello".lastIndexOf("l") == 3 && "hello".lastIndexOf("l", 2) == 2 && "hello".lastIndexOf("h", 0) == 0"#);
    holds(r#""  x ".trim() == "x" && "héllo".charAt(1) == "é" && "abc".charAt(3) == """#);
    holds(r#""héllo".indexOf("l") == 2"#);
    holds(r#""H100-SXM".contains("SXM") && "H100".startsWith("H") && "H100".endsWith("00") && size("héllo") == 5"#);
    fails_with(r#""abc".substring(2, 1) == """#, "invalid substring range");
    fails_with(r#""abc".charAt(4) == """#, "index out of range");
}

#[test]
fn matches_uses_re2_syntax_unanchored() {
    holds(r#"device.attributes["gpu.nvidia.com"].productName.matches("^H[0-9]+$")"#);
    holds(r#"matches("asymetric", "[^a]?sym")"#);
    holds(r#"!"A100".matches("^H")"#);
    // A runtime pattern is compiled once per thread and reused.
    holds(r#"["H100", "H200"].all(p, p.matches("^H" + "[0-9]+"))"#);
    fails_with(r#""x".matches("(" + "")"#, "invalid regular expression");
}

#[test]
fn bind_evaluates_with_a_named_value() {
    holds(r#"cel.bind(gpu, device.attributes["gpu.nvidia.com"], gpu.productName == "H100" && gpu.index == 3)"#);
    holds(r#"cel.bind(x, 2, cel.bind(y, x + 1, x * y == 6))"#);
    holds(r#"cel.bind(xs, [1, 2, 3], xs.exists(x, x == 2) && size(xs) == 3)"#);
}

#[test]
fn list_attributes_are_lists() {
    let mut device = h100();
    let attributes = device.attributes.get_or_insert_default();
    attributes.insert("links".to_owned(), DeviceAttribute { ints: Some(vec![1, 2, 3]), ..Default::default() });
    attributes.insert(
        "versions".to_owned(),
        DeviceAttribute { versions: Some(vec!["1.0.0".to_owned(), "2.0.0".to_owned()]), ..Default::default() },
    );
    let env = SelectorEnv::new();
    let device = CelDevice::new(DRIVER, &device).unwrap();
    for expression in [
        r#"2 in device.attributes["gpu.nvidia.com"].links"#,
        r#"device.attributes["gpu.nvidia.com"].links.size() == 3"#,
        r#"device.attributes["gpu.nvidia.com"].versions.all(v, v.isGreaterThan(semver("0.0.1")))"#,
    ] {
        assert_eq!(env.compile(expression).unwrap().matches(&device), Ok(true), "{expression}");
    }
}

#[test]
fn invalid_device_values_are_errors() {
    let mut device = h100();
    device.attributes.get_or_insert_default().insert("empty".to_owned(), DeviceAttribute::default());
    let err = CelDevice::new(DRIVER, &device).unwrap_err();
    assert!(err.to_string().contains("attribute empty"), "{err}");
    let mut device = h100();
    device
        .attributes
        .get_or_insert_default()
        .insert("v".to_owned(), DeviceAttribute { version: Some("1.2".to_owned()), ..Default::default() });
    assert!(CelDevice::new(DRIVER, &device).unwrap_err().to_string().contains("attribute v"));
}

#[test]
fn allow_multiple_allocations_is_exposed() {
    let mut device = h100();
    device.allow_multiple_allocations = Some(true);
    let device = CelDevice::new(DRIVER, &device).unwrap();
    let env = SelectorEnv::new();
    assert_eq!(env.compile("device.allowMultipleAllocations").unwrap().matches(&device), Ok(true));
}

/// Each of these would run for minutes, or exhaust memory, unbounded.
#[test]
fn pathological_expressions_exceed_the_budget_quickly() {
    let ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]";
    let nested = format!(
        "{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.all(d, {ten}.all(e, {ten}.all(f, {ten}.all(g, a + b < 100)))))))"
    );
    let doubling =
        (0..40).fold("\"xxxxxxxxxxxxxxxx\"".to_owned(), |inner, i| format!("cel.bind(s{i}, {inner}, s{i} + s{i})"));
    let list_doubling =
        (0..40).fold("[1, 2, 3, 4]".to_owned(), |inner, i| format!("cel.bind(l{i}, {inner}, l{i} + l{i})"));
    let replace_blowup = format!("\"{}\"{}.size() > 0", "a".repeat(64), ".replace(\"a\", \"aaaaaaaa\")".repeat(20));
    let split_loop = format!(
        "\"{}\".split(\"\").all(x, \"{}\".split(\"\").all(y, x != y || true))",
        "a".repeat(4000),
        "b".repeat(4000)
    );
    for expression in
        [nested, format!("size({doubling}) > 0"), format!("size({list_doubling}) > 0"), replace_blowup, split_loop]
    {
        let result = eval(&expression);
        let err = result.expect_err(&expression);
        assert!(err.contains("cost budget") || err.contains("exceeds the limit"), "{expression}: {err}");
    }
}

#[test]
fn an_overrun_absorbed_by_or_is_still_an_error() {
    let ten = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]";
    let expensive = format!("{ten}.all(a, {ten}.all(b, {ten}.all(c, {ten}.all(d, {ten}.all(e, {ten}.all(f, true))))))");
    let err = eval(&format!("{expensive} || true")).unwrap_err();
    assert!(err.contains("cost budget of 1000000"), "{err}");
}

#[test]
fn deep_nesting_is_a_compile_error_not_a_stack_overflow() {
    let env = SelectorEnv::new();
    let sum = format!("{}1 == 0", "1+".repeat(4500));
    let parens = format!("{}true{}", "(".repeat(3000), ")".repeat(3000));
    let lists = format!("size({}1{}) == 1", "[".repeat(3000), "]".repeat(3000));
    let selects = format!("device{} == 1", ".a".repeat(3000));
    for expression in [sum, parens, lists, selects] {
        assert!(env.compile(&expression).is_err(), "{}...", &expression[..40]);
    }
    // The parser folds `!!x` into `x`, so a run of negations is shallow.
    let nots = format!("{}true", "!".repeat(3000));
    assert!(env.compile(&nots).is_ok());
    let ands = vec!["true"; 1000].join(" && ");
    assert!(env.compile(&ands).is_ok(), "a long conjunction is balanced, not deep");
    // The deepest accepted expressions evaluate on a test thread's small stack.
    let device = CelDevice::new(DRIVER, &h100()).unwrap();
    let chain = format!("{}1 == 96", "1 + ".repeat(95));
    assert_eq!(env.compile(&chain).unwrap().matches(&device), Ok(true));
    let parens = format!("{}true{}", "(!!".repeat(30), ")".repeat(30));
    assert_eq!(env.compile(&parens).unwrap().matches(&device), Ok(true));
    let nested = format!("{}1{}", "[".repeat(90), "]".repeat(90));
    assert!(env.compile(&format!("size({nested}) == 1")).is_ok());
}

#[test]
fn ordinary_selectors_cost_little() {
    let env = SelectorEnv::new();
    let device = CelDevice::new(DRIVER, &h100()).unwrap();
    let compiled = env.compile(r#"device.attributes["gpu.nvidia.com"].all(id, id.size() < 64)"#).unwrap();
    assert_eq!(compiled.matches(&device), Ok(true));
    assert!(meter::used() < 100, "spent {}", meter::used());
}

#[test]
fn operators_on_two_computed_values_are_metered_but_unchanged() {
    holds(r#"device.attributes["gpu.nvidia.com"].productName == device.attributes["gpu.nvidia.com"].productName"#);
    holds(r#"device.attributes["gpu.nvidia.com"].index != device.attributes["gpu.nvidia.com"].index + 1"#);
    holds(r#"cel.bind(d, "gpu.nvidia.com", "index" in device.attributes[d] && device.attributes[d].index >= 3)"#);
    holds(r#"cel.bind(d, "example.org", device.attributes[d].size() == 0)"#);
    holds(r#"cel.bind(k, "b", {"a": 1, "b": 2}[k] == 2 && k in {"b": 1} && k < "c" && k > "a" && k <= "b")"#);
    holds(r#"cel.bind(l, [1, 2], 2 in l && !(3 in l) && l[1] == 2)"#);
    holds(r#"cel.bind(o, optional.of({"a": 1}), o["a"] == optional.of(1) && !o["z"].hasValue())"#);
    fails_with(r#"cel.bind(a, 1, cel.bind(b, "x", a < b))"#, "no matching overload");
}

#[test]
fn list_set_regex_and_includes_functions() {
    holds("[1, 2, 3].isSorted() && ![2, 1].isSorted() && [1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0");
    holds("[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3 && ['b', 'a'].min() == 'a'");
    holds("[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1");
    holds("sets.contains([1, 2, 3], [2, 3]) && sets.equivalent([1, 2], [2, 1, 2]) && sets.intersects([1], [3, 1])");
    holds(r#""abc123def456".find("[0-9]+") == "123" && "abc123def456".findAll("[0-9]+") == ["123", "456"]"#);
    holds(r#""a1b2c3".findAll("[0-9]", 2) == ["1", "2"] && "abc".find("[0-9]") == """#);
    holds(r#"device.attributes["gpu.nvidia.com"].productName.includes("H100") && [1, 2].includes(2)"#);
    fails_with("[].min() == 1", "list is empty");
}

#[test]
fn quadratic_scans_of_computed_lists_exceed_the_budget() {
    let letters = "a".repeat(4000);
    let expression = format!(r#"cel.bind(l, "{letters}".split(""), l.all(x, x in l))"#);
    fails_with(&expression, "cost budget");
    let expression = format!(r#"cel.bind(s, "{letters}", s.split("").all(x, s == s))"#);
    fails_with(&expression, "cost budget");
    // Copies made by list literals and loop variables are paid for.
    let copies = vec!["s"; 1000].join(", ");
    let big = r#""aaaaaaaaaaaaaaaa".replace("a", "aaaaaaaaaaaaaaaa").replace("a", "aaaaaaaaaaaaaaaa")"#;
    let expression = format!(r#"cel.bind(s, {big}, [{copies}].all(x, [{copies}].size() > 0))"#);
    fails_with(&expression, "cost budget");
}

#[test]
fn unsupported_features_are_named_as_such() {
    let env = SelectorEnv::new();
    // The strings extension's `format`, deliberately left out (docs/claims.md).
    let err = env.compile(r#""%s".format(["x"]) == "x""#).unwrap_err().to_string();
    assert_eq!(
        err,
        "`format` is not supported by this driver's CEL (Kubernetes has it); see docs/claims.md, \"CEL selectors: what is supported\""
    );
    // What Kubernetes lacks too is undeclared, as there.
    for (expression, name) in [(r#"lists.other(3).size() == 3"#, "lists"), (r#"math.greatest(1, 2) == 2"#, "math")] {
        let err = env.compile(expression).unwrap_err().to_string();
        assert!(err.contains(&format!("undeclared reference to '{name}'")), "{expression}: {err}");
    }
    // A variable of that name is not a namespace.
    assert!(env.compile(r#"[1].all(lists, lists > 0)"#).is_ok());
    // Strings v2 has no reverse(): refused at compile time, as Kubernetes does.
    let error = env.compile(r#""gums".reverse() == "smug""#).unwrap_err().to_string();
    assert!(error.contains("found no matching overload for 'reverse' applied to 'string.()'"), "{error}");
}

#[test]
fn strings_quote_escapes_as_cel_go() {
    holds(r#"strings.quote("a") == "\"a\"""#);
    holds(r#"strings.quote("first\nsecond") == "\"first\\nsecond\"""#);
    holds(r#"strings.quote("bell\a \"q\" back\\slash") == "\"bell\\a \\\"q\\\" back\\\\slash\"""#);
    holds(r#"strings.quote("héllo") == "\"héllo\"""#);
}

/// cel-go's lists extension v3, as Kubernetes enables it for selectors
/// (cel-go's `ext/lists_test.go` cases, restated).
#[test]
fn lists_extension_v3() {
    for expression in [
        r#"["b", "c", "a"].sort() == ["a", "b", "c"]"#,
        "[3, 1, 2].sort() == [1, 2, 3] && [].sort() == []",
        "[1, 2, 2, 3, 1].distinct() == [1, 2, 3]",
        // Kubernetes requires homogeneous list literals: cel-go's own
        // `[1, [2, [3, 4]]]` examples do not compile there.
        "[[1], [2, 3]].flatten() == [1, 2, 3] && [[[1]], [[2, 3]]].flatten() == [[1], [2, 3]]",
        "[[[1]], [[2, 3]]].flatten(2) == [1, 2, 3] && [dyn(1), dyn([dyn(2), dyn([3, 4])])].flatten(2) == [1, 2, 3, 4]",
        "[1, 2, 3, 4].slice(1, 3) == [2, 3] && [1].slice(1, 1) == []",
        "[1, 2, 3].reverse() == [3, 2, 1]",
        "lists.range(4) == [0, 1, 2, 3] && lists.range(0) == []",
        "[3, 1, 2].sortBy(x, -x) == [3, 2, 1] && ['bb', 'a', 'ccc'].sortBy(s, s.size()) == ['a', 'bb', 'ccc']",
        "[{'n': 2}, {'n': 1}].sortBy(m, m.n) == [{'n': 1}, {'n': 2}]",
        "[1, 2].first() == optional.of(1) && [1, 2].last().value() == 2 && ![].first().hasValue()",
        "optional.unwrap([optional.of(1), optional.none()]) == [1] && [optional.of('a')].unwrapOpt() == ['a']",
    ] {
        holds(expression);
    }
    for (expression, needle) in [
        ("[1, 2].slice(2, 1) == []", "start index must be less than or equal to end index"),
        ("[1, 2].slice(0, 3) == []", "list is length 2"),
        ("[[1], [2]].flatten(-1) == []", "level must be non-negative"),
        (r#"[dyn(1), dyn("a")].sort() == []"#, "same type"),
    ] {
        fails_with(expression, needle);
    }
}

#[test]
fn runtime_errors_carry_no_debug_output() {
    assert_eq!(
        env::runtime_message(
            r#"Error executing function 'duration': Parsing Error: Error { input: "x", code: Float }"#
        ),
        r#"duration(): "x" is not a valid duration; write one such as "90s" or "1h30m""#
    );
    assert!(env::runtime_message("Undeclared reference to 'sortBy'").starts_with("`sortBy` is not supported"));
    assert_eq!(env::runtime_message("No such key: memory"), "No such key: memory");
    let dev = k8s_openapi::api::resource::v1::Device { name: "d".into(), ..Default::default() };
    let value = CelDevice::new("gpu.nvidia.com", &dev).unwrap();
    let err =
        SelectorEnv::new().compile(r#"duration(device.driver) > duration("1s")"#).unwrap().matches(&value).unwrap_err();
    assert!(!err.to_string().contains("Error {"), "{err}");
    // A literal argument is checked at compile time, as Kubernetes'
    // ValidateDurationLiterals does, in the same words.
    let err = SelectorEnv::new().compile(r#"duration("x") > duration("1s")"#).unwrap_err();
    assert_eq!(err.to_string(), r#"duration(): "x" is not a valid duration; write one such as "90s" or "1h30m""#);
}

/// Compile-time type errors, as Kubernetes' checker reports them (the
/// issue's examples and the compile-error cases of dynamic-resource-
/// allocation's `cel/compile_test.go`, restated).
#[test]
fn the_type_checker_refuses_what_kubernetes_refuses() {
    let env = SelectorEnv::new();
    for (expression, message) in [
        ("true || device.driver > 1", "1:23: found no matching overload for '_>_' applied to '(string, int)'"),
        ("1 == 1.0", "1:3: found no matching overload for '_==_' applied to '(int, double)'"),
        ("[1, 2.0].size() == 2", "1:5: expected type 'int' but found 'double'"),
        (
            "sets.contains([1], [1.0])",
            "found no matching overload for 'sets.contains' applied to '(list(int), list(double))'",
        ),
        (r#"{"a": 1, "b": "x"}.size() == 2"#, "expected type 'int' but found 'string'"),
        (r#"device.attributes["d"].x == 1 || device.driver.startsWith(1)"#, "'startsWith' applied to 'string.(int)'"),
        ("device.driver.size() == 1u", "'_==_' applied to '(int, uint)'"),
        (
            r#"device.capacity["d"].memory > quantity("1Gi")"#,
            "'_>_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'",
        ),
        (r#"quantity("1").sign() == 1"#, "'sign' applied to 'kubernetes.Quantity.()'"),
        ("device.nosuchfield", "undefined field 'nosuchfield'"),
        ("device.driver.x == 1", "type 'string' does not support field selection"),
        ("5.all(x, x > 0)", "expression of type 'int' cannot be range of a comprehension"),
        ("[1].exists(x, x)", "expected type 'bool' but found 'int'"),
        ("true ? 1 : 2.0", "'_?_:_' applied to '(bool, int, double)'"),
    ] {
        let err = env.compile(expression).unwrap_err().to_string();
        assert!(err.starts_with("type error: ") && err.contains(message), "{expression}: {err}");
    }
    for (expression, result) in
        [("1", "int"), ("device.driver", "string"), ("dyn(true) && true ? [] : []", "list(dyn)")]
    {
        let err = env.compile(expression).unwrap_err().to_string();
        assert_eq!(err, format!("must evaluate to bool or the unknown type, not {result}"), "{expression}");
    }
    // An attribute alone has the unknown type, which may be a bool.
    assert!(env.compile(r#"device.attributes["gpu.nvidia.com"].mig"#).is_ok());
    // What Kubernetes accepts: the unknown type of an attribute compares
    // with anything, numbers of different types order across types, and a
    // `dyn()` mixes an aggregate literal.
    for expression in [
        r#"device.attributes["gpu.nvidia.com"].index >= 0"#,
        r#"device.attributes["gpu.nvidia.com"].productName == "H100""#,
        "1 < 1.5 && 2u > 1 && 2.5 >= 2u",
        "dyn(1) == 1.0",
        "[dyn(1), dyn(2.0)].size() == 2",
        r#"device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("1Gi"))"#,
        r#"cel.bind(gpu, device.attributes["gpu.nvidia.com"], gpu.index >= 0 && gpu.productName != "")"#,
        r#"[1, 2].map(x, x * 2).filter(y, y > 2) == [4] && {"a": 1}.all(k, k == "a")"#,
        r#"optional.of(1).orValue(2) == 1 && {"a": 1}[?"b"].orValue(3) == 3"#,
    ] {
        holds(expression);
    }
}

/// The environment follows the Kubernetes version and the kind of
/// expression (`cel/compile_test.go`'s feature-gate cases, restated).
#[test]
fn the_environment_follows_the_kubernetes_version() {
    let sort = "[3, 1].sort() == [1, 3]";
    let new_134 = SelectorEnv::for_environment(CelEnvironment::new_expressions(34));
    let err = new_134.compile(sort).unwrap_err().to_string();
    assert!(err.contains("undeclared reference to 'sort'"), "{err}");
    assert!(SelectorEnv::for_environment(CelEnvironment::stored_expressions(34)).compile(sort).is_ok());
    assert!(SelectorEnv::for_environment(CelEnvironment::new_expressions(35)).compile(sort).is_ok());

    let multi = "device.allowMultipleAllocations == false";
    let err = SelectorEnv::for_environment(CelEnvironment::stored_expressions(35)).compile(multi).unwrap_err();
    assert!(err.to_string().contains("undefined field 'allowMultipleAllocations'"), "{err}");
    assert!(SelectorEnv::for_environment(CelEnvironment::stored_expressions(36)).compile(multi).is_ok());

    let includes = r#"device.attributes["dra.example.com"].name.includes("fish")"#;
    let err = SelectorEnv::for_environment(CelEnvironment::new_expressions(36)).compile(includes).unwrap_err();
    assert!(err.to_string().contains("undeclared reference to 'includes'"), "{err}");
    // Stored expressions ignore gates: DRA's `includes` (introduced at 1.36)
    // is there with DRAListTypeAttributes off.
    assert!(SelectorEnv::for_environment(CelEnvironment::stored_expressions(36)).compile(includes).is_ok());
    // With DRAListTypeAttributes an attribute is `dyn` and can be iterated;
    // without, it is `any`, which cannot (1.36; 1.37 in tests_lists.rs).
    let with_lists = CelEnvironment { list_type_attributes: true, ..CelEnvironment::stored_expressions(36) };
    let exists = r#"device.attributes["dra.example.com"].names.exists(x, x > 0)"#;
    assert!(SelectorEnv::for_environment(with_lists).compile(exists).is_ok());
    assert!(SelectorEnv::for_environment(with_lists).compile(includes).is_ok());
    let err = SelectorEnv::for_environment(CelEnvironment::stored_expressions(36)).compile(exists).unwrap_err();
    assert!(err.to_string().contains("expression of type 'any' cannot be range of a comprehension"), "{err}");

    // 1.37: the lists library v1 brings `includes` to every list, in the
    // scheduler's (stored) environment; the apiserver's new-expression
    // environment is 1.36's until 1.38, where only the gate brings it.
    let list_includes = "[1, 2].includes(2)";
    assert!(SelectorEnv::for_environment(CelEnvironment::stored_expressions(37)).compile(list_includes).is_ok());
    assert!(SelectorEnv::for_environment(CelEnvironment::stored_expressions(37)).compile(includes).is_ok());
    for refused in [CelEnvironment::new_expressions(37), CelEnvironment::new_expressions(36)] {
        let err = SelectorEnv::for_environment(refused).compile(list_includes).unwrap_err();
        assert!(err.to_string().contains("undeclared reference to 'includes'"), "{refused:?}: {err}");
    }
}

fn nested_all(levels: usize) -> String {
    let mut expression = "int('1'.find('[0-9]*')) < 100".to_owned();
    for level in 0..levels {
        expression = format!("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x{level}, {expression})");
    }
    expression
}

/// The apiserver refuses a new selector whose estimated cost exceeds the
/// limit; the scheduler evaluates a stored one, metered.
#[test]
fn new_selectors_estimated_above_the_limit_are_refused() {
    let new = SelectorEnv::for_environment(CelEnvironment::new_expressions(36));
    let err = new.compile(&nested_all(7)).unwrap_err();
    assert!(matches!(err, CompileError::TooComplex { limit: MAX_COST, .. }), "{err}");
    assert!(err.to_string().starts_with("too complex, exceeds cost limit"), "{err}");
    let five = new.compile(&nested_all(5)).unwrap();
    assert!(five.estimated_cost().max <= MAX_COST);
    let stored = SelectorEnv::new().compile(&nested_all(7)).unwrap();
    assert!(stored.estimated_cost().max > MAX_COST);
    // A loop over a list whose length nothing bounds is refused as new.
    let unbounded = r#"lists.range(device.attributes["gpu.nvidia.com"].index).all(i, i >= 0)"#;
    assert!(matches!(new.compile(unbounded), Err(CompileError::TooComplex { .. })));
}

/// Nested loops are charged per iteration started, in units of cel-go's
/// order: five nested ten-element `all()` cost cel-go 855,551 units, within
/// Kubernetes' limit, and hold; seven (85,555,551 units, the "expensive"
/// case of `cel/compile_test.go`) exceed it, here too.
#[test]
fn nested_loops_within_kubernetes_limit_evaluate() {
    holds(&nested_all(5));
    fails_with(&nested_all(7), "cost budget");
}

/// cel-go's two-variable comprehensions (Kubernetes 1.32+), on lists
/// (index, element) and maps (key, value); cel-go's
/// `ext/comprehensions_test.go` cases, restated.
#[test]
fn two_variable_comprehensions() {
    for expression in [
        "[1, 2, 3].all(i, v, i < v) && ![1, 2].all(i, v, v > 1)",
        "{'a': 1, 'b': 2}.all(k, v, v > 0) && {'a': 1}.all(k, v, k == 'a' && v == 1)",
        "[0, 5].exists(i, v, i == 1 && v == 5) && !{'a': 1}.exists(k, v, v == 2)",
        "[1, 2, 3].existsOne(i, v, v == 2) && [1, 2].exists_one(i, v, i == 0)",
        "[1, 2, 3].transformList(i, v, i * v) == [0, 2, 6]",
        "[1, 2, 3].transformList(i, v, v > 1, v * 10) == [20, 30]",
        "{'a': 1, 'b': 2}.transformMap(k, v, v + 1) == {'a': 2, 'b': 3}",
        "{'a': 1, 'b': 2}.transformMap(k, v, v < 2, k + 'x') == {'a': 'ax'}",
        "{'a': 1}.transformMapEntry(k, v, {v: k}) == {1: 'a'}",
        "[[1, 2], [3]].all(i, l, l.all(j, x, x > i))",
        // Shadowing: the inner loop rebinds `v`.
        "{'a': [1, 2]}.all(k, v, v.all(i, v, v > 0))",
        r#"device.attributes["gpu.nvidia.com"].exists(k, v, k == "index" && v == 3)"#,
    ] {
        holds(expression);
    }
    fails_with("{'a': 1, 'b': 1}.transformMapEntry(k, v, {'same': v}) == {}", "already exists");
    let env = SelectorEnv::new();
    let err = env.compile("{'a': 1}.all(k, v, v.startsWith('x'))").unwrap_err().to_string();
    assert!(err.contains("'startsWith' applied to 'int.(string)'"), "{err}");
    assert!(env.compile("[1].all(i, i, true)").unwrap_err().to_string().contains("duplicate variable name"));
}

/// The apiserver's IP and CIDR library tests (`library/ip_test.go`,
/// `library/cidr_test.go`), restated.
#[test]
fn ip_and_cidr_library() {
    for expression in [
        r#"isIP("192.168.0.1") && !isIP("192.168.0.1.0") && ip.isCanonical("127.0.0.1")"#,
        r#"ip("192.168.0.1").family() == 4 && ip("2001:db8::68").family() == 6"#,
        r#"ip("0.0.0.0").isUnspecified() && !ip("127.0.0.1").isUnspecified() && ip("::").isUnspecified()"#,
        r#"ip("127.0.0.1").isLoopback() && !ip("1.2.3.4").isLoopback() && ip("::1").isLoopback()"#,
        r#"ip("224.0.0.1").isLinkLocalMulticast() && !ip("224.0.1.1").isLinkLocalMulticast() && ip("ff02::1").isLinkLocalMulticast() && !ip("fd00::1").isLinkLocalMulticast()"#,
        r#"ip("169.254.169.254").isLinkLocalUnicast() && !ip("192.168.0.1").isLinkLocalUnicast() && ip("fe80::1").isLinkLocalUnicast() && !ip("fd80::1").isLinkLocalUnicast()"#,
        r#"ip("192.168.0.1").isGlobalUnicast() && !ip("255.255.255.255").isGlobalUnicast() && ip("2001:db8::abcd").isGlobalUnicast() && !ip("ff00::1").isGlobalUnicast()"#,
        r#"ip.isCanonical("2001:db8::68") && !ip.isCanonical("2001:DB8::68")"#,
        r#"string(ip("192.168.0.1")) == "192.168.0.1" && type(ip("192.168.0.1")) == net.IP"#,
        r#"ip("192.168.0.1") == ip("192.168.0.1") && ip("192.168.0.1") != ip("192.168.0.2")"#,
        r#"cidr("192.168.0.0/24").containsIP(ip("192.168.0.1")) && !cidr("192.168.0.0/24").containsIP(ip("192.168.1.1"))"#,
        r#"cidr("192.168.0.0/24").containsIP("192.168.0.1") && !cidr("192.168.0.0/24").containsIP("192.168.1.1")"#,
        r#"cidr("192.168.0.0/24").containsCIDR(cidr("192.168.0.0/25")) && cidr("192.168.0.0/24").containsCIDR(cidr("192.168.0.1/32"))"#,
        r#"!cidr("192.168.0.0/24").containsCIDR(cidr("192.168.0.0/23")) && !cidr("192.168.0.0/24").containsCIDR(cidr("192.169.0.1/32"))"#,
        r#"cidr("192.168.0.0/24").containsCIDR("192.168.0.0/25") && !cidr("192.168.0.0/24").containsCIDR("192.168.0.0/23")"#,
        r#"cidr("192.168.0.0/24").ip() == ip("192.168.0.0") && cidr("192.168.0.1/24").masked() == cidr("192.168.0.0/24")"#,
        r#"cidr("192.168.0.0/24").prefixLength() == 24 && cidr("2001:db8::/32").prefixLength() == 32"#,
        r#"cidr("2001:db8::/32").containsIP(ip("2001:db8::1")) && !cidr("2001:db8::/32").containsIP("2001:dc8::1")"#,
        r#"cidr("2001:db8::/32").containsCIDR("2001:db8::/33") && !cidr("2001:db8::/32").containsCIDR(cidr("2001:db8::/31"))"#,
        r#"cidr("2001:db8:1::/32").masked() == cidr("2001:db8::/32") && cidr("2001:db8::/32").ip() == ip("2001:db8::")"#,
        r#"string(cidr("192.168.0.0/24")) == "192.168.0.0/24" && type(cidr("192.168.0.0/24")) == net.CIDR"#,
        r#"isCIDR("10.0.0.0/8") && !isCIDR("10.0.0.0/33") && !isCIDR("::ffff:1.2.3.4/128")"#,
    ] {
        holds(expression);
    }
    for (expression, message) in [
        (
            r#"ip("192.168.0.1.0").family() == 4"#,
            r#"IP Address "192.168.0.1.0" parse error during conversion from string: ParseAddr("192.168.0.1.0"): IPv4 address too long"#,
        ),
        (
            r#"ip("2001:db8:::68").family() == 6"#,
            r#"IP Address "2001:db8:::68" parse error during conversion from string: ParseAddr("2001:db8:::68"): each colon-separated field must have at least one digit (at ":68")"#,
        ),
        (r#"ip.isCanonical("127.0.0.1.0")"#, "IPv4 address too long"),
        (r#"ip("::ffff:1.2.3.4").family() == 6"#, r#"IPv4-mapped IPv6 address "::ffff:1.2.3.4" is not allowed"#),
        (r#"ip("fe80::1%eth0").family() == 6"#, r#"IP address "fe80::1%eth0" with zone value is not allowed"#),
        (r#"ip("01.2.3.4").family() == 4"#, "IPv4 field has octet with leading zero"),
        (
            r#"cidr("192.168.0.0/").prefixLength() == 0"#,
            r#"network address parse error during conversion from string: network address parse error during conversion from string: netip.ParsePrefix("192.168.0.0/"): bad bits after slash: """#,
        ),
        (r#"cidr("2001:db8::/").prefixLength() == 0"#, r#"netip.ParsePrefix("2001:db8::/"): bad bits after slash: """#),
    ] {
        fails_with(expression, message);
    }
    let err = SelectorEnv::new().compile(r#"isIP(cidr("192.168.0.0/24"))"#).unwrap_err().to_string();
    assert!(err.contains("found no matching overload for 'isIP' applied to '(net.CIDR)'"), "{err}");
}

/// The URL library (`library/urls.go`), with Go's `net/url` rules.
#[test]
fn url_library() {
    for expression in [
        r#"url("https://kubernetes.io/docs/").getScheme() == "https" && url("https://kubernetes.io:80/").getHost() == "kubernetes.io:80""#,
        r#"url("https://[::1]:80/").getHostname() == "::1" && url("https://[::1]:80/").getPort() == "80""#,
        r#"url("https://kubernetes.io/").getPort() == "" && url("/absolute-path").getHost() == """#,
        r#"url("https://kubernetes.io/a%20b").getEscapedPath() == "/a%20b" && url("https://kubernetes.io/a b").getEscapedPath() == "/a%20b""#,
        r#"url("https://example.com/?k=a&k=b&x=1").getQuery() == {"k": ["a", "b"], "x": ["1"]}"#,
        r#"url("https://example.com/path#frag").getEscapedPath() == "/path""#,
        r#"isURL("https://kubernetes.io/") && isURL("/absolute") && !isURL("relative") && !isURL("")"#,
        r#"url("https://a/") == url("https://a/") && url("https://a/") != url("https://b/")"#,
        r#"type(url("https://a/")) == kubernetes.URL"#,
    ] {
        holds(expression);
    }
    fails_with(r#"url("../relative").getHost() == """#, "URL parse error during conversion from string");
}

/// Kubernetes' format library (`library/format_test.go`), restated.
#[test]
fn format_library() {
    for expression in [
        r#"!format.dns1123Label().validate("my-name").hasValue() && format.dns1123Label().validate("My-Name").hasValue()"#,
        r#"format.named("dns1123Subdomain").value().validate("example.com") == optional.none()"#,
        r#"format.dns1123Label().validate("a.b").value() == ["must not contain dots"]"#,
        r#"!format.named("unknownFormat").hasValue() && format.named("uuid").hasValue()"#,
        r#"!format.dns1123LabelPrefix().validate("my-name-").hasValue() && format.dns1123Label().validate("my-name-").hasValue()"#,
        r#"!format.qualifiedName().validate("example.com/MyName").hasValue() && format.qualifiedName().validate("a/b/c").hasValue()"#,
        r#"!format.labelValue().validate("").hasValue() && !format.dns1035Label().validate("abc-123").hasValue()"#,
        r#"!format.uri().validate("https://kubernetes.io/").hasValue() && format.uri().validate("relative").hasValue()"#,
        r#"!format.uuid().validate("123e4567-e89b-12d3-a456-426614174000").hasValue()"#,
        r#"format.byte().validate("not base64").value() == ["invalid base64"] && !format.byte().validate("aGVsbG8=").hasValue()"#,
        r#"!format.date().validate("2024-02-29").hasValue() && format.date().validate("2023-02-29").value() == ["invalid date"]"#,
        r#"!format.datetime().validate("2024-01-01T10:00:00Z").hasValue() && format.datetime().validate("2024-01-01").hasValue()"#,
        r#"format.dns1123Label() == format.named("dns1123Label").value() && type(format.uuid()) == kubernetes.NamedFormat"#,
    ] {
        holds(expression);
    }
}

/// The standard library's time functions and optional syntax, which
/// docs/claims.md lists as supported.
#[test]
fn timestamps_durations_and_optional_syntax() {
    for expression in [
        r#"timestamp("2024-02-29T12:30:00Z").getFullYear() == 2024 && timestamp("2024-02-29T12:30:00Z").getMonth() == 1"#,
        r#"duration("1h30m").getHours() == 1 && duration("90s") > duration("1m")"#,
        r#"timestamp("2024-01-01T00:00:00Z") + duration("24h") == timestamp("2024-01-02T00:00:00Z")"#,
        r#"optional.of(1).optMap(x, x + 1) == optional.of(2) && optional.none().orValue(3) == 3"#,
        r#"device.attributes["gpu.nvidia.com"].?productName.orValue("") == "H100""#,
        r#"!device.attributes["gpu.nvidia.com"].?nosuch.hasValue() && {"a": 1}[?"a"] == optional.of(1)"#,
    ] {
        holds(expression);
    }
}

/// A selector Kubernetes estimates within the limit can never exceed it
/// when evaluated there, so the meter never stops it here either, even
/// where our units count more than cel-go's (comparing lists element by
/// element: one of ours per element, a tenth of cel-go's).
#[test]
fn selectors_estimated_within_the_limit_are_never_stopped() {
    let list = format!("[{}]", (0..1500).map(|i| i.to_string()).collect::<Vec<_>>().join(", "));
    let expression = format!("cel.bind(l, {list}, l.all(x, l == l))");
    let compiled = SelectorEnv::new().compile(&expression).unwrap();
    assert!(compiled.estimated_cost().max <= MAX_COST, "{:?}", compiled.estimated_cost());
    let device = CelDevice::new(DRIVER, &h100()).unwrap();
    assert_eq!(compiled.matches(&device), Ok(true));
    assert!(crate::meter::used() > MAX_COST, "the meter counted {} units", crate::meter::used());
}
