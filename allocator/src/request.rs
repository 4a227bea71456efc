//! Claims turned into search plans: each request with its alternatives
//! (one for `exactly`, one per `firstAvailable` subrequest, in order), its
//! class, compiled match set, mode, tolerations and capacity requests; and
//! the claim's constraints.
//!
//! Inputs may come straight from YAML, so defaults are applied here as the
//! apiserver would (`allocationMode` ExactCount, `count` 1), and what the
//! apiserver would reject is an error naming the field.

use std::collections::BTreeMap;
use std::collections::HashMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequirements, DeviceClass, DeviceSelector, DeviceToleration, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::constraints::{Constraint, Kind};
use super::error::FatalError;
use super::selectors::{SelectorCache, SetId};
use super::state::owner_of;

/// `AllocationResultsMaxSize`.
pub(crate) const MAX_RESULTS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Count(usize),
    All,
}

/// One way to satisfy a request.
#[derive(Debug, Clone)]
pub(crate) struct Alternative<'c> {
    /// The subrequest name for `firstAvailable`.
    pub(crate) sub: Option<&'c str>,
    pub(crate) class: &'c DeviceClass,
    pub(crate) set: SetId,
    /// The class's selector expressions, then the request's.
    pub(crate) class_exprs: Vec<&'c str>,
    pub(crate) exprs: Vec<&'c str>,
    pub(crate) mode: Mode,
    pub(crate) admin: bool,
    pub(crate) tolerations: &'c [DeviceToleration],
    pub(crate) capacity: Option<&'c BTreeMap<String, Quantity>>,
}

#[derive(Debug, Clone)]
pub(crate) struct RequestPlan<'c> {
    pub(crate) name: &'c str,
    pub(crate) first_available: bool,
    pub(crate) alternatives: Vec<Alternative<'c>>,
}

impl RequestPlan<'_> {
    /// `req` or `req/sub`.
    pub(crate) fn result_name(&self, alt: usize) -> String {
        match self.alternatives.get(alt).and_then(|a| a.sub) {
            Some(sub) => format!("{}/{sub}", self.name),
            None => self.name.to_string(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ClaimPlan<'c> {
    pub(crate) claim: &'c ResourceClaim,
    /// `namespace/name`.
    pub(crate) name: String,
    pub(crate) requests: Vec<RequestPlan<'c>>,
    pub(crate) constraints: Vec<Constraint>,
}

fn invalid(claim: &str, field: String, reason: impl Into<String>) -> FatalError {
    FatalError::InvalidClaim { claim: claim.to_string(), field, reason: reason.into() }
}

fn expressions<'s>(
    claim: &str,
    field: &str,
    selectors: Option<&'s [DeviceSelector]>,
) -> Result<Vec<&'s str>, FatalError> {
    selectors
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.cel.as_ref().map(|c| c.expression.as_str()).ok_or_else(|| {
                invalid(claim, format!("{field}.selectors[{i}]"), "CEL expression empty (unsupported selector type?)")
            })
        })
        .collect()
}

fn mode(claim: &str, field: &str, mode: Option<&str>, count: Option<i64>) -> Result<Mode, FatalError> {
    match mode.unwrap_or("ExactCount") {
        "" | "ExactCount" => match count.unwrap_or(1) {
            0 => Ok(Mode::Count(1)),
            n if n < 0 => Err(invalid(claim, format!("{field}.count"), format!("{n} must be greater than zero"))),
            n => Ok(Mode::Count(usize::try_from(n).unwrap_or(usize::MAX))),
        },
        "All" => match count {
            None | Some(0) => Ok(Mode::All),
            Some(n) => Err(invalid(
                claim,
                format!("{field}.count"),
                format!("{n} must not be specified when allocationMode is 'All'"),
            )),
        },
        other => Err(invalid(
            claim,
            format!("{field}.allocationMode"),
            format!("unsupported count mode {other}; use ExactCount or All"),
        )),
    }
}

/// Builds the plan of one claim; class lookups and selector compilation
/// happen here (compile errors surface later, when a device is evaluated).
pub(crate) fn plan<'c>(
    claim: &'c ResourceClaim,
    classes: &'c HashMap<String, DeviceClass>,
    selectors: &mut SelectorCache,
) -> Result<ClaimPlan<'c>, FatalError> {
    let name = owner_of(claim);
    let spec = claim.spec.as_ref().and_then(|s| s.devices.as_ref());
    let mut requests = Vec::new();
    for (ri, r) in spec.and_then(|d| d.requests.as_deref()).unwrap_or_default().iter().enumerate() {
        let field = format!("spec.devices.requests[{ri}]");
        let mut alternatives = Vec::new();
        let class_of = |class_name: &str, request: String| {
            classes.get(class_name).ok_or_else(|| FatalError::ClassNotFound {
                claim: name.clone(),
                request,
                class: class_name.to_string(),
            })
        };
        match (&r.exactly, &r.first_available) {
            (Some(e), None) => {
                let class = class_of(&e.device_class_name, r.name.clone())?;
                let exprs = expressions(&name, &format!("{field}.exactly"), e.selectors.as_deref())?;
                let class_exprs =
                    expressions(&name, "class", class.spec.as_ref().and_then(|s| s.selectors.as_deref()))?;
                alternatives.push(Alternative {
                    sub: None,
                    class,
                    set: selectors.match_set(&class_exprs, &exprs),
                    class_exprs,
                    exprs,
                    mode: mode(&name, &format!("{field}.exactly"), e.allocation_mode.as_deref(), e.count)?,
                    admin: e.admin_access == Some(true),
                    tolerations: e.tolerations.as_deref().unwrap_or_default(),
                    capacity: e.capacity.as_ref().and_then(|c: &CapacityRequirements| c.requests.as_ref()),
                });
            }
            (None, Some(subs)) if !subs.is_empty() => {
                for (si, s) in subs.iter().enumerate() {
                    let sfield = format!("{field}.firstAvailable[{si}]");
                    let class = class_of(&s.device_class_name, format!("{}/{}", r.name, s.name))?;
                    let exprs = expressions(&name, &sfield, s.selectors.as_deref())?;
                    let class_exprs =
                        expressions(&name, "class", class.spec.as_ref().and_then(|s| s.selectors.as_deref()))?;
                    alternatives.push(Alternative {
                        sub: Some(s.name.as_str()),
                        class,
                        set: selectors.match_set(&class_exprs, &exprs),
                        class_exprs,
                        exprs,
                        mode: mode(&name, &sfield, s.allocation_mode.as_deref(), s.count)?,
                        admin: false,
                        tolerations: s.tolerations.as_deref().unwrap_or_default(),
                        capacity: s.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                    });
                }
            }
            _ => {
                return Err(invalid(&name, field, "exactly one of exactly or firstAvailable (non-empty) must be set"));
            }
        }
        requests.push(RequestPlan {
            name: r.name.as_str(),
            first_available: r.first_available.is_some(),
            alternatives,
        });
    }
    let mut constraints = Vec::new();
    let lists = selectors.environment().list_type_attributes;
    for (ci, c) in spec.and_then(|d| d.constraints.as_deref()).unwrap_or_default().iter().enumerate() {
        let scope = c.requests.clone().unwrap_or_default();
        let constraint = match (&c.match_attribute, &c.distinct_attribute) {
            (Some(a), None) => Constraint::new(Kind::Match, a.clone(), scope, lists),
            (None, Some(a)) => Constraint::new(Kind::Distinct, a.clone(), scope, lists),
            _ => {
                return Err(invalid(
                    &name,
                    format!("spec.devices.constraints[{ci}]"),
                    "empty constraint (unsupported constraint type?): set exactly one of matchAttribute or distinctAttribute",
                ));
            }
        };
        constraints.push(constraint);
    }
    Ok(ClaimPlan { claim, name, requests, constraints })
}
