//! Our allocator (through `gpu-dra-controller simulate`) and the
//! kube-scheduler's (`k8s.io/dynamic-resource-allocation` 1.36, the Go
//! program in `tests/go-allocator/`, built into the per-machine cache on
//! first use) choose the same node and devices for every claim, on small
//! fleets of each benchmark layout filled past capacity, so both also
//! refuse the same claims. The full-size comparison, with figures, is
//! `cargo bench -p integration-tests --bench go_allocator`.

use integration_tests::go_allocator::{Fleet, Layout, go_allocator, side_by_side};
use integration_tests::{controller, workspace_root};

fn same_choices(fleet: Fleet, expect_allocated: usize) {
    let go = go_allocator().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let run = side_by_side(&fleet, dir.path(), &workspace_root().join("deviceclasses"), controller(), &go)
        .unwrap_or_else(|e| panic!("{}: {e}", fleet.describe()));
    let c = &run.comparison;
    let first: Vec<String> = c.mismatches.iter().take(5).map(ToString::to_string).collect();
    assert!(c.identical(), "{}: {} claims differ, first: {first:#?}", fleet.describe(), c.mismatches.len());
    assert_eq!(run.ours.choices.len(), fleet.claims);
    assert_eq!(c.same_allocated, expect_allocated, "{}", fleet.describe());
    assert_eq!(c.same_refused, fleet.claims - expect_allocated, "{}", fleet.describe());
    assert!(run.ours.choices.iter().chain(&run.go.choices).all(|c| !c.error), "{}", fleet.describe());
}

#[test]
fn whole_h100s_are_placed_alike_until_the_fleet_is_full() {
    // 3 nodes x 8 GPUs: 24 claims fit, 6 are refused by both.
    same_choices(Fleet { layout: Layout::WholeH100, nodes: 3, claims: 30 }, 24);
}

#[test]
fn a100_whole_gpus_and_mig_slices_are_placed_alike() {
    // 2 nodes x (4 whole + 28 x 1g.10gb): claims 1..=40 ask for 28 whole
    // GPUs (8 fit) and 12 slices (all fit).
    same_choices(Fleet { layout: Layout::A100HalfMig, nodes: 2, claims: 40 }, 20);
}

#[test]
fn partitionable_h100s_and_their_counters_are_used_alike() {
    // 2 nodes x 8 partitionable H100: a 1g.10gb slice takes one of a GPU's
    // eight memory slices, so that GPU is no longer free whole: the 12
    // slices fit (7 on node-0000 gpu-0, 5 on node-0001 gpu-7), 14 of the
    // 28 whole GPUs do.
    same_choices(Fleet { layout: Layout::PartitionableH100, nodes: 2, claims: 40 }, 26);
}
