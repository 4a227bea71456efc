//! The chart's dynamic MIG values, rendered by Helm v4's engine:
//! `dynamicMig.enabled` turns the plugin's `DynamicMIG` gate on (as
//! NVIDIA's `featureGates.DynamicMIG` does) and `dynamicMig.gpus` becomes
//! its `--dynamic-mig-gpus`, which the plugin's own parser accepts; values
//! the flag cannot mean are refused by the schema and, without it, at
//! render time, naming the value.

use std::collections::BTreeMap;
use std::path::Path;

use integration_tests::docs::section;
use integration_tests::helm::{
    Outcome, args, chart_without_schema, check_types, container, one, render_chart, rendered,
};
use integration_tests::workspace_root;
use serde_json::{Value, json};

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn plugin_args(objects: &[Value]) -> Vec<String> {
    args(container(one(objects, "DaemonSet", "kubelet-plugin"), "plugin"))
}

/// The rendered plugin command line parses as the plugin's flags.
fn plugin_parses(arguments: &[String]) {
    let out = std::process::Command::new(integration_tests::kubelet_plugin())
        .args(arguments)
        .arg("--help")
        .env_clear()
        .output()
        .expect("running the plugin");
    assert!(out.status.success(), "{arguments:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn dynamic_mig_values_reach_the_plugin_as_its_gate_and_gpus() {
    let on = |gpus: Value| json!({"dynamicMig": {"enabled": true, "gpus": gpus}});
    let accepted = [
        ("default", json!({})),
        ("enabled", json!({"dynamicMig": {"enabled": true}})),
        ("none", on(json!("none"))),
        ("listed", on(json!([0, 2, "GPU-4f1c2a00-0000-0000-0000-000000000001"]))),
        ("with-mps", json!({"dynamicMig": {"enabled": true, "gpus": [1]}, "featureGates": {"MPSSupport": true}})),
        ("nvidias-gate", json!({"featureGates": {"DynamicMIG": true}})),
        ("both", json!({"dynamicMig": {"enabled": true}, "featureGates": {"DynamicMIG": true}})),
    ];
    let outcomes = render_chart(tmp_dir(), &workspace_root().join("charts/gpu-dra-driver"), &accepted);
    let plugin: BTreeMap<&str, Vec<String>> = accepted
        .iter()
        .map(|(name, _)| {
            let (objects, _) = rendered(&outcomes, name);
            check_types(&objects);
            (*name, plugin_args(&objects))
        })
        .collect();
    let has = |case: &str, arg: &str| plugin[case].iter().any(|a| a == arg);
    let flag = |case: &str| plugin[case].iter().find(|a| a.starts_with("--dynamic-mig-gpus")).cloned();

    assert_eq!(flag("default"), None, "off by default: {:?}", plugin["default"]);
    assert!(!plugin["default"].iter().any(|a| a.contains("DynamicMIG")), "{:?}", plugin["default"]);
    for case in ["enabled", "nvidias-gate", "both"] {
        assert!(has(case, "--feature-gates=DynamicMIG=true"), "{case}: {:?}", plugin[case]);
        assert_eq!(flag(case).as_deref(), Some("--dynamic-mig-gpus=auto"), "{case}");
    }
    assert_eq!(flag("none").as_deref(), Some("--dynamic-mig-gpus=none"));
    assert_eq!(
        flag("listed").as_deref(),
        Some("--dynamic-mig-gpus=0,2,GPU-4f1c2a00-0000-0000-0000-000000000001"),
        "{:?}",
        plugin["listed"]
    );
    assert!(has("with-mps", "--feature-gates=DynamicMIG=true,MPSSupport=true"), "{:?}", plugin["with-mps"]);
    assert_eq!(flag("with-mps").as_deref(), Some("--dynamic-mig-gpus=1"));
    for (case, arguments) in &plugin {
        assert_eq!(
            arguments.iter().filter(|a| a.starts_with("--feature-gates")).count(),
            usize::from(*case != "default")
        );
        plugin_parses(arguments);
    }
}

#[test]
fn dynamic_mig_values_the_flag_cannot_mean_are_refused_naming_them() {
    let on = |gpus: Value| json!({"dynamicMig": {"enabled": true, "gpus": gpus}});
    // (case, values, what the schema's refusal names, what the render-time one says)
    let refused = [
        ("empty-list", on(json!([])), "/dynamicMig/gpus", "dynamicMig.gpus is an empty list"),
        ("word", on(json!("all")), "/dynamicMig/gpus", "dynamicMig.gpus \"all\" is not auto, none"),
        ("bad-item", on(json!([0, "gpu7"])), "/dynamicMig/gpus", "dynamicMig.gpus[1] \"gpu7\" is neither"),
        ("negative", on(json!([-1])), "/dynamicMig/gpus", "dynamicMig.gpus[0] \"-1\" is neither"),
        ("fraction", on(json!([1.5])), "/dynamicMig/gpus", "dynamicMig.gpus[0] \"1.5\" is neither"),
        ("comma-inside", on(json!(["GPU-1,2"])), "/dynamicMig/gpus", "dynamicMig.gpus[0] \"GPU-1,2\" is neither"),
        ("unknown-key", json!({"dynamicMig": {"enable": true}}), "/dynamicMig", ""),
        // Valid to the schema; refused at render time with and without it.
        (
            "gpus-without-gate",
            json!({"dynamicMig": {"gpus": [0]}}),
            "",
            "dynamicMig.gpus needs dynamicMig.enabled=true",
        ),
        (
            "gates-disagree",
            json!({"dynamicMig": {"enabled": true}, "featureGates": {"DynamicMIG": false}}),
            "",
            "dynamicMig.enabled=true and featureGates.DynamicMIG=false disagree",
        ),
    ];
    let cases: Vec<(&str, Value)> = refused.iter().map(|(n, v, _, _)| (*n, v.clone())).collect();
    let shipped = render_chart(tmp_dir(), &workspace_root().join("charts/gpu-dra-driver"), &cases);
    let dir = tempfile::tempdir().unwrap();
    let bare = render_chart(tmp_dir(), &chart_without_schema(dir.path()), &cases);
    for (case, _, schema, render_time) in refused {
        let Outcome::Refused(error) = &shipped[case] else { panic!("{case} rendered") };
        let expected = if schema.is_empty() { render_time } else { schema };
        assert!(error.contains(expected), "{case} (schema): {error}");
        match &bare[case] {
            Outcome::Refused(error) => assert!(error.contains(render_time), "{case} (no schema): {error}"),
            // Only the schema knows the value's keys.
            Outcome::Rendered { .. } => assert_eq!(case, "unknown-key"),
        }
    }
}

/// The "Dynamic MIG" commands (`docs/mig.md`), as written, render with
/// their `--set` and `--set-json` values and give the plugin what they say.
#[test]
fn the_docs_dynamic_mig_commands_render() {
    let section = section("Dynamic MIG");
    let commands: Vec<&str> =
        section.lines().filter(|l| l.starts_with("helm ") && l.contains("charts/gpu-dra-driver")).collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    let mut cases = Vec::new();
    for (i, command) in commands.iter().enumerate() {
        let mut values = json!({});
        let mut words = command.split_whitespace();
        while let Some(word) = words.next() {
            let parse: fn(&str) -> Value = match word {
                "--set" => |v| match v {
                    "true" | "false" => json!(v == "true"),
                    other => json!(other),
                },
                "--set-json" => |v| serde_json::from_str(v).unwrap(),
                _ => continue,
            };
            let (path, value) = words.next().unwrap().trim_matches('\'').split_once('=').unwrap();
            let keys: Vec<&str> = path.split('.').collect();
            let mut at = &mut values;
            for key in &keys[..keys.len() - 1] {
                at = at.as_object_mut().unwrap().entry(*key).or_insert(json!({}));
            }
            at[keys[keys.len() - 1]] = parse(value);
        }
        cases.push((format!("readme-{i}"), values));
    }
    let borrowed: Vec<(&str, Value)> = cases.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    let outcomes = render_chart(tmp_dir(), &workspace_root().join("charts/gpu-dra-driver"), &borrowed);
    let all = plugin_args(&rendered(&outcomes, "readme-0").0);
    let listed = plugin_args(&rendered(&outcomes, "readme-1").0);
    for arguments in [&all, &listed] {
        assert!(arguments.contains(&"--feature-gates=DynamicMIG=true".to_string()), "{arguments:?}");
    }
    assert!(all.contains(&"--dynamic-mig-gpus=auto".to_string()), "{all:?}");
    assert!(listed.contains(&"--dynamic-mig-gpus=0,1".to_string()), "{listed:?}");
}
