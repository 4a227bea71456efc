//! (in progress) Compiled selectors and cached results.
#[derive(Debug, Default)]
pub(crate) struct SelectorCache;
impl SelectorCache {
    pub(crate) fn new() -> Self {
        Self
    }
}
