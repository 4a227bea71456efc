//! Compiled selectors and their cached results.
//!
//! Every distinct expression is compiled once. Results are cached per
//! (expression, device) and, on top, per *match set* — the class's
//! selectors followed by a request's selectors — so that after the first
//! pass a request's verdict on a device is one byte read. The cache lives
//! as long as the fleet snapshot, i.e. it is valid for the slices' pool
//! generations; a new snapshot starts a new cache.
//!
//! Semantics follow upstream `selectorsMatch`: class selectors, then request
//! selectors, in order, stopping at the first `false`; an error (compile or
//! runtime) on a device that is actually evaluated is reported with the
//! selector's origin and index — it is never a silent "no match".

use std::collections::HashMap;
use std::sync::Arc;

use super::compact::DeviceRecord;
use super::index::Fleet;
use dra_cel as sel;

/// Where a selector comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Class,
    Request,
}

/// The outcome of a match set on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Match,
    NoMatch,
    Error { origin: Origin, index: usize, compile: bool, message: String },
}

/// `device` values kept for reuse; beyond this the cache starts over, so a
/// huge fleet does not keep one CEL value tree per device alive (results
/// stay cached, only new expressions need the trees again).
const CEL_DEVICE_CACHE: usize = 16_384;

const UNKNOWN: u8 = 0;
const NO: u8 = 1;
const YES: u8 = 2;
const ERROR: u8 = 3;

struct Expr {
    compiled: Result<Arc<sel::CompiledSelector>, String>,
    results: Vec<u8>,
    errors: HashMap<u32, String, foldhash::fast::RandomState>,
}

struct MatchSet {
    exprs: Vec<u32>,
    class_len: usize,
    results: Vec<u8>,
}

/// Identifies a match set (class selectors + request selectors).
pub(crate) type SetId = u32;

#[derive(Default)]
pub(crate) struct SelectorCache {
    env: sel::SelectorEnv,
    exprs: Vec<Expr>,
    by_text: HashMap<String, u32>,
    cel_devices: HashMap<u32, Result<Arc<sel::CelDevice>, String>, foldhash::fast::RandomState>,
    sets: Vec<MatchSet>,
    sets_by_key: HashMap<(Vec<u32>, usize), SetId>,
    /// By node position: match set → candidate devices.
    candidates: Vec<HashMap<SetId, Arc<[u32]>>>,
    /// CEL evaluations done so far (tests use it to prove caching).
    pub(crate) evaluations: u64,
}

impl std::fmt::Debug for SelectorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectorCache")
            .field("expressions", &self.exprs.len())
            .field("match_sets", &self.sets.len())
            .field("evaluations", &self.evaluations)
            .finish()
    }
}

impl SelectorCache {
    pub(crate) fn new() -> Self {
        Self { env: sel::SelectorEnv::new(), ..Default::default() }
    }

    pub(crate) fn for_environment(environment: sel::CelEnvironment) -> Self {
        Self { env: sel::SelectorEnv::for_environment(environment), ..Default::default() }
    }

    /// The environment selectors are evaluated in; its DRAListTypeAttributes
    /// gate also chooses the constraints' rule.
    pub(crate) fn environment(&self) -> sel::CelEnvironment {
        self.env.environment()
    }

    /// Drops the cached candidate lists of these node positions (`None`:
    /// all), after their views changed or positions moved.
    pub(crate) fn forget_nodes(&mut self, positions: Option<&[usize]>) {
        match positions {
            Some(ps) => {
                for &p in ps {
                    if let Some(c) = self.candidates.get_mut(p) {
                        c.clear();
                    }
                }
            }
            None => self.candidates.clear(),
        }
    }

    /// Forgets what was cached for these signature numbers: no device has
    /// them any more, and they will be given to other devices.
    pub(crate) fn forget_signatures(&mut self, signatures: &[u32]) {
        for &sig in signatures {
            for e in &mut self.exprs {
                if let Some(r) = e.results.get_mut(sig as usize) {
                    *r = UNKNOWN;
                }
                if !e.errors.is_empty() {
                    e.errors.remove(&sig);
                }
            }
            for s in &mut self.sets {
                if let Some(r) = s.results.get_mut(sig as usize) {
                    *r = UNKNOWN;
                }
            }
            self.cel_devices.remove(&sig);
        }
    }

    fn expr_id(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.by_text.get(text) {
            return id;
        }
        let compiled = self.env.compile(text).map_err(|e| e.to_string());
        let id = self.exprs.len() as u32;
        self.exprs.push(Expr { compiled, results: Vec::new(), errors: HashMap::default() });
        self.by_text.insert(text.to_string(), id);
        id
    }

    /// The match set for these class and request selector expressions.
    pub(crate) fn match_set(&mut self, class: &[&str], request: &[&str]) -> SetId {
        let exprs: Vec<u32> = class.iter().chain(request).map(|e| self.expr_id(e)).collect();
        let key = (exprs, class.len());
        if let Some(&id) = self.sets_by_key.get(&key) {
            return id;
        }
        let id = self.sets.len() as SetId;
        self.sets.push(MatchSet { exprs: key.0.clone(), class_len: class.len(), results: Vec::new() });
        self.sets_by_key.insert(key, id);
        id
    }

    /// The verdict of a match set on a device, evaluating only what is not cached.
    pub(crate) fn verdict(&mut self, fleet: &Fleet, set: SetId, device: u32) -> Verdict {
        let Some(s) = self.sets.get(set as usize) else { return Verdict::NoMatch };
        // Devices with the same driver, attributes and capacities get the same
        // answer from any selector: results are kept per such signature.
        let key = fleet.signature(device);
        match s.results.get(key as usize).copied().unwrap_or(UNKNOWN) {
            YES => return Verdict::Match,
            NO => return Verdict::NoMatch,
            _ => {}
        }
        let (exprs, class_len) = (s.exprs.clone(), s.class_len);
        let mut verdict = Verdict::Match;
        for (pos, &e) in exprs.iter().enumerate() {
            let (origin, index) =
                if pos < class_len { (Origin::Class, pos) } else { (Origin::Request, pos - class_len) };
            match self.eval(fleet, e, device) {
                Ok(true) => {}
                Ok(false) => {
                    verdict = Verdict::NoMatch;
                    break;
                }
                Err((compile, message)) => {
                    verdict = Verdict::Error { origin, index, compile, message };
                    break;
                }
            }
        }
        let code = match verdict {
            Verdict::Match => YES,
            Verdict::NoMatch => NO,
            Verdict::Error { .. } => ERROR,
        };
        if let Some(s) = self.sets.get_mut(set as usize) {
            if s.results.len() <= key as usize {
                s.results.resize(fleet.signature_count().max(key as usize + 1), UNKNOWN);
            }
            if let Some(slot) = s.results.get_mut(key as usize) {
                *slot = code;
            }
        }
        verdict
    }

    /// One expression on one device; `Err((is_compile_error, message))`.
    fn eval(&mut self, fleet: &Fleet, e: u32, device: u32) -> Result<bool, (bool, String)> {
        let Some(expr) = self.exprs.get(e as usize) else { return Ok(false) };
        let compiled = match &expr.compiled {
            Ok(c) => Arc::clone(c),
            Err(msg) => return Err((true, msg.clone())),
        };
        let key = fleet.signature(device);
        match expr.results.get(key as usize).copied().unwrap_or(UNKNOWN) {
            YES => return Ok(true),
            NO => return Ok(false),
            ERROR => return Err((false, expr.errors.get(&key).cloned().unwrap_or_default())),
            _ => {}
        }
        let outcome = match self.cel_device(fleet, device) {
            Ok(d) => {
                self.evaluations += 1;
                compiled.matches(&d).map_err(|err| err.to_string())
            }
            Err(msg) => Err(msg),
        };
        let Some(expr) = self.exprs.get_mut(e as usize) else { return Ok(false) };
        if expr.results.len() <= key as usize {
            expr.results.resize(fleet.signature_count().max(key as usize + 1), UNKNOWN);
        }
        let code = match &outcome {
            Ok(true) => YES,
            Ok(false) => NO,
            Err(msg) => {
                expr.errors.insert(key, msg.clone());
                ERROR
            }
        };
        if let Some(slot) = expr.results.get_mut(key as usize) {
            *slot = code;
        }
        outcome.map_err(|m| (false, m))
    }

    fn cel_device(&mut self, fleet: &Fleet, device: u32) -> Result<Arc<sel::CelDevice>, String> {
        let key = fleet.signature(device);
        if let Some(d) = self.cel_devices.get(&key) {
            return d.clone();
        }
        let built = match (fleet.pool_of(device), fleet.device(device)) {
            (Some(pool), Some(dev)) => cel_value(&pool.driver, dev).map(Arc::new).map_err(|e| e.to_string()),
            _ => Err("device not in the fleet".to_string()),
        };
        if self.cel_devices.len() >= CEL_DEVICE_CACHE {
            self.cel_devices.clear();
        }
        self.cel_devices.insert(key, built.clone());
        built
    }

    /// The devices of a node view that this match set selects or fails on
    /// (errors stay in so the search reports them when it reaches them), in
    /// search order. Cached per known node.
    pub(crate) fn candidates(
        &mut self,
        fleet: &Fleet,
        set: SetId,
        node_position: Option<usize>,
        view: &[u32],
    ) -> Arc<[u32]> {
        if let Some(p) = node_position
            && let Some(c) = self.candidates.get(p).and_then(|c| c.get(&set))
        {
            return Arc::clone(c);
        }
        let list: Arc<[u32]> =
            view.iter().copied().filter(|&d| self.verdict(fleet, set, d) != Verdict::NoMatch).collect();
        if let Some(p) = node_position {
            if self.candidates.len() <= p {
                self.candidates.resize_with(p + 1, HashMap::new);
            }
            if let Some(c) = self.candidates.get_mut(p) {
                c.insert(set, Arc::clone(&list));
            }
        }
        list
    }
}

/// The CEL `device` value of a compact device, built when a selector first
/// needs it.
fn cel_value(driver: &str, dev: &DeviceRecord) -> Result<sel::CelDevice, sel::EvalError> {
    use super::compact::{AttrValue, ListValue};
    let attributes = dev.attributes.iter().map(|(name, v)| {
        let value = match v {
            AttrValue::Bool(b) => sel::AttributeValue::Bool(*b),
            AttrValue::Int(i) => sel::AttributeValue::Int(*i),
            AttrValue::Str(s) => sel::AttributeValue::Str(s),
            AttrValue::Version(s) => sel::AttributeValue::Version(s),
            AttrValue::List(l) => match &**l {
                ListValue::Bools(v) => sel::AttributeValue::Bools(v),
                ListValue::Ints(v) => sel::AttributeValue::Ints(v),
                ListValue::Strings(v) => sel::AttributeValue::Strings(v),
                ListValue::Versions(v) => sel::AttributeValue::Versions(v),
            },
            AttrValue::Empty => sel::AttributeValue::Empty,
        };
        (name, value)
    });
    let capacities = dev.capacity.iter().map(|(name, c)| (name, &*c.value));
    sel::CelDevice::from_parts(driver, dev.allow_multiple_allocations, attributes, capacities)
}
