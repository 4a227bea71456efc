//! The `device` variable: built once per device, then lent to every
//! evaluation through a [`VariableResolver`], so evaluating a selector copies
//! nothing about the device.
//!
//! Mirrors `DeviceMatches` in `k8s.io/dynamic-resource-allocation/cel/compile.go`:
//! attribute and capacity names are split at the first `/` into domain and
//! id, a bare name going to the driver's domain; the outer maps answer an
//! unknown domain with an empty map (so `device.attributes["x.com"].foo` is a
//! "no such key" error, not an unknown-domain one), the inner maps fail on an
//! unknown id.

use std::any::Any;
use std::collections::BTreeMap;

use cel::ExecutionError;
use cel::common::traits::{Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelBool, CelInt, CelList, CelString, MAP_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use cel::context::VariableResolver;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use super::semver_lib::Semver;
use crate::error::EvalError;
use crate::quantity::Quantity;

/// The entries of one map, before sorting.
type Entries = Vec<(String, Box<dyn Val>)>;

/// The `device` variable of one device, ready to be evaluated against.
#[derive(Debug)]
pub struct CelDevice {
    root: SmallMap,
}

impl CelDevice {
    /// Converts `device`, published by `driver`, into its CEL value.
    ///
    /// Fails when an attribute has no value or an unparsable version, or a
    /// capacity is not a valid quantity: Kubernetes reports those as runtime
    /// errors of the selector evaluated on the device.
    pub fn new(driver: &str, device: &Device) -> Result<Self, EvalError> {
        Self::from_parts(
            driver,
            device.allow_multiple_allocations.unwrap_or(false),
            device.attributes.iter().flatten().map(|(name, a)| (name.as_str(), AttributeValue::of(a))),
            device.capacity.iter().flatten().map(|(name, c)| (name.as_str(), c.value.0.as_str())),
        )
    }

    /// The device value from its parts, for callers that keep devices in
    /// their own form (the allocator's compact fleet builds it on demand).
    pub fn from_parts<'a>(
        driver: &str,
        allow_multiple_allocations: bool,
        attributes: impl IntoIterator<Item = (&'a str, AttributeValue<'a>)>,
        capacities: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, EvalError> {
        let mut by_domain: BTreeMap<String, Entries> = BTreeMap::new();
        for (name, attribute) in attributes {
            let value = attribute_value(attribute).map_err(|e| EvalError::Device(format!("attribute {name}: {e}")))?;
            let (domain, id) = split_qualified(name, driver);
            by_domain.entry(domain.to_owned()).or_default().push((id.to_owned(), value));
        }
        let mut capacity: BTreeMap<String, Entries> = BTreeMap::new();
        for (name, quantity) in capacities {
            let value = Quantity::parse(quantity).map_err(|e| EvalError::Device(format!("capacity {name}: {e}")))?;
            let (domain, id) = split_qualified(name, driver);
            capacity.entry(domain.to_owned()).or_default().push((id.to_owned(), Box::new(value)));
        }
        let attributes = by_domain;
        let root = SmallMap::new(vec![
            ("driver".to_owned(), Box::new(CelString::from(driver.to_owned()))),
            ("allowMultipleAllocations".to_owned(), Box::new(CelBool::from(allow_multiple_allocations))),
            ("attributes".to_owned(), Box::new(DomainMap::new(attributes))),
            ("capacity".to_owned(), Box::new(DomainMap::new(capacity))),
        ]);
        Ok(CelDevice { root })
    }
}

impl VariableResolver for CelDevice {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        (variable == "device").then_some(CowVal::Borrowed(&self.root))
    }
}

/// `parseQualifiedName`: split at the first `/`, else the driver's domain.
fn split_qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

/// One attribute's value, borrowed from wherever the caller keeps it.
#[derive(Debug, Clone, Copy)]
pub enum AttributeValue<'a> {
    Bool(bool),
    Int(i64),
    Str(&'a str),
    Version(&'a str),
    /// List-typed attributes (DRAListTypeAttributes, alpha in 1.36).
    Bools(&'a [bool]),
    Ints(&'a [i64]),
    Strings(&'a [String]),
    Versions(&'a [String]),
    /// None of the value fields is set.
    Empty,
}

impl<'a> AttributeValue<'a> {
    /// The value of an API attribute (its first set field, as the API
    /// allows only one).
    pub fn of(a: &'a DeviceAttribute) -> Self {
        match a {
            DeviceAttribute { int: Some(i), .. } => Self::Int(*i),
            DeviceAttribute { bool: Some(b), .. } => Self::Bool(*b),
            DeviceAttribute { string: Some(s), .. } => Self::Str(s),
            DeviceAttribute { version: Some(v), .. } => Self::Version(v),
            DeviceAttribute { ints: Some(v), .. } => Self::Ints(v),
            DeviceAttribute { bools: Some(v), .. } => Self::Bools(v),
            DeviceAttribute { strings: Some(v), .. } => Self::Strings(v),
            DeviceAttribute { versions: Some(v), .. } => Self::Versions(v),
            _ => Self::Empty,
        }
    }
}

fn attribute_value(attribute: AttributeValue<'_>) -> Result<Box<dyn Val>, String> {
    Ok(match attribute {
        AttributeValue::Int(i) => Box::new(CelInt::from(i)),
        AttributeValue::Bool(b) => Box::new(CelBool::from(b)),
        AttributeValue::Str(s) => Box::new(CelString::from(s.to_owned())),
        AttributeValue::Version(v) => Box::new(Semver::parse(v, false).map_err(|e| e.to_string())?),
        AttributeValue::Ints(ints) => list(ints.iter().map(|i| Box::new(CelInt::from(*i)) as Box<dyn Val>).collect()),
        AttributeValue::Bools(b) => list(b.iter().map(|b| Box::new(CelBool::from(*b)) as Box<dyn Val>).collect()),
        AttributeValue::Strings(s) => {
            list(s.iter().map(|s| Box::new(CelString::from(s.clone())) as Box<dyn Val>).collect())
        }
        AttributeValue::Versions(versions) => {
            let values: Result<Vec<Box<dyn Val>>, _> =
                versions.iter().map(|v| Semver::parse(v, false).map(|s| Box::new(s) as Box<dyn Val>)).collect();
            list(values.map_err(|e| e.to_string())?)
        }
        AttributeValue::Empty => {
            return Err("unsupported attribute value: none of int, bool, string, version is set".to_owned());
        }
    })
}

fn list(values: Vec<Box<dyn Val>>) -> Box<dyn Val> {
    Box::new(CelList::from(values))
}

/// The parts of `Val` that are the same for both device maps: a CEL map,
/// indexed, cloned and downcast as itself.
macro_rules! map_val_basics {
    () => {
        fn get_type(&self) -> &Type {
            &MAP_TYPE
        }

        fn cel_type() -> &'static Type {
            &MAP_TYPE
        }

        fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
        where
            Self: 'v,
        {
            Some(self)
        }

        fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
            Box::new(self.clone())
        }

        fn as_any(&self) -> Option<&dyn Any> {
            Some(self)
        }
    };
}

/// `Indexer::steal` for maps whose values are cheap to copy: what `get`
/// lends, owned.
macro_rules! steal_by_copy {
    () => {
        fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
        where
            Self: 'v,
        {
            self.get(idx).map(CowVal::into_owned)
        }
    };
}

/// A small string-keyed map: a sorted vector searched by binary search.
/// Device maps hold a few dozen entries at most, where this beats hashing
/// (no SipHash of the key on every lookup).
#[derive(Debug, Clone, Default)]
struct SmallMap {
    keys: Vec<CelString<'static>>,
    values: Vec<Box<dyn Val>>,
}

impl SmallMap {
    fn new(mut entries: Vec<(String, Box<dyn Val>)>) -> Self {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let (keys, values) = entries.into_iter().map(|(k, v)| (CelString::from(k), v)).unzip();
        SmallMap { keys, values }
    }

    fn find(&self, key: &dyn Val) -> Option<&(dyn Val + 'static)> {
        let key = key.downcast_ref::<CelString>()?.inner();
        let i = self.keys.binary_search_by(|k| k.inner().cmp(key)).ok()?;
        self.values.get(i).map(|v| v.as_ref())
    }

    fn lookup<'b, 'v>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        if let Some(found) = self.find(key) {
            return Ok(CowVal::Borrowed(found));
        }
        match key.downcast_ref::<CelString>() {
            Some(name) => Err(ExecutionError::no_such_key(name.inner())),
            None => {
                Err(ExecutionError::UnexpectedType { got: key.get_type().name().to_owned(), want: "string".to_owned() })
            }
        }
    }
}

struct KeyIter<'b>(std::slice::Iter<'b, CelString<'static>>);

impl<'b, 'v> cel::common::traits::Iterator<'b, 'v> for KeyIter<'b> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'v)> {
        self.0.next().map(|k| k as &dyn Val)
    }
}

impl Val for SmallMap {
    map_val_basics!();

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_iterable<'b, 'v>(&'b self) -> Option<&'b (dyn Iterable + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<SmallMap>().is_some_and(|o| {
            o.keys == self.keys && o.values.iter().zip(&self.values).all(|(a, b)| a.equals(b.as_ref()))
        })
    }
}

impl StaticVal for SmallMap {}

impl Container for SmallMap {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        Ok(self.find(value).is_some())
    }
}

impl Indexer for SmallMap {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.lookup(idx)
    }

    steal_by_copy!();
}

impl Iterable for SmallMap {
    fn iter<'b, 'v>(&'b self) -> Box<dyn cel::common::traits::Iterator<'b, 'v> + 'b>
    where
        Self: 'v,
    {
        Box::new(KeyIter(self.keys.iter()))
    }
}

impl Sizer for SmallMap {
    fn size(&self) -> CelInt {
        CelInt::from(self.keys.len() as i64)
    }
}

/// The outer `attributes`/`capacity` map: domain → map of id → value, where a
/// missing domain reads as an empty map (`newStringInterfaceMapWithDefault`).
/// `in`, `size()` and iteration see only the domains the device has.
#[derive(Debug, Clone)]
struct DomainMap {
    domains: SmallMap,
    empty: SmallMap,
}

impl DomainMap {
    fn new(domains: BTreeMap<String, Entries>) -> Self {
        let domains =
            domains.into_iter().map(|(domain, ids)| (domain, Box::new(SmallMap::new(ids)) as Box<dyn Val>)).collect();
        DomainMap { domains: SmallMap::new(domains), empty: SmallMap::default() }
    }
}

impl Val for DomainMap {
    map_val_basics!();

    fn as_container(&self) -> Option<&dyn Container> {
        Some(&self.domains)
    }

    fn as_iterable<'b, 'v>(&'b self) -> Option<&'b (dyn Iterable + 'v)>
    where
        Self: 'v,
    {
        Some(&self.domains)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(&self.domains)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        other.downcast_ref::<DomainMap>().is_some_and(|o| self.domains.equals(&o.domains))
    }
}

impl StaticVal for DomainMap {}

impl Indexer for DomainMap {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match self.domains.find(idx) {
            Some(found) => Ok(CowVal::Borrowed(found)),
            None if idx.downcast_ref::<CelString>().is_some() => Ok(CowVal::Borrowed(&self.empty)),
            None => self.domains.lookup(idx),
        }
    }

    steal_by_copy!();
}
