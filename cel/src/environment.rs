//! Which Kubernetes selector environment expressions are checked against.
//!
//! Kubernetes builds the DRA selector environment per version
//! (`apiserver/pkg/cel/environment`): an option enters the environment at
//! the version that introduced it. Expressions already stored (what the
//! scheduler evaluates) see every option the binary has; new or changed
//! expressions (what the apiserver validates on write) see only those
//! introduced at or before the *compatibility* version, one minor below the
//! binary, so that a rollback cannot strand an object. For 1.34–1.36 that
//! makes one difference in the libraries: the lists extension v3
//! (`sort()`, `distinct()`, ...) is introduced at 1.34, so a 1.34 apiserver
//! refuses it in a new claim while its scheduler evaluates it. 1.37 adds
//! Kubernetes' lists library v1 (`includes` on any list) at 1.37: a 1.37
//! scheduler evaluates it, a 1.37 apiserver refuses it in a new expression
//! (its compatibility version is 1.36).
//! The `device` variable depends on feature gates: `allowMultipleAllocations`
//! (DRAConsumableCapacity, beta and on by default from 1.36) and
//! DRAListTypeAttributes (alpha in 1.36 and 1.37): attribute values declared
//! `dyn` instead of `any`, so that `all`, `exists`, `exists_one`, `map` and
//! `filter` may range over a list-typed attribute, and DRA's own `includes`
//! (the same overload as the lists library's).
//!
//! A gate (`FeatureEnabled`) decides an option for new expressions whatever
//! its version; stored expressions ignore gates and see every option the
//! binary has (`apiserver/pkg/cel/environment`, `filterAndBuildOpts`). 1.36
//! picks the attribute type from the gate when it builds the compiler, for
//! both kinds; 1.37 declares it as a versioned option (introduced at 1.36),
//! so a 1.37 scheduler iterates list attributes in stored expressions even
//! with the gate off, and only the apiserver's new-expression check follows
//! the gate.

/// Oldest and newest Kubernetes minor versions this driver models.
pub const OLDEST_MINOR: u32 = 34;
pub const NEWEST_MINOR: u32 = 37;

/// Which of Kubernetes' two environments: stored or new expressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpressionKind {
    /// Already in the cluster: what the scheduler (and our allocator)
    /// evaluates.
    Stored,
    /// Being created or changed: what the apiserver admits.
    New,
}

/// A selector environment: a Kubernetes minor version (1.`minor`), the kind
/// of expression, and the DRA feature gates that change the `device` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CelEnvironment {
    pub minor: u32,
    pub kind: ExpressionKind,
    /// DRAConsumableCapacity: `device.allowMultipleAllocations`.
    pub consumable_capacity: bool,
    /// DRAListTypeAttributes: attribute values are `dyn` (list attributes
    /// can be iterated) and `includes` is declared; see
    /// [`CelEnvironment::attributes_are_dyn`] and
    /// [`CelEnvironment::has_includes`] for where versions override it.
    pub list_type_attributes: bool,
}

impl Default for CelEnvironment {
    /// What the scheduler of the newest modelled version evaluates with every
    /// DRA gate that changes CEL on: a stored expression passed the
    /// apiserver's check already, and a device can only carry what its
    /// cluster's gates allow, so being permissive here refuses nothing the
    /// cluster would evaluate.
    fn default() -> Self {
        CelEnvironment {
            consumable_capacity: true,
            list_type_attributes: true,
            ..CelEnvironment::stored_expressions(NEWEST_MINOR)
        }
    }
}

impl CelEnvironment {
    /// Stored expressions of Kubernetes 1.`minor` with its default gates;
    /// `minor` is clamped to the modelled range.
    pub fn stored_expressions(minor: u32) -> Self {
        let minor = minor.clamp(OLDEST_MINOR, NEWEST_MINOR);
        CelEnvironment {
            minor,
            kind: ExpressionKind::Stored,
            consumable_capacity: minor >= 36,
            list_type_attributes: false,
        }
    }

    /// New expressions of Kubernetes 1.`minor` with its default gates.
    pub fn new_expressions(minor: u32) -> Self {
        CelEnvironment { kind: ExpressionKind::New, ..CelEnvironment::stored_expressions(minor) }
    }

    /// The version whose options this environment has: the binary's for
    /// stored expressions, the compatibility version (one below) for new.
    fn options_version(&self) -> u32 {
        match self.kind {
            ExpressionKind::Stored => self.minor,
            ExpressionKind::New => self.minor - 1,
        }
    }

    /// cel-go's lists extension v3, introduced at 1.34.
    pub fn has_lists_v3(&self) -> bool {
        self.options_version() >= 34
    }

    /// Whether `device` is declared at all: with DRAConsumableCapacity on,
    /// its declaration is introduced at 1.34, which a 1.34 apiserver's
    /// new-expression environment does not have yet.
    pub fn declares_device(&self) -> bool {
        !self.consumable_capacity || self.options_version() >= 34
    }

    /// `device.allowMultipleAllocations`.
    pub fn has_allow_multiple_allocations(&self) -> bool {
        self.consumable_capacity
    }

    /// `includes`: DRA's, introduced at 1.36 behind DRAListTypeAttributes
    /// (the gate admits it to new expressions whatever their compatibility
    /// version; stored expressions have it regardless of the gate), or the
    /// lists library v1's (`list_includes_dyn_dyn`, the same overload),
    /// introduced at 1.37 for every environment.
    pub fn has_includes(&self) -> bool {
        self.minor >= 36 && (self.list_type_attributes || self.kind == ExpressionKind::Stored)
    }

    /// Whether attribute values are declared `dyn` (a comprehension may
    /// range over them, the result may be `dyn`) rather than `any` (cel-go:
    /// "expression of type 'any' cannot be range of a comprehension").
    pub fn attributes_are_dyn(&self) -> bool {
        match self.minor {
            ..=35 => false,
            36 => self.list_type_attributes,
            _ => self.list_type_attributes || self.kind == ExpressionKind::Stored,
        }
    }

    /// Whether a selector may evaluate to an attribute's `any` type as well
    /// as to `bool`: 1.36 accepts `any` always and `dyn` with the gate;
    /// 1.37 accepts exactly the declared attribute type.
    pub fn accepts_result(&self, any: bool) -> bool {
        match (self.minor, any) {
            (..=36, true) => true,
            (..=36, false) => self.list_type_attributes && self.minor >= 36,
            (_, true) => !self.attributes_are_dyn(),
            (_, false) => self.attributes_are_dyn(),
        }
    }

    /// How `includes` is estimated: 1.36 charges the longest list attribute
    /// (48) flat; 1.37's lists library charges one per element of the
    /// target's estimated size (64 for an attribute).
    pub fn includes_costs_target_size(&self) -> bool {
        self.minor >= 37
    }
}
