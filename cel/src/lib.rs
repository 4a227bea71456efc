//! Kubernetes' DRA CEL environment: DeviceClass and claim selectors
//! type-checked, costed and evaluated as the apiserver and the
//! kube-scheduler do (`k8s.io/dynamic-resource-allocation/cel` on the
//! apiserver's base environment, Kubernetes 1.34 to 1.37), on the `cel`
//! crate. Nothing here is specific to a driver or to GPUs: any Rust DRA
//! driver, allocator or admission check can use it.
//!
//! [`SelectorEnv`] compiles an expression once and caches the result, errors
//! included, by expression text; [`CelDevice`] is the `device` variable,
//! built once per device; [`CompiledSelector::matches`] evaluates one against
//! the other within a cost budget (see `cost`). [`CelEnvironment`] says
//! which Kubernetes version and kind of expression (stored or new) to check
//! against. [`quantity::Quantity`] is Kubernetes' `resource.Quantity`,
//! exact, parsed and printed as the apiserver does; CEL's `quantity()`
//! values are of this type.
//!
//! ```
//! use dra_cel::{CelDevice, SelectorEnv};
//! use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
//!
//! let product = DeviceAttribute { string: Some("H100".into()), ..Default::default() };
//! let device = Device {
//!     name: "gpu-0".into(),
//!     attributes: Some([("productName".to_string(), product)].into()),
//!     ..Default::default()
//! };
//! let env = SelectorEnv::new();
//! let selector = env.compile(r#"device.attributes["example.com"].productName == "H100""#).unwrap();
//! assert!(selector.matches(&CelDevice::new("example.com", &device).unwrap()).unwrap());
//! ```

mod checker;
mod cost;
mod device_value;
mod env;
mod environment;
mod error;
mod format_lib;
mod ip_lib;
pub mod kubernetes_version;
mod lists_lib;
mod meter;
mod ops_lib;
pub mod quantity;
mod quantity_lib;
mod semver_lib;
mod strings_lib;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_lists;
mod two_var;
mod url_lib;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use cel::common::ast::IdedExpr;
use cel::common::types::CelBool;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Env, Value};

pub use checker::CostEstimate;
pub use checker::Type as CelType;
pub use device_value::{AttributeValue, CelDevice};
pub use environment::{CelEnvironment, ExpressionKind, NEWEST_MINOR, OLDEST_MINOR};
pub use error::{CompileError, EvalError};
pub use meter::MAX_COST;

/// `CELSelectorExpressionMaxLength`: the API server rejects longer expressions.
pub const MAX_EXPRESSION_BYTES: usize = 10 * 1024;

/// Most compiled expressions kept; the cache starts over beyond that, so a
/// stream of distinct expressions cannot grow memory without bound.
const CACHE_CAPACITY: usize = 4096;

/// Stack of the thread that parses: measured to hold a 10 Ki left-deep chain
/// in a debug build with room to spare (it is virtual memory until touched).
const PARSER_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Parses, type-checks and rewrites `expression` for metering.
fn parse(
    env: &Arc<Env>,
    declarations: &checker::Declarations,
    environment: &CelEnvironment,
    expression: &str,
) -> Result<(IdedExpr, cost::Rewritten, CostEstimate), CompileError> {
    let (mut ast, source) = env.parser().parse_with_source_info(expression).map_err(|e| {
        if e.errors.iter().any(|e| e.msg.contains("Recursion limit")) {
            CompileError::TooDeep { limit: cost::MAX_AST_DEPTH }
        } else {
            CompileError::Syntax(e.to_string())
        }
    })?;
    // Deep ASTs are refused before any recursive pass over them.
    cost::check_depth(&ast).map_err(|_| CompileError::TooDeep { limit: cost::MAX_AST_DEPTH })?;
    let failed = |failure| match failure {
        checker::CheckFailure::Types(errors) => CompileError::Type(errors),
        checker::CheckFailure::Unsupported(name) => CompileError::Unsupported(name),
        checker::CheckFailure::NotBool(t) => CompileError::NotBool(t.to_string()),
    };
    let checked = checker::check(&ast, &source, declarations, environment).map_err(failed)?;
    checker::require_bool(&checked, environment).map_err(failed)?;
    env::check_literals(env, &ast)?;
    let estimated = checker::estimate(&ast, &checked);
    if environment.kind == ExpressionKind::New && estimated.max > MAX_COST {
        return Err(CompileError::TooComplex { estimated: estimated.max, limit: MAX_COST });
    }
    let rewritten = cost::rewrite(&mut ast).map_err(|_| CompileError::TooDeep { limit: cost::MAX_AST_DEPTH })?;
    Ok((ast, rewritten, estimated))
}

/// Compiles selector expressions and caches them by text. Thread-safe: share
/// one per process (or per allocator) behind an `Arc` or a reference.
pub struct SelectorEnv {
    env: Result<Arc<Env>, CompileError>,
    environment: CelEnvironment,
    declarations: checker::Declarations,
    cache: RwLock<HashMap<String, Result<Arc<CompiledSelector>, CompileError>>>,
}

impl Default for SelectorEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl SelectorEnv {
    /// The environment the scheduler of the newest modelled Kubernetes
    /// version evaluates (see [`CelEnvironment::default`]).
    pub fn new() -> Self {
        Self::for_environment(CelEnvironment::default())
    }

    /// Expressions checked as Kubernetes checks them in `environment`.
    pub fn for_environment(environment: CelEnvironment) -> Self {
        let env = env::build_for(&environment).map(Arc::new).map_err(|e| CompileError::Environment(e.to_string()));
        let declarations = checker::Declarations::for_environment(&environment);
        SelectorEnv { env, environment, declarations, cache: RwLock::new(HashMap::new()) }
    }

    /// The environment expressions are checked against.
    pub fn environment(&self) -> CelEnvironment {
        self.environment
    }

    /// The compiled form of `expression`, compiling it on first use. A
    /// failure is cached too: the same expression fails the same way.
    pub fn compile(&self, expression: &str) -> Result<Arc<CompiledSelector>, CompileError> {
        if let Ok(cache) = self.cache.read()
            && let Some(found) = cache.get(expression)
        {
            return found.clone();
        }
        let compiled = self.compile_uncached(expression).map(Arc::new);
        if let Ok(mut cache) = self.cache.write() {
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(expression.to_owned(), compiled.clone());
        }
        compiled
    }

    fn compile_uncached(&self, expression: &str) -> Result<CompiledSelector, CompileError> {
        if expression.len() > MAX_EXPRESSION_BYTES {
            return Err(CompileError::TooLong { len: expression.len(), limit: MAX_EXPRESSION_BYTES });
        }
        let env = self.env.clone()?;
        // The parser recurses once per operator of a left-deep chain such as
        // `1+1+...+1`, which its own recursion limit does not count: parse on
        // a thread with a stack large enough for any 10 Ki expression, and
        // refuse ASTs deeper than evaluation can safely recurse.
        let (ast, rewritten, estimated_cost) = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("cel-parse".to_owned())
                .stack_size(PARSER_STACK_BYTES)
                .spawn_scoped(scope, || parse(&env, &self.declarations, &self.environment, expression))
                .map_err(|e| CompileError::Environment(format!("cannot start the parser thread: {e}")))?
                .join()
                .map_err(|_| CompileError::Environment("the parser thread panicked".to_owned()))?
        })?;
        Ok(CompiledSelector {
            expression: expression.to_owned(),
            ast,
            env,
            stack: rewritten.stack,
            constants: rewritten.constants,
            estimated_cost,
            budget: meter_budget(estimated_cost),
        })
    }
}

/// One compiled selector expression. Thread-safe.
pub struct CompiledSelector {
    expression: String,
    ast: IdedExpr,
    env: Arc<Env>,
    /// Stack the evaluation may need; see [`CompiledSelector::matches`].
    stack: usize,
    /// Values of constant calls, named `@c<index>` in the AST.
    constants: Vec<Box<dyn Val>>,
    /// Kubernetes' compile-time estimate, in cel-go's units.
    estimated_cost: CostEstimate,
    /// Units of our meter an evaluation may spend (see [`meter_budget`]).
    budget: u64,
}

/// The meter's budget for an expression with this estimate. An expression
/// estimated within [`MAX_COST`] cannot exceed it at run time in Kubernetes
/// (the estimate bounds the actual cost), so it must not here either: our
/// units exceed cel-go's by at most a small factor (a list element compared
/// costs one of ours, a tenth of cel-go's), and such an expression gets
/// [`meter::BOUNDED_FACTOR`] times the limit, which keeps the work bounded
/// without ever stopping it. Above the estimate, which only a stored
/// expression can be (the apiserver refuses new ones), the meter applies
/// the limit itself, approximating cel-go's count from above.
fn meter_budget(estimated: CostEstimate) -> u64 {
    if estimated.max <= MAX_COST { MAX_COST.saturating_mul(meter::BOUNDED_FACTOR) } else { MAX_COST }
}

/// The variables of one evaluation: `device`, and the selector's constants.
struct Variables<'a> {
    device: &'a CelDevice,
    constants: &'a [Box<dyn Val>],
}

impl VariableResolver for Variables<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        match cost::constant_index(variable) {
            Some(i) => self.constants.get(i).map(|v| CowVal::Borrowed(v.as_ref())),
            None => self.device.resolve(variable),
        }
    }
}

impl std::fmt::Debug for SelectorEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectorEnv").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for CompiledSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledSelector").field("expression", &self.expression).finish_non_exhaustive()
    }
}

impl CompiledSelector {
    /// The expression as written.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The cost Kubernetes estimates for this expression at compile time,
    /// in cel-go's units; a new selector above [`MAX_COST`] is refused.
    pub fn estimated_cost(&self) -> CostEstimate {
        self.estimated_cost
    }

    /// Whether `device` satisfies the selector. A runtime error, a non-bool
    /// result or a cost overrun is an error, never a silent `false`.
    ///
    /// The interpreter recurses once per AST level; when the calling thread
    /// has less stack left than this expression's depth may need, the
    /// evaluation runs on a temporary larger stack instead of overflowing.
    pub fn matches(&self, device: &CelDevice) -> Result<bool, EvalError> {
        stacker::maybe_grow(self.stack, self.stack * 2, || self.evaluate(device))
    }

    fn evaluate(&self, device: &CelDevice) -> Result<bool, EvalError> {
        meter::start(self.budget);
        let variables = Variables { device, constants: &self.constants };
        let mut context = Context::with_env(Arc::clone(&self.env));
        context.set_variable_resolver(&variables);
        let result = Value::resolve_val(&self.ast, &context);
        if meter::exceeded() {
            return Err(EvalError::CostExceeded { limit: MAX_COST });
        }
        let value = result.map_err(|e| EvalError::Runtime(env::runtime_message(&e.to_string())))?;
        value
            .downcast_ref::<CelBool>()
            .map(|b| *b.inner())
            .ok_or_else(|| EvalError::NotBool(value.get_type().name().to_owned()))
    }
}
