//! The webhook as the chart configures it: the certificate Helm generates
//! serves the Service's DNS name under the CA the webhook configuration
//! carries (a real TLS handshake, Python's `ssl`), and the match condition
//! sends the webhook only this driver's claims (the CEL expression
//! evaluated on claims and templates of this and other drivers).

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use integration_tests::helm::{one, python_with_helm, render_all, rendered};
use integration_tests::workspace_root;
use serde_json::{Value, json};

fn tmp_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

fn handshake(secret: &Value, ca: &Value, server_name: &str) -> Value {
    let mut child = Command::new(python_with_helm(tmp_dir()))
        .arg(workspace_root().join("tests/python/tls_handshake.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let request = json!({"cert": secret["data"]["tls.crt"], "key": secret["data"]["tls.key"], "ca": ca, "server_name": server_name});
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// No cert-manager: the chart's own CA and certificate, in one Secret,
/// and that CA in the webhook configuration.
#[test]
fn the_generated_certificate_serves_the_webhooks_name() {
    let outcomes = render_all(tmp_dir(), &[("default", json!({})), ("again", json!({}))]);
    let (objects, _) = rendered(&outcomes, "default");
    let secret = one(&objects, "Secret", "webhook-tls");
    let webhook = one(&objects, "ValidatingWebhookConfiguration", "webhook");
    let ca = &webhook["webhooks"][0]["clientConfig"]["caBundle"];
    let service = webhook["webhooks"][0]["clientConfig"]["service"].clone();
    let name = format!("{}.{}.svc", service["name"].as_str().unwrap(), service["namespace"].as_str().unwrap());
    assert_eq!(name, "gpu-dra-driver-webhook.gpu-dra-driver.svc");
    let done = handshake(secret, ca, &name);
    assert_eq!(done["ok"], true, "{done}");
    assert_eq!(done["dns_names"], json!([name, format!("{name}.cluster.local")]));
    let refused = handshake(secret, ca, "other.gpu-dra-driver.svc");
    assert_eq!(refused["ok"], false, "{refused}");
    // Offline, each render makes a new pair (in a cluster, `lookup` keeps
    // the Secret's): the CA of one render does not vouch for another's.
    let (again, _) = rendered(&outcomes, "again");
    let other_ca = &one(&again, "ValidatingWebhookConfiguration", "webhook")["webhooks"][0]["clientConfig"]["caBundle"];
    assert_ne!(other_ca, ca);
    assert_eq!(handshake(secret, other_ca, &name)["ok"], false);
    // The controller mounts that Secret.
    let deployment = one(&objects, "Deployment", "controller");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    assert!(volumes.iter().any(|v| v["secret"]["secretName"] == secret["metadata"]["name"]));
}

/// Evaluates the webhook's match condition as the API server would, with
/// `object` and `request` bound.
fn matches(expression: &str, resource: &str, object: &Value) -> bool {
    let program = cel::Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e:?}"));
    let mut context = cel::Context::default();
    context.add_variable("object", object).unwrap();
    context
        .add_variable(
            "request",
            json!({"resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource}}),
        )
        .unwrap();
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("{object}: {other:?}"),
    }
}

#[test]
fn the_webhook_sees_only_this_drivers_claims() {
    let outcomes = render_all(
        tmp_dir(),
        &[
            ("default", json!({})),
            ("narrower", json!({"webhook": {"deviceClassNames": ["gpu.nvidia.com", "mig.nvidia.com", "gpu-h100"]}})),
        ],
    );
    let (objects, _) = rendered(&outcomes, "default");
    let hook = &one(&objects, "ValidatingWebhookConfiguration", "webhook")["webhooks"][0];
    let expression = hook["matchConditions"][0]["expression"].as_str().unwrap();
    let request = |class: &str| json!({"name": "r", "exactly": {"deviceClassName": class}});
    let claim = |devices: Value| json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "spec": {"devices": devices}});
    let template = |devices: Value| json!({"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": devices}}});
    let ours_config = json!([{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]);
    let theirs_config = json!([{"opaque": {"driver": "net.example.com", "parameters": {}}}]);
    for (name, resource, object, expected) in [
        ("our class", "resourceclaims", claim(json!({"requests": [request("gpu.nvidia.com")]})), true),
        ("MIG class", "resourceclaims", claim(json!({"requests": [request("mig.nvidia.com")]})), true),
        ("another driver's class", "resourceclaims", claim(json!({"requests": [request("nic.example.com")]})), false),
        (
            "our class among firstAvailable",
            "resourceclaims",
            claim(
                json!({"requests": [{"name": "r", "firstAvailable": [{"name": "a", "deviceClassName": "nic.example.com"}, {"name": "b", "deviceClassName": "gpu.nvidia.com"}]}]}),
            ),
            true,
        ),
        (
            "another class, our opaque config",
            "resourceclaims",
            claim(json!({"requests": [request("nic.example.com")], "config": ours_config})),
            true,
        ),
        (
            "another class, another config",
            "resourceclaims",
            claim(json!({"requests": [request("nic.example.com")], "config": theirs_config})),
            false,
        ),
        ("no devices", "resourceclaims", json!({"kind": "ResourceClaim", "spec": {}}), false),
        (
            "template of ours",
            "resourceclaimtemplates",
            template(json!({"requests": [request("gpu.nvidia.com")]})),
            true,
        ),
        (
            "template of another",
            "resourceclaimtemplates",
            template(json!({"requests": [request("nic.example.com")]})),
            false,
        ),
        ("narrower class", "resourceclaims", claim(json!({"requests": [request("gpu-h100")]})), false),
    ] {
        assert_eq!(matches(expression, resource, &object), expected, "{name}");
    }
    // An admin's narrower class, once listed, is seen too.
    let (objects, _) = rendered(&outcomes, "narrower");
    let hook = &one(&objects, "ValidatingWebhookConfiguration", "webhook")["webhooks"][0];
    let expression = hook["matchConditions"][0]["expression"].as_str().unwrap();
    let narrower = claim(json!({"requests": [request("gpu-h100")]}));
    assert!(matches(expression, "resourceclaims", &narrower));
}
