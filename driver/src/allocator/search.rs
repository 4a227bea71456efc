//! (in progress) The backtracking search.
use std::collections::HashMap;

use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim};

use super::index::Fleet;
use super::selectors::SelectorCache;
use super::state::AllocatedState;
use super::{AllocateError, Explanation, Placement, ShareIdSource};

pub(crate) struct Context<'a> {
    pub(crate) fleet: &'a Fleet,
    pub(crate) classes: &'a HashMap<String, DeviceClass>,
    pub(crate) selectors: &'a mut SelectorCache,
    pub(crate) state: &'a AllocatedState,
    pub(crate) share_ids: &'a mut dyn ShareIdSource,
}

impl Context<'_> {
    pub(crate) fn allocate_on(
        &mut self,
        node: &str,
        claims: &[&ResourceClaim],
    ) -> Result<Vec<AllocationResult>, AllocateError> {
        Err(self.not_yet(Some(node), claims))
    }

    pub(crate) fn first_fit(
        &mut self,
        _nodes: Option<&[String]>,
        claims: &[&ResourceClaim],
    ) -> Result<Placement, AllocateError> {
        Err(self.not_yet(None, claims))
    }

    fn not_yet(&self, node: Option<&str>, claims: &[&ResourceClaim]) -> AllocateError {
        AllocateError::Unsatisfiable(Box::new(Explanation {
            claim: claims.first().map(|c| super::state::owner_of(c)).unwrap_or_default(),
            node: node.map(str::to_string),
            nodes_tried: 0,
            requests: vec![],
            constraints: vec![],
            pools: vec![],
            notes: vec!["allocator search not implemented yet on this branch".into()],
        }))
    }
}
