//! Quantity fields of slices and claims, decoded as the apiserver decodes
//! them. Its own module, below `compact` and `error`, because the compact
//! form is built from decoded quantities while errors sit above it.

use dra_cel::quantity::Quantity;

/// A quantity of a slice or claim that does not parse. The apiserver
/// refuses such objects; only input that did not pass it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub(crate) struct BadQuantity(String);

/// `text`, a quantity field of a slice or claim, as the apiserver decodes it.
pub(crate) fn decode_quantity(text: &str) -> Result<Quantity, BadQuantity> {
    Quantity::decode(text).map_err(|_| BadQuantity(text.to_owned()))
}
