//! The driver's image as `image/build.sh` makes it (an OCI archive, no
//! container engine), unpacked for the tests, and what the `Dockerfile`
//! says the image is.
//!
//! The tests' archive holds the binaries the other tests run (the dev
//! profile under `cargo test`): what is tested is how the image is made
//! from the binaries it is given, and the shipped ones (`node` and
//! `release` profiles, fat LTO: about 30 min of CPU cold on 2 cores) would
//! add that much to every cold CI run. `image/build.sh` without
//! `GPU_DRA_IMAGE_*` builds the shipped ones, as the Dockerfile does.
//! Unpacking uses the system's `tar`, `gzip` and `sha256sum`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::workspace_root;

/// The binaries the tests put in the image: those the other tests run.
#[derive(Debug, Clone)]
pub struct ImageBinaries {
    pub plugin: PathBuf,
    pub controller: PathBuf,
}

pub fn image_binaries() -> ImageBinaries {
    ImageBinaries { plugin: crate::kubelet_plugin().to_path_buf(), controller: crate::controller().to_path_buf() }
}

/// What `image/build.sh` printed about the archive it wrote.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub archive: PathBuf,
    /// `<repository>:<version>`.
    pub name: String,
    /// The manifest's digest, `sha256:<hex>`.
    pub digest: String,
}

/// Runs `image/build.sh --out <out>` with [`image_binaries`] (an
/// archive whose inputs have not changed is kept as it is).
pub fn build_image(out: &Path) -> BuiltImage {
    let bins = image_binaries();
    let script = workspace_root().join("image/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .arg("--out")
        .arg(out)
        .env("GPU_DRA_IMAGE_PLUGIN", &bins.plugin)
        .env("GPU_DRA_IMAGE_CONTROLLER", &bins.controller)
        .env_remove("GPU_DRA_IMAGE_REPOSITORY")
        .env_remove("SOURCE_DATE_EPOCH")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{} failed ({}): {stdout}", script.display(), output.status);
    let printed = |key: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{} printed no {key}: {stdout}", script.display()))
            .to_string()
    };
    BuiltImage {
        archive: PathBuf::from(printed("image-archive=")),
        name: printed("image-name="),
        digest: printed("image-digest="),
    }
}

/// One entry of a layer, as `tar --list --verbose --numeric-owner` shows it.
#[derive(Debug, Clone)]
pub struct LayerEntry {
    /// `drwxr-xr-x`, `-rwxr-xr-x`, `lrwxrwxrwx` ...
    pub mode: String,
    /// `uid/gid`.
    pub owner: String,
    /// Relative, without a leading `./` or trailing `/`.
    pub path: String,
}

/// An archive unpacked under a directory: the layout's documents, the
/// blobs, and the layers applied in order onto `root` (as root: owners
/// and modes kept).
#[derive(Debug)]
pub struct Unpacked {
    pub layout: PathBuf,
    pub index: Value,
    pub manifest: Value,
    pub config: Value,
    pub root: PathBuf,
    /// Each layer's entries, in the manifest's order.
    pub layers: Vec<Vec<LayerEntry>>,
}

impl Unpacked {
    /// The file of blob `digest` (`sha256:<hex>`).
    pub fn blob(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or_else(|| panic!("not a sha256 digest: {digest}"));
        self.layout.join("blobs/sha256").join(hex)
    }

    pub fn layer_blobs(&self) -> Vec<PathBuf> {
        let layers = self.manifest["layers"].as_array().expect("the manifest's layers");
        layers.iter().map(|l| self.blob(l["digest"].as_str().expect("a layer digest"))).collect()
    }
}

/// Unpacks `archive` into `dir` (made anew).
pub fn unpack(archive: &Path, dir: &Path) -> Unpacked {
    if dir.exists() {
        std::fs::remove_dir_all(dir).unwrap_or_else(|e| panic!("removing {}: {e}", dir.display()));
    }
    let layout = dir.join("layout");
    let root = dir.join("root");
    for d in [&layout, &root] {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    }
    run_ok(Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(&layout));
    let json = |path: &Path| -> Value {
        let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().expect("the index's manifests");
    assert_eq!(manifests.len(), 1, "one image in the archive: {index}");
    let mut unpacked =
        Unpacked { layout, index: index.clone(), manifest: Value::Null, config: Value::Null, root, layers: Vec::new() };
    unpacked.manifest = json(&unpacked.blob(manifests[0]["digest"].as_str().expect("the manifest's digest")));
    unpacked.config =
        json(&unpacked.blob(unpacked.manifest["config"]["digest"].as_str().expect("the config's digest")));
    for blob in unpacked.layer_blobs() {
        run_ok(Command::new("tar").arg("-xzf").arg(&blob).arg("--numeric-owner").arg("-C").arg(&unpacked.root));
        let listing = run_ok(Command::new("tar").arg("-tvzf").arg(&blob).arg("--numeric-owner"));
        unpacked.layers.push(listing.lines().map(layer_entry).collect());
    }
    unpacked
}

/// `-rwxr-xr-x 0/0   1234 2023-11-14 22:13 usr/local/bin/x` (a link: `... a -> b`).
fn layer_entry(line: &str) -> LayerEntry {
    let mut rest = line;
    let mut fields = Vec::new();
    for _ in 0..5 {
        rest = rest.trim_start();
        let end = rest.find(' ').unwrap_or(rest.len());
        fields.push(&rest[..end]);
        rest = &rest[end..];
    }
    let name = rest.trim_start();
    let name = name.split_once(" -> ").map_or(name, |(path, _)| path);
    LayerEntry {
        mode: fields[0].to_string(),
        owner: fields[1].to_string(),
        path: name.trim_start_matches("./").trim_end_matches('/').to_string(),
    }
}

/// `sha256:<hex>` of a file.
pub fn sha256_file(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    format!("sha256:{}", out.split_whitespace().next().unwrap_or_default())
}

/// `sha256:<hex>` of a gzip file's uncompressed bytes (a layer's diff id).
pub fn sha256_gunzipped(path: &Path) -> String {
    let out = run_ok(Command::new("sh").arg("-c").arg("gzip -dc \"$1\" | sha256sum").arg("sh").arg(path));
    format!("sha256:{}", out.split_whitespace().next().unwrap_or_default())
}

/// Runs `command`, asserting success; its standard output as text.
pub fn run_ok(command: &mut Command) -> String {
    let out = command.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert_ok(command, &out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_ok(command: &Command, out: &Output) {
    assert!(
        out.status.success(),
        "{command:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ------------------------------------------------------------ the Dockerfile

/// What the Dockerfile's final stage says the image is.
#[derive(Debug, Default, PartialEq)]
pub struct DockerfileImage {
    pub user: String,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// `COPY` sources and destinations of the final stage, as written.
    pub copies: Vec<(String, String)>,
    /// The files the build stage installs into `/out/` (copied to
    /// `/usr/local/bin/`).
    pub built_programs: Vec<String>,
    /// The commands the other stages `RUN`.
    pub runs: Vec<String>,
}

/// Parses the Dockerfile's instructions (comments dropped, continued lines
/// joined) into what the final stage makes.
pub fn parse_dockerfile(text: &str) -> DockerfileImage {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                if !current.trim().is_empty() {
                    instructions.push(current.trim().to_string());
                }
                current.clear();
            }
        }
    }
    let final_stage = instructions.iter().rposition(|i| i.starts_with("FROM ")).expect("a FROM");
    let mut image = DockerfileImage::default();
    for (n, instruction) in instructions.iter().enumerate() {
        let (keyword, rest) = instruction.split_once(' ').unwrap_or((instruction, ""));
        let rest = rest.trim();
        if n < final_stage {
            if keyword == "RUN" {
                image.runs.push(rest.to_string());
                let words = rest.split_whitespace().filter_map(|w| w.strip_prefix("/out/"));
                image.built_programs.extend(words.filter(|w| !w.is_empty()).map(String::from));
            }
            continue;
        }
        match keyword {
            "USER" => image.user = rest.to_string(),
            "ENTRYPOINT" => image.entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT in JSON form"),
            "ENV" => image.env.push(rest.to_string()),
            "LABEL" => image.labels.extend(label_pairs(rest)),
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().filter(|w| !w.starts_with("--")).collect();
                if let [sources @ .., destination] = words.as_slice() {
                    image.copies.extend(sources.iter().map(|s| (s.to_string(), destination.to_string())));
                }
            }
            _ => {}
        }
    }
    image
}

/// `a="x y" b="z"` as pairs.
fn label_pairs(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once("=\"") {
        let Some(end) = after.find('"') else { break };
        pairs.push((key.trim().to_string(), after[..end].to_string()));
        rest = after[end + 1..].trim_start();
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_final_stage_is_parsed_with_its_continued_labels() {
        let text = "FROM rust AS build\nRUN cargo build \\\n && install -D a /out/one \\\n && install b /out/two\n\
                    # a comment\nFROM scratch\nCOPY --from=build /out/ /usr/local/bin/\nUSER 1:2\n\
                    LABEL a=\"x y\" \\\n      b=\"z\"\nENTRYPOINT [\"/bin/p\"]\n";
        let image = parse_dockerfile(text);
        assert_eq!(image.user, "1:2");
        assert_eq!(image.entrypoint, ["/bin/p"]);
        assert_eq!(image.built_programs, ["one", "two"]);
        assert_eq!(image.copies, [("/out/".to_string(), "/usr/local/bin/".to_string())]);
        assert_eq!(image.labels.get("a").map(String::as_str), Some("x y"));
        assert_eq!(image.labels.get("b").map(String::as_str), Some("z"));
    }

    #[test]
    fn a_listing_line_gives_mode_owner_and_path() {
        let entry = layer_entry("lrwxrwxrwx 0/0               0 1970-01-01 00:00 bin -> usr/bin");
        assert_eq!((entry.mode.as_str(), entry.owner.as_str(), entry.path.as_str()), ("lrwxrwxrwx", "0/0", "bin"));
        let entry = layer_entry("drwxr-xr-x 0/0               0 1970-01-01 00:00 usr/local/bin/");
        assert_eq!(entry.path, "usr/local/bin");
    }
}
