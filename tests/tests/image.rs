//! The container image, built here by `image/build.sh` as an OCI archive
//! (no container engine): it is the image the `Dockerfile` describes, it
//! holds the binaries it is given on a Debian root and nothing of NVIDIA's,
//! the binaries run in it as its user, the same inputs give the same
//! bytes, and containerd imports it and runs the plugin from it.
//!
//! The image is made from the binaries the other tests run (see
//! `integration_tests::image`); the first run on a machine downloads five
//! Debian packages, later runs reuse them.
//! Runs as root (`chroot`, containerd).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use integration_tests::helm::{self, container, rendered};
use integration_tests::image::{
    BuiltImage, Unpacked, build_image, image_binaries, parse_dockerfile, run_ok, sha256_file, sha256_gunzipped, unpack,
};
use integration_tests::real_cluster::node::{CRI_NAMESPACE, Containerd};
use integration_tests::workspace_root;
use serde_json::{Value, json};

const PLUGIN: &str = "/usr/local/bin/gpu-kubelet-plugin";
const CONTROLLER: &str = "/usr/local/bin/gpu-dra-controller";
/// The dynamic loader Debian's libc6 installs (the path in the binaries).
const LOADER: &str =
    if cfg!(target_arch = "aarch64") { "/lib/ld-linux-aarch64.so.1" } else { "/lib64/ld-linux-x86-64.so.2" };

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("image-test")
}

/// The archive, built (or found up to date) once for the tests of this
/// process, and unpacked.
fn image() -> &'static (BuiltImage, Unpacked) {
    static IMAGE: OnceLock<(BuiltImage, Unpacked)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let built = build_image(&tmp().join("out"));
        let unpacked = unpack(&built.archive, &tmp().join("unpacked"));
        (built, unpacked)
    })
}

fn version() -> String {
    let cargo = std::fs::read_to_string(workspace_root().join("Cargo.toml")).expect("Cargo.toml");
    let line = cargo.lines().find(|l| l.starts_with("version = ")).expect("the workspace's version");
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(workspace_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_archive_is_named_as_the_chart_pulls_it_and_every_blob_matches_its_digest() {
    let (built, unpacked) = image();
    let chart = yaml("charts/gpu-dra-driver/Chart.yaml");
    let values = yaml("charts/gpu-dra-driver/values.yaml");
    let version = version();
    assert_eq!(chart["appVersion"], json!(version), "the chart's appVersion is the crates' version");
    assert_eq!(built.name, format!("{}:{version}", values["image"]["repository"].as_str().expect("image.repository")));
    assert!(built.archive.ends_with(format!("gpu-dra-driver-{version}.oci.tar")), "{}", built.archive.display());

    let descriptor = &unpacked.index["manifests"][0];
    assert_eq!(descriptor["annotations"]["io.containerd.image.name"], json!(built.name));
    assert_eq!(descriptor["annotations"]["org.opencontainers.image.ref.name"], json!(version));
    assert_eq!(descriptor["digest"], json!(built.digest));
    assert_eq!(descriptor["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let layout: Value =
        serde_json::from_slice(&std::fs::read(unpacked.layout.join("oci-layout")).expect("oci-layout")).expect("JSON");
    assert_eq!(layout, json!({"imageLayoutVersion": "1.0.0"}));

    // Every descriptor's digest and size are its blob's.
    let mut descriptors = vec![descriptor.clone(), unpacked.manifest["config"].clone()];
    descriptors.extend(unpacked.manifest["layers"].as_array().expect("layers").iter().cloned());
    for d in &descriptors {
        let digest = d["digest"].as_str().expect("a digest");
        let blob = unpacked.blob(digest);
        assert_eq!(sha256_file(&blob), digest, "{}", blob.display());
        assert_eq!(json!(std::fs::metadata(&blob).expect("blob").len()), d["size"], "{digest}");
    }
    // The config's diff ids are the layers' uncompressed digests.
    let diff_ids: Vec<String> = unpacked.layer_blobs().iter().map(|b| sha256_gunzipped(b)).collect();
    assert_eq!(unpacked.config["rootfs"], json!({"type": "layers", "diff_ids": diff_ids}));
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!((&unpacked.config["os"], &unpacked.config["architecture"]), (&json!("linux"), &json!(arch)));
}

#[test]
fn the_archive_is_the_image_the_dockerfile_describes() {
    let (_, unpacked) = image();
    let text = std::fs::read_to_string(workspace_root().join("Dockerfile")).expect("the Dockerfile");
    let dockerfile = parse_dockerfile(&text);
    let config = &unpacked.config["config"];

    assert_eq!(config["User"], json!(dockerfile.user));
    assert_eq!(dockerfile.user, "65532:65532");
    assert_eq!(config["Entrypoint"], json!(dockerfile.entrypoint));
    assert_eq!(dockerfile.entrypoint, [PLUGIN]);
    assert_eq!(config["Env"], json!(dockerfile.env));
    let labels: BTreeMap<String, String> = serde_json::from_value(config["Labels"].clone()).expect("labels");
    assert_eq!(labels, dockerfile.labels);
    assert_eq!(labels.get("org.opencontainers.image.version"), Some(&version()), "the Dockerfile's version label");

    // The same programs in /usr/local/bin, and the same root: the
    // Dockerfile copies the root debian-root.sh made, as build.sh does.
    assert!(dockerfile.copies.contains(&("/out/".into(), "/usr/local/bin/".into())), "{:?}", dockerfile.copies);
    assert!(dockerfile.copies.contains(&("/rootfs/".into(), "/".into())), "{:?}", dockerfile.copies);
    assert!(dockerfile.runs.iter().any(|r| r == "debian-root.sh /rootfs"), "{:?}", dockerfile.runs);
    assert!(text.contains("COPY image/debian-root.sh "), "the Dockerfile runs the repository's debian-root.sh");
    let mut built = dockerfile.built_programs.clone();
    built.sort();
    let mut in_image: Vec<String> = std::fs::read_dir(unpacked.root.join("usr/local/bin"))
        .expect("usr/local/bin")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    in_image.sort();
    assert_eq!(in_image, built);
    assert_eq!(in_image, ["gpu-dra-controller", "gpu-kubelet-plugin"]);
}

#[test]
fn the_image_holds_the_binaries_given_on_a_debian_root_and_no_nvidia_file() {
    let (_, unpacked) = image();
    let bins = image_binaries();
    for (path, shipped) in [(PLUGIN, &bins.plugin), (CONTROLLER, &bins.controller)] {
        let file = unpacked.root.join(path.trim_start_matches('/'));
        let meta = std::fs::symlink_metadata(&file).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(meta.is_file(), "{path} is a regular file");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755, "{path}");
        assert!(std::fs::read(&file).expect("binary") == std::fs::read(shipped).expect("shipped"), "{path} is cargo's");
    }
    let entries: Vec<_> = unpacked.layers.iter().flatten().collect();
    for entry in &entries {
        assert_eq!(entry.owner, "0/0", "{} is owned by root", entry.path);
        assert!(!entry.path.to_lowercase().contains("nvidia"), "an NVIDIA file in the image: {}", entry.path);
        assert!(!entry.path.contains("libcuda"), "a CUDA file in the image: {}", entry.path);
    }
    let entry = |path: &str| entries.iter().find(|e| e.path == path).unwrap_or_else(|| panic!("no {path}"));
    assert_eq!(entry("tmp").mode, "drwxrwxrwt");
    assert!(entry("bin").mode.starts_with('l') && entry("lib64").mode.starts_with('l'), "merged /usr");

    let root = &unpacked.root;
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).expect("the CA bundle");
    assert!(bundle.matches("-----BEGIN CERTIFICATE-----").count() > 100, "ca-certificates' bundle is complete");
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("/etc/passwd");
    assert!(passwd.lines().any(|l| l.starts_with("nonroot:x:65532:65532:")), "{passwd}");
    let os = std::fs::read_to_string(root.join("etc/os-release")).expect("/etc/os-release");
    assert!(os.contains("VERSION_CODENAME=bookworm"), "{os}");
    let status = std::fs::read_to_string(root.join("var/lib/dpkg/status")).expect("dpkg's status");
    let mut packages: Vec<&str> = status.lines().filter_map(|l| l.strip_prefix("Package: ")).collect();
    packages.sort();
    assert_eq!(packages, ["base-files", "ca-certificates", "gcc-12-base", "libc6", "libgcc-s1"]);
    // No shell, no package manager.
    for absent in ["usr/bin/sh", "usr/bin/bash", "usr/bin/dpkg", "usr/bin/apt-get"] {
        assert!(!root.join(absent).exists(), "/{absent} is in the image");
    }
}

#[test]
fn the_binaries_run_in_the_image_as_its_user() {
    let (_, unpacked) = image();
    let root = unpacked.root.display().to_string();
    for path in [PLUGIN, CONTROLLER] {
        // The root's own loader finds every library the binary needs.
        let libraries = run_ok(Command::new("chroot").args([&root, LOADER, "--list", path]));
        assert!(!libraries.contains("not found"), "{path}: {libraries}");
        assert!(libraries.contains("libc.so.6 => /"), "{path}: {libraries}");
        let out = run_ok(Command::new("chroot").args(["--userspec=65532:65532", &root, path, "--version"]));
        let name = Path::new(path).file_name().expect("a name").to_string_lossy();
        assert_eq!(out.trim(), format!("{name} {}", version()), "{path} --version");
    }
}

#[test]
fn the_same_inputs_give_the_same_archive() {
    let (built, _) = image();
    // A second archive written now from the same binaries and packages.
    let again = tmp().join("again");
    let _ = std::fs::remove_dir_all(&again);
    let second = build_image(&again);
    assert_eq!(second.digest, built.digest);
    assert_eq!(sha256_file(&second.archive), sha256_file(&built.archive));
}

#[test]
fn every_program_the_chart_runs_is_in_the_image() {
    let (built, unpacked) = image();
    let outcomes = helm::render_all(Path::new(env!("CARGO_TARGET_TMPDIR")), &[("default", json!({}))]);
    let (objects, _) = rendered(&outcomes, "default");
    let path_dirs: Vec<String> = unpacked.config["config"]["Env"]
        .as_array()
        .expect("Env")
        .iter()
        .filter_map(|e| e.as_str()?.strip_prefix("PATH=").map(|p| p.split(':').map(String::from).collect::<Vec<_>>()))
        .flatten()
        .collect();
    let mut checked = 0;
    for workload in objects.iter().filter(|o| o["kind"] == "DaemonSet" || o["kind"] == "Deployment") {
        let containers = workload["spec"]["template"]["spec"]["containers"].as_array().expect("containers");
        for c in containers {
            let name = c["name"].as_str().expect("a container name");
            let c = container(workload, name);
            assert_eq!(c["image"], json!(built.name), "{name} runs the image built here");
            let program = c["command"][0].as_str().unwrap_or_else(|| panic!("{name} names its command"));
            let found = path_dirs
                .iter()
                .map(|d| unpacked.root.join(d.trim_start_matches('/')).join(program))
                .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0));
            assert!(found.is_some(), "{name}'s command {program} is on no directory of the image's PATH {path_dirs:?}");
            checked += 1;
        }
    }
    assert!(checked >= 2, "the plugin's and the controller's containers were checked");
}

#[test]
fn containerd_imports_the_archive_and_runs_the_plugin_from_it() {
    let (built, _) = image();
    let containerd = Containerd::start();
    let archive = built.archive.display().to_string();
    let ctr_ok = |args: &[&str]| {
        let out = containerd.ctr(args);
        assert!(
            out.status.success(),
            "ctr {}: {}{}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            containerd.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ctr_ok(&["-n", CRI_NAMESPACE, "images", "import", &archive]);
    let listed = ctr_ok(&["-n", CRI_NAMESPACE, "images", "list"]);
    assert!(
        listed.lines().any(|l| l.starts_with(&format!("{} ", built.name)) && l.contains(&built.digest)),
        "{} ({}) not imported: {listed}",
        built.name,
        built.digest
    );
    let runc = containerd.runc().display().to_string();
    for (id, path) in [("image-test-plugin", PLUGIN), ("image-test-controller", CONTROLLER)] {
        let out =
            ctr_ok(&["-n", CRI_NAMESPACE, "run", "--rm", "--runc-binary", &runc, &built.name, id, path, "--version"]);
        let name = Path::new(path).file_name().expect("a name").to_string_lossy();
        assert_eq!(out.trim(), format!("{name} {}", version()), "{path} --version in a container");
    }
}
