//! The functions the selector environment declares, as Kubernetes 1.34–1.37
//! declares them (cel-go's standard library and the extensions and
//! Kubernetes libraries its `environment` package enables), written as a
//! table: one overload per line, `g` for a global function and `m` for a
//! method (the receiver is the first parameter), `!` at the end for an
//! overload Kubernetes has and this driver does not evaluate.
//! `{C}` expands to each comparable type and `{S}` to each summable one, as
//! the templated overloads of the lists libraries do.

use std::collections::HashMap;

use super::types::{ObjectType, Type};
use crate::environment::CelEnvironment;

/// cel-go's standard library, with `CrossTypeNumericComparisons` on.
const STANDARD: &str = "
g _?_:_(bool, A, A) -> A
g _&&_(bool, bool) -> bool
g _||_(bool, bool) -> bool
g !_(bool) -> bool
g @not_strictly_false(bool) -> bool
g _==_(A, A) -> bool
g _!=_(A, A) -> bool
g _+_(bytes, bytes) -> bytes
g _+_(double, double) -> double
g _+_(duration, duration) -> duration
g _+_(duration, timestamp) -> timestamp
g _+_(timestamp, duration) -> timestamp
g _+_(int, int) -> int
g _+_(list(A), list(A)) -> list(A)
g _+_(string, string) -> string
g _+_(uint, uint) -> uint
g _/_(double, double) -> double
g _/_(int, int) -> int
g _/_(uint, uint) -> uint
g _%_(int, int) -> int
g _%_(uint, uint) -> uint
g _*_(double, double) -> double
g _*_(int, int) -> int
g _*_(uint, uint) -> uint
g -_(double) -> double
g -_(int) -> int
g _-_(double, double) -> double
g _-_(duration, duration) -> duration
g _-_(int, int) -> int
g _-_(timestamp, duration) -> timestamp
g _-_(timestamp, timestamp) -> duration
g _-_(uint, uint) -> uint
g _[_](list(A), int) -> A
g _[_](map(A, B), A) -> B
g @in(A, list(A)) -> bool
g @in(A, map(A, B)) -> bool
g size(bytes) -> int
m size(bytes) -> int
g size(list(A)) -> int
m size(list(A)) -> int
g size(map(A, B)) -> int
m size(map(A, B)) -> int
g size(string) -> int
m size(string) -> int
g type(A) -> type(A)
g bool(bool) -> bool
g bool(string) -> bool
g bytes(bytes) -> bytes
g bytes(string) -> bytes
g double(double) -> double
g double(int) -> double
g double(string) -> double
g double(uint) -> double
g duration(duration) -> duration
g duration(int) -> duration
g duration(string) -> duration
g dyn(A) -> dyn
g int(int) -> int
g int(double) -> int
g int(duration) -> int
g int(string) -> int
g int(timestamp) -> int
g int(uint) -> int
g string(string) -> string
g string(bool) -> string
g string(bytes) -> string
g string(double) -> string
g string(duration) -> string
g string(int) -> string
g string(timestamp) -> string
g string(uint) -> string
g timestamp(timestamp) -> timestamp
g timestamp(int) -> timestamp
g timestamp(string) -> timestamp
g uint(uint) -> uint
g uint(double) -> uint
g uint(int) -> uint
g uint(string) -> uint
m contains(string, string) -> bool
m endsWith(string, string) -> bool
m startsWith(string, string) -> bool
g matches(string, string) -> bool
m matches(string, string) -> bool
m getFullYear(timestamp) -> int
m getFullYear(timestamp, string) -> int
m getMonth(timestamp) -> int
m getMonth(timestamp, string) -> int
m getDayOfYear(timestamp) -> int
m getDayOfYear(timestamp, string) -> int
m getDayOfMonth(timestamp) -> int
m getDayOfMonth(timestamp, string) -> int
m getDate(timestamp) -> int
m getDate(timestamp, string) -> int
m getDayOfWeek(timestamp) -> int
m getDayOfWeek(timestamp, string) -> int
m getHours(timestamp) -> int
m getHours(timestamp, string) -> int
m getHours(duration) -> int
m getMinutes(timestamp) -> int
m getMinutes(timestamp, string) -> int
m getMinutes(duration) -> int
m getSeconds(timestamp) -> int
m getSeconds(timestamp, string) -> int
m getSeconds(duration) -> int
m getMilliseconds(timestamp) -> int
m getMilliseconds(timestamp, string) -> int
m getMilliseconds(duration) -> int
";

/// The ordering operators of the standard library: every comparable type
/// with itself, and the numeric types with each other.
const ORDERING_OPERATORS: [&str; 4] = ["_<_", "_<=_", "_>_", "_>=_"];
const ORDERED_PAIRS: [(&str, &str); 14] = [
    ("bool", "bool"),
    ("int", "int"),
    ("int", "double"),
    ("int", "uint"),
    ("uint", "uint"),
    ("uint", "double"),
    ("uint", "int"),
    ("double", "double"),
    ("double", "int"),
    ("double", "uint"),
    ("string", "string"),
    ("bytes", "bytes"),
    ("timestamp", "timestamp"),
    ("duration", "duration"),
];

/// cel-go's strings extension at version 2 (Kubernetes 1.29+).
const STRINGS_V2: &str = "
m charAt(string, int) -> string
m indexOf(string, string) -> int
m indexOf(string, string, int) -> int
m lastIndexOf(string, string) -> int
m lastIndexOf(string, string, int) -> int
m lowerAscii(string) -> string
m replace(string, string, string) -> string
m replace(string, string, string, int) -> string
m split(string, string) -> list(string)
m split(string, string, int) -> list(string)
m substring(string, int) -> string
m substring(string, int, int) -> string
m trim(string) -> string
m upperAscii(string) -> string
m format(string, list(dyn)) -> string !
g strings.quote(string) -> string
m join(list(string)) -> string
m join(list(string), string) -> string
";

/// cel-go's sets extension (Kubernetes 1.29+).
const SETS: &str = "
g sets.contains(list(A), list(A)) -> bool
g sets.equivalent(list(A), list(A)) -> bool
g sets.intersects(list(A), list(A)) -> bool
";

/// cel-go's lists extension at version 3 (Kubernetes 1.34+); `sortBy` is a
/// macro calling `@sortByAssociatedKeys`.
const LISTS_V3: &str = "
m slice(list(A), int, int) -> list(A)
m flatten(list(list(A))) -> list(A)
m flatten(list(dyn), int) -> list(dyn)
m sort(list({C})) -> list({C})
m @sortByAssociatedKeys(list(A), list({C})) -> list(A)
g lists.range(int) -> list(int)
m reverse(list(A)) -> list(A)
m distinct(list(A)) -> list(A)
";

/// Kubernetes' own libraries that every version has: lists, regex, URLs.
const KUBERNETES_BASE: &str = "
m isSorted(list({C})) -> bool
m sum(list({S})) -> {S}
m max(list({C})) -> {C}
m min(list({C})) -> {C}
m indexOf(list(A), A) -> int
m lastIndexOf(list(A), A) -> int
m find(string, string) -> string
m findAll(string, string) -> list(string)
m findAll(string, string, int) -> list(string)
g url(string) -> kubernetes.URL
m getScheme(kubernetes.URL) -> string
m getHost(kubernetes.URL) -> string
m getHostname(kubernetes.URL) -> string
m getPort(kubernetes.URL) -> string
m getEscapedPath(kubernetes.URL) -> string
m getQuery(kubernetes.URL) -> map(string, list(string))
g isURL(string) -> bool
";

/// Two-variable comprehensions (Kubernetes 1.32+): the map-building
/// function their `transformMap` / `transformMapEntry` expansions call.
const TWO_VARIABLE_COMPREHENSIONS: &str = "
g cel.@mapInsert(map(A, B), A, B) -> map(A, B)
g cel.@mapInsert(map(A, B), map(A, B)) -> map(A, B)
";

/// Optional types (Kubernetes 1.28+, cel-go's latest optional library);
/// `_?._` is checked as a field selection.
const OPTIONAL: &str = "
g optional.of(A) -> optional(A)
g optional.ofNonZeroValue(A) -> optional(A)
g optional.none() -> optional(A)
m value(optional(A)) -> A
m hasValue(optional(A)) -> bool
m or(optional(A), optional(A)) -> optional(A)
m orValue(optional(A), A) -> A
g _[?_](list(A), int) -> optional(A)
g _[?_](optional(list(A)), int) -> optional(A)
g _[?_](map(A, B), A) -> optional(B)
g _[?_](optional(map(A, B)), A) -> optional(B)
g _[_](optional(list(A)), int) -> optional(A)
g _[_](optional(map(A, B)), A) -> optional(B)
m first(list(A)) -> optional(A)
m last(list(A)) -> optional(A)
g optional.unwrap(list(optional(A))) -> list(A)
m unwrapOpt(list(optional(A))) -> list(A)
";

/// Kubernetes' quantity library (1.28+).
const QUANTITY: &str = "
g quantity(string) -> kubernetes.Quantity
g isQuantity(string) -> bool
g sign(kubernetes.Quantity) -> int
m isGreaterThan(kubernetes.Quantity, kubernetes.Quantity) -> bool
m isLessThan(kubernetes.Quantity, kubernetes.Quantity) -> bool
m compareTo(kubernetes.Quantity, kubernetes.Quantity) -> int
m asApproximateFloat(kubernetes.Quantity) -> double
m asInteger(kubernetes.Quantity) -> int
m isInteger(kubernetes.Quantity) -> bool
m add(kubernetes.Quantity, kubernetes.Quantity) -> kubernetes.Quantity
m add(kubernetes.Quantity, int) -> kubernetes.Quantity
m sub(kubernetes.Quantity, kubernetes.Quantity) -> kubernetes.Quantity
m sub(kubernetes.Quantity, int) -> kubernetes.Quantity
";

/// Kubernetes' IP and CIDR libraries (1.30+).
const IP_CIDR: &str = "
g ip(string) -> net.IP
m family(net.IP) -> int
g ip.isCanonical(string) -> bool
m isUnspecified(net.IP) -> bool
m isLoopback(net.IP) -> bool
m isLinkLocalMulticast(net.IP) -> bool
m isLinkLocalUnicast(net.IP) -> bool
m isGlobalUnicast(net.IP) -> bool
g isIP(string) -> bool
g string(net.IP) -> string
g cidr(string) -> net.CIDR
m containsIP(net.CIDR, string) -> bool
m containsIP(net.CIDR, net.IP) -> bool
m containsCIDR(net.CIDR, string) -> bool
m containsCIDR(net.CIDR, net.CIDR) -> bool
m ip(net.CIDR) -> net.IP
m prefixLength(net.CIDR) -> int
m masked(net.CIDR) -> net.CIDR
g isCIDR(string) -> bool
g string(net.CIDR) -> string
";

/// Kubernetes' format library (1.31+).
const FORMAT: &str = "
g format.dns1123Label() -> kubernetes.NamedFormat
g format.dns1123Subdomain() -> kubernetes.NamedFormat
g format.dns1035Label() -> kubernetes.NamedFormat
g format.qualifiedName() -> kubernetes.NamedFormat
g format.dns1123LabelPrefix() -> kubernetes.NamedFormat
g format.dns1123SubdomainPrefix() -> kubernetes.NamedFormat
g format.dns1035LabelPrefix() -> kubernetes.NamedFormat
g format.labelValue() -> kubernetes.NamedFormat
g format.uri() -> kubernetes.NamedFormat
g format.uuid() -> kubernetes.NamedFormat
g format.byte() -> kubernetes.NamedFormat
g format.date() -> kubernetes.NamedFormat
g format.datetime() -> kubernetes.NamedFormat
m validate(kubernetes.NamedFormat, string) -> optional(list(string))
g format.named(string) -> optional(kubernetes.NamedFormat)
";

/// Kubernetes' semver library at version 1 (1.33+).
const SEMVER_V1: &str = "
g semver(string) -> kubernetes.Semver
g semver(string, bool) -> kubernetes.Semver
g isSemver(string) -> bool
g isSemver(string, bool) -> bool
m isGreaterThan(kubernetes.Semver, kubernetes.Semver) -> bool
m isLessThan(kubernetes.Semver, kubernetes.Semver) -> bool
m compareTo(kubernetes.Semver, kubernetes.Semver) -> int
m major(kubernetes.Semver) -> int
m minor(kubernetes.Semver) -> int
m patch(kubernetes.Semver) -> int
";

/// DRA's `includes` (1.36, behind DRAListTypeAttributes).
const DRA_INCLUDES: &str = "
m includes(dyn, dyn) -> bool
";

const COMPARABLE: [&str; 8] = ["int", "uint", "double", "bool", "duration", "timestamp", "string", "bytes"];
const SUMMABLE: [&str; 4] = ["int", "uint", "double", "duration"];

/// One overload of a function.
#[derive(Debug, Clone)]
pub struct Overload {
    /// Called as `target.name(args)`; the target is `params[0]`.
    pub member: bool,
    pub params: Vec<Type>,
    pub result: Type,
    /// Kubernetes has it; this driver does not evaluate it.
    pub unsupported: bool,
    /// Type parameters (`A`, `B`) in `params` and `result`.
    pub type_params: u32,
}

/// The functions of one environment, by name.
#[derive(Debug, Default)]
pub struct Declarations {
    functions: HashMap<String, Vec<Overload>>,
}

impl Declarations {
    /// The declarations of `env`: what its Kubernetes version enables for
    /// the kind of expression it checks.
    pub fn for_environment(env: &CelEnvironment) -> Declarations {
        let mut decls = Declarations::default();
        for table in [
            STANDARD,
            STRINGS_V2,
            SETS,
            KUBERNETES_BASE,
            TWO_VARIABLE_COMPREHENSIONS,
            OPTIONAL,
            QUANTITY,
            IP_CIDR,
            FORMAT,
            SEMVER_V1,
        ] {
            decls.add_table(table);
        }
        for op in ORDERING_OPERATORS {
            for (a, b) in ORDERED_PAIRS {
                decls.add_line(&format!("g {op}({a}, {b}) -> bool"));
            }
        }
        if env.has_lists_v3() {
            decls.add_table(LISTS_V3);
        }
        if env.has_includes() {
            decls.add_table(DRA_INCLUDES);
        }
        decls
    }

    /// The overloads of `name`, if it is declared.
    pub fn function(&self, name: &str) -> Option<&[Overload]> {
        self.functions.get(name).map(Vec::as_slice)
    }

    fn add_table(&mut self, table: &str) {
        for line in table.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if line.contains("{C}") {
                for t in COMPARABLE {
                    self.add_line(&line.replace("{C}", t));
                }
            } else if line.contains("{S}") {
                for t in SUMMABLE {
                    self.add_line(&line.replace("{S}", t));
                }
            } else {
                self.add_line(line);
            }
        }
    }

    /// Adds one table line. The tables are constants checked by the tests
    /// below; a malformed line is a programming error and is skipped in a
    /// release build rather than taking the process down.
    fn add_line(&mut self, line: &str) {
        match parse_line(line) {
            Some((name, overload)) => self.functions.entry(name).or_default().push(overload),
            None => debug_assert!(false, "malformed declaration: {line}"),
        }
    }
}

/// `g name(t, ...) -> t [!]`.
fn parse_line(line: &str) -> Option<(String, Overload)> {
    let (kind, rest) = line.split_once(' ')?;
    let member = match kind {
        "m" => true,
        "g" => false,
        _ => return None,
    };
    let (rest, unsupported) = match rest.strip_suffix(" !") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    let (signature, result) = rest.rsplit_once(" -> ")?;
    let open = signature.find('(')?;
    let name = &signature[..open];
    let args = signature[open + 1..].strip_suffix(')')?;
    let mut params = Vec::new();
    let mut parser = TypeParser { text: args, pos: 0, max_param: 0 };
    parser.skip_spaces();
    while parser.pos < parser.text.len() {
        params.push(parser.parse()?);
        parser.skip_spaces();
        if parser.eat(',') {
            parser.skip_spaces();
        }
    }
    let mut result_parser = TypeParser { text: result.trim(), pos: 0, max_param: parser.max_param };
    let result = result_parser.parse()?;
    if member && params.is_empty() {
        return None;
    }
    Some((name.to_owned(), Overload { member, params, result, unsupported, type_params: result_parser.max_param }))
}

struct TypeParser<'a> {
    text: &'a str,
    pos: usize,
    /// One more than the highest type parameter seen.
    max_param: u32,
}

impl TypeParser<'_> {
    fn skip_spaces(&mut self) {
        while self.text[self.pos..].starts_with(' ') {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.text[self.pos..].starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn word(&mut self) -> &str {
        let rest = &self.text[self.pos..];
        let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_')).unwrap_or(rest.len());
        self.pos += len;
        &rest[..len]
    }

    fn parse(&mut self) -> Option<Type> {
        let word = self.word().to_owned();
        let t = match word.as_str() {
            "list" | "optional" | "type" => {
                if !self.eat('(') {
                    return (word == "type").then_some(Type::Type(None));
                }
                let inner = self.parse()?;
                if !self.eat(')') {
                    return None;
                }
                match word.as_str() {
                    "list" => Type::list(inner),
                    "optional" => Type::Optional(Box::new(inner)),
                    _ => Type::Type(Some(Box::new(inner))),
                }
            }
            "map" => {
                if !self.eat('(') {
                    return None;
                }
                let key = self.parse()?;
                self.eat(',');
                self.skip_spaces();
                let value = self.parse()?;
                if !self.eat(')') {
                    return None;
                }
                Type::map(key, value)
            }
            "A" | "B" => {
                let index = u32::from(word != "A");
                self.max_param = self.max_param.max(index + 1);
                Type::Param(index)
            }
            other => simple_type(other)?,
        };
        Some(t)
    }
}

fn simple_type(name: &str) -> Option<Type> {
    Some(match name {
        "dyn" => Type::Dyn,
        "any" => Type::Any,
        "null" => Type::Null,
        "bool" => Type::Bool,
        "int" => Type::Int,
        "uint" => Type::Uint,
        "double" => Type::Double,
        "string" => Type::String,
        "bytes" => Type::Bytes,
        "duration" => Type::Duration,
        "timestamp" => Type::Timestamp,
        "kubernetes.Quantity" => Type::Object(ObjectType::Quantity),
        "kubernetes.Semver" => Type::Object(ObjectType::Semver),
        "kubernetes.URL" => Type::Object(ObjectType::Url),
        "kubernetes.NamedFormat" => Type::Object(ObjectType::NamedFormat),
        "net.IP" => Type::Object(ObjectType::Ip),
        "net.CIDR" => Type::Object(ObjectType::Cidr),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_line_parses() {
        let all =
            [STANDARD, STRINGS_V2, SETS, LISTS_V3, KUBERNETES_BASE, OPTIONAL, QUANTITY, IP_CIDR, FORMAT, SEMVER_V1]
                .concat();
        for line in all.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let line = line.replace("{C}", "int").replace("{S}", "int");
            assert!(parse_line(&line).is_some(), "{line}");
        }
    }

    #[test]
    fn a_line_reads_as_its_overload() {
        let (name, o) = parse_line("g _[_](map(A, B), A) -> B").unwrap();
        assert_eq!(name, "_[_]");
        assert!(!o.member);
        assert_eq!(o.params, vec![Type::map(Type::Param(0), Type::Param(1)), Type::Param(0)]);
        assert_eq!(o.result, Type::Param(1));
        assert_eq!(o.type_params, 2);
        let (_, o) = parse_line("m validate(kubernetes.NamedFormat, string) -> optional(list(string)) !").unwrap();
        assert!(o.member && o.unsupported);
        assert_eq!(o.result.to_string(), "optional_type(list(string))");
    }

    #[test]
    fn lists_v3_depends_on_the_environment() {
        let new_134 = Declarations::for_environment(&CelEnvironment::new_expressions(34));
        assert!(new_134.function("sort").is_none());
        let stored_134 = Declarations::for_environment(&CelEnvironment::stored_expressions(34));
        assert!(stored_134.function("sort").is_some());
        let new_135 = Declarations::for_environment(&CelEnvironment::new_expressions(35));
        assert_eq!(new_135.function("sort").map(<[_]>::len), Some(8));
    }
}
