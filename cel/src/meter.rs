//! The run-time half of the cost bound (see `cost` for the whole design): a
//! thread-local [`Meter`] that every metered function charges before doing
//! its work, and the size caps on what one call may build. It sits below the
//! function libraries and the compile-time rewrite, which all charge it, so
//! it imports none of them.

use std::cell::Cell;

use cel::ExecutionError;
use cel::common::types::CelBool;
use cel::common::value::CowVal;

/// `CELSelectorExpressionMaxCost`: the apiserver refuses a new selector
/// whose estimated cost exceeds it, and the scheduler stops an evaluation
/// that spends more.
pub const MAX_COST: u64 = 1_000_000;

/// Units one evaluation may spend, unless its estimate is within the limit.
pub const BUDGET: u64 = MAX_COST;
/// The budget of an expression estimated within the limit, in multiples of
/// it: more than the ratio of our units to cel-go's for any operation.
pub const BOUNDED_FACTOR: u64 = 16;
/// Bytes of string scanned or built per unit.
pub const BYTES_PER_UNIT: u64 = 16;
/// The longest string a function or `+` may build.
pub const MAX_STRING_BYTES: usize = 64 * 1024;
/// The longest list a function or `+` may build.
pub const MAX_LIST_LEN: usize = 16 * 1024;
/// The message of the error raised when the budget is exceeded.
pub const BUDGET_MESSAGE: &str = "cost budget exceeded";

#[derive(Clone, Copy)]
struct Meter {
    used: u64,
    limit: u64,
    exceeded: bool,
}

thread_local! {
    static METER: Cell<Meter> = const { Cell::new(Meter { used: 0, limit: BUDGET, exceeded: false }) };
}

/// Starts metering one evaluation on this thread.
pub fn start(limit: u64) {
    METER.with(|m| m.set(Meter { used: 0, limit, exceeded: false }));
}

/// Whether the evaluation that ran on this thread since [`start`] overran.
pub fn exceeded() -> bool {
    METER.with(|m| m.get().exceeded)
}

/// Units spent since [`start`].
#[cfg(test)]
pub fn used() -> u64 {
    METER.with(|m| m.get().used)
}

/// Spends `units`; fails once the budget is exceeded, and from then on.
pub fn charge(units: u64) -> Result<(), ExecutionError> {
    METER.with(|m| {
        let mut meter = m.get();
        meter.used = meter.used.saturating_add(units);
        if meter.used > meter.limit {
            meter.exceeded = true;
        }
        m.set(meter);
        if meter.exceeded { Err(ExecutionError::function_error("cost", BUDGET_MESSAGE)) } else { Ok(()) }
    })
}

/// Units for scanning or building `bytes` bytes of string, beyond the call
/// itself (which the loop weight or the expression size pays for): cel-go
/// also charges a call one unit plus a tenth of a unit per byte.
pub fn bytes_units(bytes: usize) -> u64 {
    bytes as u64 / BYTES_PER_UNIT
}

/// Refuses a string longer than [`MAX_STRING_BYTES`].
pub fn check_string_len(function: &str, len: usize) -> Result<(), ExecutionError> {
    if len > MAX_STRING_BYTES {
        return Err(ExecutionError::function_error(
            function,
            format!("result of {len} bytes exceeds the limit of {MAX_STRING_BYTES}"),
        ));
    }
    Ok(())
}

/// Refuses a list longer than [`MAX_LIST_LEN`].
pub fn check_list_len(function: &str, len: usize) -> Result<(), ExecutionError> {
    if len > MAX_LIST_LEN {
        return Err(ExecutionError::function_error(
            function,
            format!("result of {len} elements exceeds the limit of {MAX_LIST_LEN}"),
        ));
    }
    Ok(())
}

/// A bool result without allocating.
pub fn boolean<'b, 'v>(b: bool) -> CowVal<'b, 'v> {
    static TRUE: CelBool = CelBool::TRUE;
    static FALSE: CelBool = CelBool::FALSE;
    CowVal::Borrowed(if b { &TRUE } else { &FALSE })
}
