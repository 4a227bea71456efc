//! The errors of compiling and evaluating a selector, in their own module so
//! that the environment and the device value below the front door can name
//! them without importing it.

/// Why an expression does not compile. The message names the problem only;
/// the caller adds which claim, class and selector it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("expression is {len} bytes long, more than the limit of {limit} bytes")]
    TooLong { len: usize, limit: usize },
    #[error("syntax error: {0}")]
    Syntax(String),
    #[error("expression nests deeper than the limit of {limit} levels")]
    TooDeep { limit: usize },
    #[error("{0}")]
    InvalidRegex(String),
    #[error("{0}")]
    InvalidLiteral(String),
    /// Kubernetes' words: an attribute's value has the unknown type, which
    /// may turn out to be a bool.
    #[error("must evaluate to bool or the unknown type, not {0}")]
    NotBool(String),
    /// Type errors, each `line:column: message` in cel-go's words.
    #[error("type error: {}", .0.join("; "))]
    Type(Vec<String>),
    #[error(
        "`{0}` is not supported by this driver's CEL (Kubernetes has it); see docs/claims.md, \"CEL selectors: what is supported\""
    )]
    Unsupported(String),
    /// The apiserver's words for a selector whose estimated worst case
    /// exceeds [`crate::MAX_COST`]; only new expressions are refused so.
    #[error(
        "too complex, exceeds cost limit: the worst case is estimated at {estimated} cost units, more than the limit of {limit}; bound the loops (fewer or shorter lists) or drop nested ones"
    )]
    TooComplex { estimated: u64, limit: u64 },
    #[error("cannot build the CEL environment: {0}")]
    Environment(String),
}

/// Why evaluating a selector on a device failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("{0}")]
    Runtime(String),
    #[error("expression must evaluate to bool, got {0}")]
    NotBool(String),
    #[error("evaluation exceeded the cost budget of {limit} units; simplify the expression")]
    CostExceeded { limit: u64 },
    #[error("{0}")]
    Device(String),
}
