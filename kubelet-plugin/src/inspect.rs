//! `print-slices` and `print-cdi`: what the plugin would publish and write,
//! computed by the same code paths, without touching the cluster or disk.

use std::io::Write;

use anyhow::{Context, Result};
use gpu_dra_driver::cdi;
use gpu_dra_driver::inventory::fake::FakeSource;
use gpu_dra_driver::inventory::{Inventory, InventorySource};
use gpu_dra_driver::slices::SliceBuilder;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Serialize;

use crate::cli::{OutputFormat, PrintCdiArgs, PrintSlicesArgs, PrintedNodeArgs};
use crate::flags::{DriverRootArgs, HostRootsArgs, NodeArgs};
use crate::mig::selection::DynamicMigSelection;

/// The inventory source the flags select: the fake file, else NVML (from
/// the driver root's library when it has one).
pub fn inventory_source(
    node: &NodeArgs,
    driver_root: &DriverRootArgs,
    host: &HostRootsArgs,
) -> Box<dyn InventorySource> {
    match &node.fake_inventory {
        Some(path) => Box::new(FakeSource::new(path, node.node_name.clone())),
        None => Box::new(crate::host::driver_files::nvml_source(driver_root, host)),
    }
}

fn discover(printed: &PrintedNodeArgs) -> Result<Inventory> {
    Ok(inventory_source(&printed.node, &printed.driver_root, &printed.host).discover()?)
}

pub fn print_slices(args: &PrintSlicesArgs, out: &mut impl Write) -> Result<()> {
    let mut inventory = discover(&args.printed)?;
    DynamicMigSelection::new(args.feature_gates, args.printed.node.dynamic_mig_gpus.clone()).apply(&mut inventory);
    let builder = SliceBuilder::new(args.printed.node.driver_name.clone(), args.printed.node.node_name.clone())
        .ignoring_xids(args.printed.node.additional_xids_to_ignore.iter().copied())
        .for_server(args.kubernetes_version)
        .with_gates(args.feature_gates)
        .with_consumable_shares(args.feature_gates, args.printed.node.consumable_shares);
    args.printed.node.check_consumable_shares(args.feature_gates).map_err(anyhow::Error::msg)?;
    let slices = builder.build(&inventory, args.generation)?;
    match args.output {
        OutputFormat::Yaml => {
            for slice in &slices {
                writeln!(out, "---")?;
                out.write_all(to_yaml(slice)?.as_bytes())?;
            }
        }
        OutputFormat::Json => {
            let list = SliceList { api_version: "v1", kind: "List", items: &slices };
            serde_json::to_writer_pretty(&mut *out, &list)?;
            writeln!(out)?;
        }
    }
    Ok(())
}

/// A `v1` List, what `kubectl get -o json` prints for several objects.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SliceList<'a> {
    api_version: &'static str,
    kind: &'static str,
    items: &'a [ResourceSlice],
}

pub fn print_cdi(args: &PrintCdiArgs, out: &mut impl Write, note: &mut impl Write) -> Result<()> {
    let mut inventory = discover(&args.printed)?;
    // Which GPUs are dynamic does not depend on the gate here: a dynamic
    // MIG device has no spec before prepare creates its instance.
    let gates = "DynamicMIG=true".parse().unwrap_or_default();
    DynamicMigSelection::new(gates, args.printed.node.dynamic_mig_gpus.clone()).apply(&mut inventory);
    let edits = crate::host::driver_files::driver_edits(&args.printed.driver_root, &args.printed.node, &inventory)?;
    let spec = cdi::claim_spec(&args.printed.node.driver_name, &inventory, &edits, &args.claim_uid, &args.devices)
        .with_context(|| format!("claim {}", args.claim_uid))?;
    match args.output {
        OutputFormat::Json => {
            out.write_all(&spec.to_json()?)?;
            writeln!(out)?;
        }
        OutputFormat::Yaml => out.write_all(to_yaml(&spec.spec)?.as_bytes())?,
    }
    writeln!(note, "# would write {}", args.cdi_dir.join(&spec.file_name).display())?;
    for (device, id) in &spec.device_ids {
        writeln!(note, "# {device}: {id}")?;
    }
    Ok(())
}

fn to_yaml(value: &impl Serialize) -> Result<String> {
    serde_yaml_ng::to_string(value).context("rendering YAML")
}
