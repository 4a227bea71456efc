//! What the checker found out about an expression, for the cost estimate
//! beside it: in its own file so that `cost` reads it without importing the
//! checker that produces it.

use std::collections::HashMap;

use super::decls::Overload;
use super::types::Type;
use crate::environment::CelEnvironment;

/// The types of a checked expression.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The type of the whole expression.
    pub result: Type,
    /// The type of every node, by id, with unbound variables as `dyn`.
    pub types: HashMap<u64, Type>,
    /// Every call, by id: the function (namespaced functions by their full
    /// name) and the overloads that accept its arguments.
    pub calls: HashMap<u64, ResolvedCall>,
    /// The environment it was checked in (some estimates differ by version).
    pub environment: CelEnvironment,
}

/// The overloads a call may take at run time, as the checker resolved them.
#[derive(Debug, Clone)]
pub struct ResolvedCall {
    pub function: String,
    pub overloads: Vec<Overload>,
}
