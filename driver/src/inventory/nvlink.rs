//! NVLink groups: GPUs that can reach each other over NVLink on this node.
//!
//! NVML tells us, per GPU, which links are active and what is at the other
//! end (another GPU, or an NVSwitch). GPUs joined directly or through a shared
//! switch form one group; we compute connected components over GPUs and the
//! remote endpoints they link to.

use std::collections::BTreeMap;

/// The far end of one active NVLink.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkPeer {
    /// Another GPU, by its minor number.
    Gpu(u32),
    /// A switch (or other non-GPU endpoint), by an opaque identity such as its
    /// PCI bus id. All GPUs linked to the same switch reach each other.
    Switch(String),
}

/// Groups GPUs by connectivity. `links` maps each GPU's minor to the peers of
/// its active links. Returns each GPU's group id (the lowest minor in its
/// group) for GPUs with at least one NVLink peer reachable from another GPU.
pub fn groups(links: &BTreeMap<u32, Vec<LinkPeer>>) -> BTreeMap<u32, u32> {
    // Union-find over GPUs and switches.
    let mut nodes: Vec<LinkPeer> = Vec::new();
    let mut index: BTreeMap<LinkPeer, usize> = BTreeMap::new();
    let mut intern = |p: LinkPeer, nodes: &mut Vec<LinkPeer>| -> usize {
        *index.entry(p.clone()).or_insert_with(|| {
            nodes.push(p);
            nodes.len() - 1
        })
    };
    let mut edges = Vec::new();
    for (&gpu, peers) in links {
        let a = intern(LinkPeer::Gpu(gpu), &mut nodes);
        for peer in peers {
            if *peer == LinkPeer::Gpu(gpu) {
                continue;
            }
            let b = intern(peer.clone(), &mut nodes);
            edges.push((a, b));
        }
    }
    let mut parent: Vec<usize> = (0..nodes.len()).collect();
    fn find(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    for (a, b) in edges {
        let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
        if ra != rb {
            parent[ra] = rb;
        }
    }
    // Members of each component that are GPUs we know.
    let mut members: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        if let LinkPeer::Gpu(minor) = node
            && links.contains_key(minor)
        {
            let root = find(&mut parent, i);
            members.entry(root).or_default().push(*minor);
        }
    }
    let mut out = BTreeMap::new();
    for gpus in members.values().filter(|g| g.len() >= 2) {
        let id = *gpus.iter().min().unwrap_or(&0);
        for &g in gpus {
            out.insert(g, id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(s: &str) -> LinkPeer {
        LinkPeer::Switch(s.to_string())
    }

    #[test]
    fn switched_node_is_one_group() {
        // DGX-like: every GPU links to the same four switches.
        let links: BTreeMap<u32, Vec<LinkPeer>> =
            (0..8).map(|g| (g, vec![sw("a"), sw("b"), sw("c"), sw("d")])).collect();
        let g = groups(&links);
        assert_eq!(g.len(), 8);
        assert!(g.values().all(|&id| id == 0));
    }

    #[test]
    fn bridged_pairs_form_separate_groups() {
        let links = BTreeMap::from([
            (0, vec![LinkPeer::Gpu(1)]),
            (1, vec![LinkPeer::Gpu(0)]),
            (2, vec![LinkPeer::Gpu(3), LinkPeer::Gpu(3)]),
            (3, vec![LinkPeer::Gpu(2)]),
            (4, vec![]),
        ]);
        let g = groups(&links);
        assert_eq!(g, BTreeMap::from([(0, 0), (1, 0), (2, 2), (3, 2)]));
    }

    #[test]
    fn a_gpu_alone_on_a_switch_has_no_group() {
        let links = BTreeMap::from([(0, vec![sw("x")]), (1, vec![sw("y")])]);
        assert!(groups(&links).is_empty());
    }

    #[test]
    fn links_to_unknown_gpus_do_not_create_groups() {
        // A peer GPU we did not enumerate (e.g. hidden by a container's
        // visibility) does not join anyone to anything.
        let links = BTreeMap::from([(0, vec![LinkPeer::Gpu(9)])]);
        assert!(groups(&links).is_empty());
    }
}
