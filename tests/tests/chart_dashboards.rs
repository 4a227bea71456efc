//! The chart's Grafana dashboard and PrometheusRules: off unless asked,
//! rendered by Helm's engine when asked, parsed (the dashboard's JSON, the
//! rules' YAML), and every metric name in every PromQL expression is one
//! the binaries export: the node agent's names come from the plugin's own
//! registry (encoded with telemetry in both namings), the controller's
//! from the `/metrics` of a running `gpu-dra-controller run` (against the
//! API stand-in); none from a list kept here.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gpu_kubelet_plugin::observe::metrics::{ApiVersion, ErrorKind, Metrics, Operation, Outcome};
use gpu_kubelet_plugin::observe::telemetry::{Naming, TelemetryStore};
use integration_tests::apiserver::ApiServer;
use integration_tests::controller_process::ControllerProcess;
use integration_tests::helm::{kinds, one, render_all, rendered};
use integration_tests::wait;
use serde_json::{Value, json};

fn tmp_dir() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The series names of an exposition's `# TYPE` lines, with the suffixes
/// Prometheus sees for counters and histograms.
fn series_names(text: &str, names: &mut BTreeSet<String>) {
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = line.split_once(' ').expect("# TYPE name kind");
        match kind {
            "counter" => names.insert(format!("{name}_total")),
            "histogram" => {
                names.extend(["_bucket", "_sum", "_count"].map(|s| format!("{name}{s}")));
                true
            }
            _ => names.insert(name.to_string()),
        };
    }
}

/// `GET /metrics` of a running controller: `gpu-dra-controller run` on the
/// API stand-in, serving on a free port.
fn controller_metrics_text() -> String {
    let server = ApiServer::start_in_thread().expect("API stand-in");
    let dir = tempfile::tempdir().expect("temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let controller =
        ControllerProcess::spawn_serving(&kubeconfig, "dashboards", "127.0.0.1:0", &[]).expect("the controller");
    let serving = || {
        let log = controller.log();
        // Its standard error is a pipe here, as in a pod: no terminal colours.
        assert!(!log.contains('\u{1b}'), "the controller's log to a pipe carries escape sequences:\n{log:?}");
        log.lines()
            .find(|l| l.contains("serving /metrics"))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
            .map(str::to_string)
    };
    let addr =
        wait::until_some("the controller to serve /metrics", Duration::from_secs(60), serving, || controller.log());
    integration_tests::plugin_process::scrape_metrics(&addr)
        .unwrap_or_else(|e| panic!("the controller's /metrics: {e}"))
}

#[test]
fn the_controllers_metrics_are_read_from_the_running_binary() {
    let mut names = BTreeSet::new();
    series_names(&controller_metrics_text(), &mut names);
    for name in
        ["gpu_dra_controller_leader", "gpu_dra_controller_errors_total", "gpu_dra_controller_claims_allocated_total"]
    {
        assert!(names.contains(name), "{name} not in {names:?}");
    }
}

/// Every series name `/metrics` can carry: the plugin's registry (both
/// namings) and the running controller's `/metrics`.
fn exported_names() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    series_names(&controller_metrics_text(), &mut names);
    for naming in [Naming::Native, Naming::Dcgm] {
        let store = Arc::new(TelemetryStore::new(naming, "node", "gpu.nvidia.com"));
        let metrics = Metrics::with_telemetry(store);
        // A labelled family appears once it has a series: give each one.
        metrics.request(Operation::Prepare, ApiVersion::V1, std::time::Duration::from_millis(1));
        metrics.claim(Operation::Prepare, Outcome::Error);
        metrics.error(ErrorKind::Checkpoint);
        series_names(&metrics.encode().expect("encoding the registry"), &mut names);
    }
    names
}

const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// The metric names a PromQL expression reads: identifiers that are not
/// functions, keywords, label names (in `{}` or grouping clauses), strings
/// or durations. Grafana's `label_values(selector, label)` reads its
/// selector.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Strings, then everything between matching brackets of label
    // matchers, ranges and grouping clauses.
    let mut text = String::new();
    let mut quote = None;
    for c in expr.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, c) => text.push(c),
        }
    }
    let text = strip_between(&text, '{', '}');
    let text = strip_between(&text, '[', ']');
    let text = strip_grouping(&text);
    let text = match text.trim().strip_prefix("label_values(") {
        Some(rest) => rest.rsplit_once(',').map_or(rest.to_string(), |(selector, _)| selector.to_string()),
        None => text,
    };
    let mut names = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            let preceded_by_digit = start > 0 && chars[start - 1].is_ascii_digit();
            if next != Some(&'(') && !KEYWORDS.contains(&word.to_lowercase().as_str()) && !preceded_by_digit {
                names.insert(word);
            }
        } else if c.is_ascii_digit() {
            // A number (1e3, 0.99) is not a name.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

fn strip_between(text: &str, open: char, close: char) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for c in text.chars() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth = depth.saturating_sub(1);
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// Removes `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`,
/// `group_left (...)`, `group_right (...)`: label names, not metrics.
fn strip_grouping(text: &str) -> String {
    let mut out = text.to_string();
    for keyword in ["by", "without", "on", "ignoring", "group_left", "group_right"] {
        loop {
            let lower = out.to_lowercase();
            let found = lower.match_indices(keyword).find(|(at, _)| {
                let before = lower[..*at].chars().last();
                let after = lower[at + keyword.len()..].trim_start();
                before.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == '_')) && after.starts_with('(')
            });
            let Some((at, _)) = found else { break };
            let open = at + keyword.len() + out[at + keyword.len()..].find('(').unwrap_or(0);
            let close = open + out[open..].find(')').unwrap_or(out.len() - open - 1);
            out.replace_range(at..=close, " ");
        }
    }
    out
}

#[test]
fn the_extractor_finds_metrics_and_nothing_else() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(gpu_dra_request_duration_seconds_bucket{job=~\"$job\", operation=\"prepare\"}[$__rate_interval]))) / on (instance) group_left (node) up_metric or vector(1e3)",
    );
    assert_eq!(names, BTreeSet::from(["gpu_dra_request_duration_seconds_bucket".into(), "up_metric".into()]));
    assert_eq!(
        metric_names("label_values(gpu_dra_registered{job=~\"$job\"}, instance)"),
        BTreeSet::from(["gpu_dra_registered".into()])
    );
    assert_eq!(metric_names("sum(gpu_dra_idle_claims) > 3"), BTreeSet::from(["gpu_dra_idle_claims".into()]));
}

/// Every PromQL expression of a Grafana dashboard: panel targets (rows
/// nest panels) and query variables.
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                out.push(target["expr"].as_str().unwrap_or_else(|| panic!("a target without expr: {target}")).into());
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] == "query" {
            out.push(variable["query"]["query"].as_str().expect("a variable's query").into());
        }
    }
    out
}

#[test]
fn dashboard_and_rules_render_when_asked_and_name_only_exported_metrics() {
    let outcomes = render_all(
        tmp_dir(),
        &[
            ("default", json!({})),
            (
                "observability",
                json!({"metrics": {
                    "grafanaDashboard": {"enabled": true, "folder": "GPUs"},
                    "prometheusRules": {"enabled": true, "idleClaimsBudget": 3, "labels": {"release": "prometheus"}},
                }}),
            ),
        ],
    );
    let (default, _) = rendered(&outcomes, "default");
    let default_kinds = kinds(&default);
    assert!(!default_kinds.contains_key("PrometheusRule"), "off unless asked: {default_kinds:?}");
    assert!(
        !default
            .iter()
            .any(|o| o["kind"] == "ConfigMap"
                && o["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-dashboard"))),
        "off unless asked"
    );

    let (objects, _) = rendered(&outcomes, "observability");
    let exported = exported_names();
    let mut checked = Vec::new();

    let config_map = one(&objects, "ConfigMap", "-dashboard");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1", "the sidecar's label");
    assert_eq!(config_map["metadata"]["annotations"]["grafana_folder"], "GPUs");
    let dashboard: Value =
        serde_json::from_str(config_map["data"]["gpu-dra-driver.json"].as_str().expect("the dashboard")).expect("JSON");
    assert_eq!(dashboard["uid"], "gpu-dra-driver");
    let titles: Vec<&str> =
        dashboard["panels"].as_array().unwrap().iter().filter_map(|p| p["title"].as_str()).collect();
    for wanted in ["Allocation", "Utilization", "Idle claims", "Prepare latency and errors", "Controller"] {
        assert!(titles.contains(&wanted), "no {wanted} row in {titles:?}");
    }
    for expr in dashboard_exprs(&dashboard) {
        checked.push(("dashboard".to_string(), expr));
    }

    let rules = one(&objects, "PrometheusRule", "gpu-dra-driver");
    assert_eq!(rules["metadata"]["labels"]["release"], "prometheus");
    let mut alerts = Vec::new();
    for group in rules["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let alert = rule["alert"].as_str().expect("an alert").to_string();
            let expr = rule["expr"].as_str().expect("an expr");
            if alert == "GpuDraIdleClaimsOverBudget" {
                assert!(expr.ends_with("> 3"), "the budget: {expr}");
            }
            checked.push((alert.clone(), expr.to_string()));
            alerts.push(alert);
        }
    }
    assert_eq!(
        alerts,
        [
            "GpuDraPluginNotPublishing",
            "GpuDraPrepareErrors",
            "GpuDraTaintedGpus",
            "GpuDraIdleClaimsOverBudget",
            "GpuDraControllerNoLeader",
            "GpuDraControllerWriteErrors"
        ]
    );

    assert!(checked.len() > 15, "{checked:?}");
    assert!(
        checked.iter().filter(|(_, e)| e.contains("gpu_dra_controller_")).count() >= 6,
        "the controller's panels and rules: {checked:?}"
    );
    for (source, expr) in &checked {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{source}: no metric in {expr}");
        let unknown: Vec<&String> = names.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "{source}: {expr} names {unknown:?}, which the binaries do not export (they export {exported:?})"
        );
    }
}
