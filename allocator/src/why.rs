//! Why a selector matches no device, the way a senior engineer would say
//! it: which clause of its top-level `&&` chain leaves nothing, which
//! values the devices really have (closest to the one written first), a
//! name used as an attribute that is a capacity (or the other way round),
//! and a domain or name no device publishes, with a did-you-mean.
//!
//! Built only when a selector matched zero of the devices its class
//! matched, so none of this costs anything on the happy path. Pure text
//! work over the expression plus lookups in the devices' compact records.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use cel::common::ast::{Expr, LiteralValue, operators};

use super::compact::{AttrValue, DeviceRecord};

/// One clause of a selector's top-level `&&` chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClauseCount {
    pub text: String,
    /// Devices (of those the class matched) for which the clause is true.
    pub passing: usize,
    /// Devices on which it failed to evaluate (e.g. a missing attribute).
    pub errors: usize,
}

/// The breakdown of a selector that matched no device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectorBreakdown {
    /// Devices the breakdown looked at: those the class matched.
    pub devices: usize,
    /// Per clause, when the selector has more than one.
    pub clauses: Vec<ClauseCount>,
    /// What to fix, most specific first.
    pub hints: Vec<String>,
}

impl fmt::Display for SelectorBreakdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if self.clauses.len() > 1 {
            for (i, c) in self.clauses.iter().enumerate() {
                let errors = if c.errors > 0 { format!(", fails to evaluate on {}", c.errors) } else { String::new() };
                parts.push(format!(
                    "clause {} `{}` is true for {} of {}{errors}",
                    i + 1,
                    c.text,
                    c.passing,
                    self.devices
                ));
            }
        }
        parts.extend(self.hints.iter().cloned());
        if parts.is_empty() {
            return Ok(());
        }
        write!(f, " ({})", parts.join("; "))
    }
}

/// Splits `expression` at its top-level `&&` (outside parentheses,
/// brackets, braces and string literals). One clause when there is none.
pub(crate) fn clauses(expression: &str) -> Vec<String> {
    let bytes = expression.as_bytes();
    let (mut depth, mut start, mut i) = (0i32, 0usize, 0usize);
    let mut out = Vec::new();
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) => {
                if b == b'\\' {
                    i += 1;
                } else if b == q {
                    quote = None;
                }
            }
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                b'&' if depth == 0 && bytes.get(i + 1) == Some(&b'&') => {
                    out.push(expression[start..i].trim().to_string());
                    start = i + 2;
                    i += 1;
                }
                _ => {}
            },
        }
        i += 1;
    }
    out.push(expression.get(start..).unwrap_or_default().trim().to_string());
    out.retain(|c| !c.is_empty());
    out
}

/// A `device.attributes[...]` or `device.capacity[...]` reference in a clause.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    capacity: bool,
    domain: String,
    id: String,
    /// The string literal it is compared with (`==`), if any.
    compared_with: Option<String>,
}

/// The references of a clause, read from its parsed expression (so every
/// CEL string literal form counts: single, double, raw, triple-quoted,
/// escaped): `device.attributes["d"].id` and `device.attributes["d"]["id"]`,
/// the same for `capacity`, each with the string literal it is compared
/// with by `==` (on either side), if any. A clause that does not parse has
/// none.
fn references(clause: &str) -> Vec<Reference> {
    let Ok(parsed) = cel::parser::Parser::new().parse(clause) else { return Vec::new() };
    let mut out = Vec::new();
    collect_references(&parsed.expr, &mut out);
    out
}

fn collect_references(e: &Expr, out: &mut Vec<Reference>) {
    if let Some(r) = reference(e) {
        out.push(r);
        return;
    }
    match e {
        Expr::Call(call) => {
            if let [a, b] = call.args.as_slice()
                && call.func_name == operators::EQUALS
            {
                let compared = match (reference(&a.expr), reference(&b.expr)) {
                    (Some(r), None) => string_literal(&b.expr).map(|l| (r, l)),
                    (None, Some(r)) => string_literal(&a.expr).map(|l| (r, l)),
                    _ => None,
                };
                if let Some((r, literal)) = compared {
                    out.push(Reference { compared_with: Some(literal), ..r });
                    return;
                }
            }
            if let Some(target) = &call.target {
                collect_references(&target.expr, out);
            }
            for a in &call.args {
                collect_references(&a.expr, out);
            }
        }
        Expr::Select(select) => collect_references(&select.operand.expr, out),
        Expr::List(list) => list.elements.iter().for_each(|el| collect_references(&el.expr, out)),
        Expr::Comprehension(c) => {
            for part in [&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                collect_references(&part.expr, out);
            }
        }
        _ => {}
    }
}

/// `device.attributes[<domain>].<id>` or `device.attributes[<domain>][<id>]`
/// (`capacity` likewise), the names being string literals.
fn reference(e: &Expr) -> Option<Reference> {
    let (map, id) = match e {
        Expr::Select(select) if !select.test => (&select.operand.expr, select.field.clone()),
        Expr::Call(call) if call.func_name == operators::INDEX => match call.args.as_slice() {
            [map, id] => (&map.expr, string_literal(&id.expr)?),
            _ => return None,
        },
        _ => return None,
    };
    let Expr::Call(index) = map else { return None };
    let [field, domain] = index.args.as_slice() else { return None };
    if index.func_name != operators::INDEX {
        return None;
    }
    let Expr::Select(field) = &field.expr else { return None };
    let capacity = match field.field.as_str() {
        "attributes" => false,
        "capacity" => true,
        _ => return None,
    };
    if !matches!(&field.operand.expr, Expr::Ident(name) if name == "device") {
        return None;
    }
    Some(Reference { capacity, domain: string_literal(&domain.expr)?, id, compared_with: None })
}

fn string_literal(e: &Expr) -> Option<String> {
    match e {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_string()),
        _ => None,
    }
}

/// What the devices publish: per domain, attribute ids and capacity ids,
/// and the values of the attributes a clause compares with a literal.
#[derive(Debug, Default)]
struct Published {
    attributes: BTreeMap<String, BTreeSet<String>>,
    capacities: BTreeMap<String, BTreeSet<String>>,
    /// (domain, id) of an attribute compared with a literal → its values.
    values: BTreeMap<(String, String), Values>,
}

/// One attribute's values as shown (`"H100"`, `semver 1.2.3`, `3`) with
/// how many devices have each. Up to [`MAX_VALUES`] distinct ones are
/// kept: an attribute unique per device (`uuid`) on a fleet of 320,000
/// devices would otherwise hold them all; whether the compared literal is
/// among them is still known exactly.
#[derive(Debug, Default)]
struct Values {
    counts: BTreeMap<String, usize>,
    /// More distinct values than were kept.
    more: bool,
    /// The compared literals (as shown) some device has.
    literals_seen: BTreeSet<String>,
}

const MAX_VALUES: usize = 1024;

impl Published {
    /// `compared`: (domain, id) → the literals compared with it, as shown.
    fn of<'a>(
        devices: impl Iterator<Item = (&'a str, &'a DeviceRecord)>,
        compared: &BTreeMap<(String, String), BTreeSet<String>>,
    ) -> Self {
        let mut p = Published::default();
        for (driver, d) in devices {
            for (name, value) in d.attributes.iter() {
                let (domain, id) = name.split_once('/').unwrap_or((driver, name));
                if !p.attributes.get(domain).is_some_and(|ids| ids.contains(id)) {
                    p.attributes.entry(domain.to_string()).or_default().insert(id.to_string());
                }
                let key = (domain.to_string(), id.to_string());
                let Some(literals) = compared.get(&key) else { continue };
                let shown = match value {
                    AttrValue::Str(s) => format!("{s:?}"),
                    AttrValue::Version(v) => format!("semver {v}"),
                    AttrValue::Int(i) => i.to_string(),
                    AttrValue::Bool(b) => b.to_string(),
                    AttrValue::List(_) | AttrValue::Empty => "a list".to_string(),
                };
                let values = p.values.entry(key).or_default();
                if literals.contains(&shown) {
                    values.literals_seen.insert(shown.clone());
                }
                let kept = values.counts.len();
                if let Some(n) = values.counts.get_mut(&shown) {
                    *n += 1;
                } else if kept < MAX_VALUES {
                    values.counts.insert(shown, 1);
                } else {
                    values.more = true;
                }
            }
            for (name, _) in d.capacity.iter() {
                let (domain, id) = name.split_once('/').unwrap_or((driver, name));
                if !p.capacities.get(domain).is_some_and(|ids| ids.contains(id)) {
                    p.capacities.entry(domain.to_string()).or_default().insert(id.to_string());
                }
            }
        }
        p
    }

    fn has(&self, capacity: bool, domain: &str, id: &str) -> bool {
        if capacity {
            self.capacities.get(domain).is_some_and(|ids| ids.contains(id))
        } else {
            self.attributes.get(domain).is_some_and(|ids| ids.contains(id))
        }
    }

    fn domains(&self) -> BTreeSet<&str> {
        self.attributes.keys().chain(self.capacities.keys()).map(String::as_str).collect()
    }

    fn ids(&self, capacity: bool, domain: &str) -> Vec<&str> {
        if capacity {
            self.capacities.get(domain).map(|s| s.iter().map(String::as_str).collect()).unwrap_or_default()
        } else {
            self.attributes.get(domain).map(|m| m.iter().map(String::as_str).collect()).unwrap_or_default()
        }
    }
}

/// The candidate closest to `wanted`, if it is close enough to be a typo.
fn did_you_mean<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let wanted_lower = wanted.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(&wanted_lower, &c.to_lowercase()), c))
        .filter(|(d, c)| *d <= (c.len().max(wanted.len()) / 3).max(2))
        .min()
        .map(|(_, c)| c)
}

/// Hints for the references of `clause` against what the devices publish.
fn hints(clause: &str, published: &Published) -> Vec<String> {
    let mut out = Vec::new();
    for r in references(clause) {
        let (kind, other, other_kind) = if r.capacity {
            ("capacity", "attributes", "an attribute")
        } else {
            ("attribute", "capacity", "a capacity")
        };
        if !published.has(r.capacity, &r.domain, &r.id) {
            if published.has(!r.capacity, &r.domain, &r.id) {
                out.push(format!(
                    "\"{}\" is {other_kind}, not {}: write device.{other}[\"{}\"].{}",
                    r.id,
                    if r.capacity { "a capacity" } else { "an attribute" },
                    r.domain,
                    r.id
                ));
            } else if !published.domains().contains(r.domain.as_str()) {
                let mut hint = format!("no device here publishes the domain \"{}\"", r.domain);
                if let Some(m) = did_you_mean(&r.domain, published.domains()) {
                    hint.push_str(&format!("; did you mean \"{m}\"?"));
                }
                out.push(hint);
            } else {
                let mut hint = format!("no device here has the {kind} \"{}/{}\"", r.domain, r.id);
                let ids = published.ids(r.capacity, &r.domain);
                if let Some(m) = did_you_mean(&r.id, ids.iter().copied()) {
                    hint.push_str(&format!("; did you mean \"{m}\"?"));
                }
                out.push(hint);
            }
            continue;
        }
        let (Some(literal), false) = (&r.compared_with, r.capacity) else { continue };
        let Some(values) = published.values.get(&(r.domain.clone(), r.id.clone())) else { continue };
        if values.literals_seen.contains(&format!("{literal:?}")) {
            continue;
        }
        let lower = literal.to_lowercase();
        let mut ranked: Vec<(&String, &usize)> = values.counts.iter().collect();
        ranked.sort_by_key(|(v, _)| {
            let v = v.trim_matches('"').to_lowercase();
            (!v.contains(&lower), strsim::levenshtein(&v, &lower))
        });
        let shown: Vec<String> = ranked.iter().take(5).map(|(v, n)| format!("{v} ({n})")).collect();
        let more = match (ranked.len() > 5, values.more) {
            (_, true) => format!(" and more than {} others", ranked.len() - 5),
            (true, false) => format!(" and {} more", ranked.len() - 5),
            (false, false) => String::new(),
        };
        out.push(format!("no device has {} \"{literal}\"; the values here are {}{more}", r.id, shown.join(", ")));
    }
    out
}

/// What to write instead of `key`, a name the device does not have (CEL's
/// "No such key"): the capacity or attribute of that name, or the closest
/// name the device has.
pub(crate) fn missing_key_hint(key: &str, device: &DeviceRecord) -> Option<String> {
    let bare = |name: &str| name.rsplit_once('/').map_or(name, |(_, id)| id).to_string();
    let attributes: Vec<String> = device.attributes.iter().map(|(n, _)| bare(n)).collect();
    let capacities: Vec<String> = device.capacity.iter().map(|(n, _)| bare(n)).collect();
    if capacities.iter().any(|c| c == key) && !attributes.iter().any(|a| a == key) {
        return Some(format!("\"{key}\" is a capacity, not an attribute: read it through device.capacity"));
    }
    if attributes.iter().any(|a| a == key) && !capacities.iter().any(|c| c == key) {
        return Some(format!("\"{key}\" is an attribute, not a capacity: read it through device.attributes"));
    }
    let all = attributes.iter().chain(&capacities).map(String::as_str);
    did_you_mean(key, all).map(|m| format!("did you mean \"{m}\"?"))
}

/// For a "No such key: `key`" raised by `expression`: the reference that
/// read `key` under a domain no device publishes, said so, with the
/// published domain it most likely meant.
pub(crate) fn unpublished_domain_hint(expression: &str, key: &str, domains: &BTreeSet<String>) -> Option<String> {
    let r = references(expression).into_iter().find(|r| r.id == key && !domains.contains(&r.domain))?;
    let mut hint = format!("no device publishes the domain \"{}\"", r.domain);
    if let Some(m) = did_you_mean(&r.domain, domains.iter().map(String::as_str)) {
        hint.push_str(&format!("; did you mean \"{m}\"?"));
    }
    Some(hint)
}

/// The breakdown of `expression` over `devices` (those the class matched),
/// given each clause's verdict per device from `evaluate` (`Some(true)`,
/// `Some(false)`, `None` for an evaluation error).
pub(crate) fn breakdown<'a>(
    expression: &str,
    devices: &[(&'a str, &'a DeviceRecord)],
    mut evaluate: impl FnMut(&str, usize) -> Option<bool>,
) -> SelectorBreakdown {
    let parts = clauses(expression);
    let mut clauses_out = Vec::new();
    if parts.len() > 1 {
        for text in &parts {
            let (mut passing, mut errors) = (0, 0);
            for i in 0..devices.len() {
                match evaluate(text, i) {
                    Some(true) => passing += 1,
                    Some(false) => {}
                    None => errors += 1,
                }
            }
            clauses_out.push(ClauseCount { text: text.clone(), passing, errors });
        }
    }
    let mut compared: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for r in parts.iter().flat_map(|text| references(text)).filter(|r| !r.capacity) {
        if let Some(literal) = &r.compared_with {
            compared.entry((r.domain.clone(), r.id.clone())).or_default().insert(format!("{literal:?}"));
        }
    }
    let published = Published::of(devices.iter().copied(), &compared);
    let mut all_hints = Vec::new();
    for text in &parts {
        for h in hints(text, &published) {
            if !all_hints.contains(&h) {
                all_hints.push(h);
            }
        }
    }
    SelectorBreakdown { devices: devices.len(), clauses: clauses_out, hints: all_hints }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;

    #[test]
    fn top_level_and_chains_split_outside_parentheses_and_strings() {
        assert_eq!(
            clauses(r#"a && (b && c) && "x && y" == d && f(g && h)"#),
            ["a", "(b && c)", "\"x && y\" == d", "f(g && h)"]
        );
        assert_eq!(clauses("a || b"), ["a || b"]);
    }

    #[test]
    fn references_and_compared_literals() {
        let r = references(r#"device.attributes["gpu.nvidia.com"].productName == "H100""#);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].domain.as_str(), r[0].id.as_str()), ("gpu.nvidia.com", "productName"));
        assert_eq!(r[0].compared_with.as_deref(), Some("H100"));
        let r = references(r#""H100" == device.attributes["gpu.nvidia.com"]["productName"]"#);
        assert_eq!(r[0].compared_with.as_deref(), Some("H100"));
        let r = references(r#"device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))"#);
        assert!(r[0].capacity && r[0].compared_with.is_none());
    }

    #[test]
    fn every_string_literal_form_is_read() {
        for clause in [
            "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'",
            r#"device.attributes["gpu.nvidia.com"].profile == "1g.5gb""#,
            r#"device.attributes[r'gpu.nvidia.com'].profile == R"1g.5gb""#,
            r#"device.attributes['''gpu.nvidia.com''']['profile'] == """1g.5gb""""#,
            r#"device.attributes["gpu\x2envidia.com"].profile == '1g\u002e5gb'"#,
            "'1g.5gb' == device.attributes['gpu.nvidia.com'].profile",
        ] {
            let r = references(clause);
            assert_eq!(r.len(), 1, "{clause}");
            assert_eq!(
                (r[0].domain.as_str(), r[0].id.as_str(), r[0].compared_with.as_deref()),
                ("gpu.nvidia.com", "profile", Some("1g.5gb")),
                "{clause}"
            );
        }
    }

    #[test]
    fn single_quoted_values_get_the_values_devices_have() {
        let text = explain("device.attributes['gpu.nvidia.com'].productName == 'H100'");
        assert!(
            text.contains(
                r#"no device has productName "H100"; the values here are "NVIDIA H100 80GB HBM3" (2), "NVIDIA A100-SXM4-40GB" (1)"#
            ),
            "{text}"
        );
    }

    #[test]
    fn values_unique_per_device_are_kept_bounded_and_the_literal_still_found() {
        let devices: Vec<DeviceRecord> = (0..MAX_VALUES + 10)
            .map(|i| rec(device("g").string("uuid", &format!("GPU-{i:05}")).string("type", "gpu")))
            .collect();
        let list: Vec<(&str, &DeviceRecord)> = devices.iter().map(|d| (DRIVER, d)).collect();
        let explain = |expression: &str| breakdown(expression, &list, |_, _| Some(false)).to_string();
        let last = format!("device.attributes['gpu.nvidia.com'].uuid == 'GPU-{:05}'", MAX_VALUES + 9);
        assert!(
            !explain(&last).contains("no device has"),
            "a value past the kept ones is still found: {}",
            explain(&last)
        );
        let text = explain("device.attributes['gpu.nvidia.com'].uuid == 'GPU-x'");
        assert!(text.contains("no device has uuid \"GPU-x\""), "{text}");
        assert!(text.contains(&format!("and more than {} others", MAX_VALUES - 5)), "{text}");
        let published = Published::of(list.iter().copied(), &BTreeMap::new());
        assert!(published.values.is_empty(), "values are kept only for compared attributes");
        assert!(published.has(false, DRIVER, "uuid"));
    }

    fn fleet() -> Vec<DeviceRecord> {
        let gpu = |product: &str| {
            rec(device("g")
                .string("productName", product)
                .string("type", "gpu")
                .int("resource.kubernetes.io/numaNode", 0)
                .cap("memory", "80Gi"))
        };
        vec![gpu("NVIDIA H100 80GB HBM3"), gpu("NVIDIA H100 80GB HBM3"), gpu("NVIDIA A100-SXM4-40GB")]
    }

    fn explain(expression: &str) -> String {
        let devices = fleet();
        let list: Vec<(&str, &DeviceRecord)> = devices.iter().map(|d| (DRIVER, d)).collect();
        breakdown(expression, &list, |_, _| Some(false)).to_string()
    }

    #[test]
    fn the_seeds_example_names_both_problems() {
        let text = explain(
            r#"device.attributes["gpu.nvidia.com"].productName == "H100" && device.attributes["gpu.nvidia.com"].memory.isGreaterThan(quantity("40Gi"))"#,
        );
        assert_eq!(
            text,
            " (clause 1 `device.attributes[\"gpu.nvidia.com\"].productName == \"H100\"` is true for 0 of 3; \
             clause 2 `device.attributes[\"gpu.nvidia.com\"].memory.isGreaterThan(quantity(\"40Gi\"))` is true for 0 of 3; \
             no device has productName \"H100\"; the values here are \"NVIDIA H100 80GB HBM3\" (2), \"NVIDIA A100-SXM4-40GB\" (1); \
             \"memory\" is a capacity, not an attribute: write device.capacity[\"gpu.nvidia.com\"].memory)"
        );
    }

    #[test]
    fn typos_get_a_did_you_mean() {
        let text = explain(r#"device.attributes["gpu.nvidia.com"].prodctName == "x""#);
        assert!(
            text.contains(
                r#"no device here has the attribute "gpu.nvidia.com/prodctName"; did you mean "productName"?"#
            ),
            "{text}"
        );
        let text = explain(r#"device.attributes["gpu.nvidia.co"].type == "gpu""#);
        assert!(
            text.contains(r#"no device here publishes the domain "gpu.nvidia.co"; did you mean "gpu.nvidia.com"?"#),
            "{text}"
        );
        let text = explain(r#"device.capacity["gpu.nvidia.com"].type == "gpu""#);
        assert!(
            text.contains(r#""type" is an attribute, not a capacity: write device.attributes["gpu.nvidia.com"].type"#),
            "{text}"
        );
    }

    #[test]
    fn a_missing_key_at_run_time_gets_a_hint() {
        let d = &fleet()[0];
        assert_eq!(missing_key_hint("productNme", d).as_deref(), Some(r#"did you mean "productName"?"#));
        assert_eq!(
            missing_key_hint("memory", d).as_deref(),
            Some(r#""memory" is a capacity, not an attribute: read it through device.capacity"#)
        );
        assert_eq!(missing_key_hint("zzzzzzzz", d), None);
    }

    #[test]
    fn a_clean_miss_has_nothing_to_add() {
        // One clause, the attribute exists, no literal to compare: the count says it all.
        assert_eq!(explain(r#"device.attributes["resource.kubernetes.io"].numaNode == 1"#), "");
    }
}
