//! One rule a slice breaks, as the apiserver reports it. Its own module
//! because the slice rules and the request-policy rules both report them,
//! and neither owns the other.

use std::fmt;

/// One broken rule: the field path as the apiserver prints it and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub rule: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}
