//! The README and the guide under `docs/` hold together: the README opens
//! with the set-up commands CI runs and stays a page that points to the
//! guide, every page of the guide is in its index, and every link between
//! them (a file, or a section's anchor) resolves.

use std::path::{Component, Path, PathBuf};

use integration_tests::docs::{Page, anchor, headings, page, pages};
use integration_tests::workspace_root;

/// The README's first fenced block: the set-up commands.
fn set_up_block(readme: &str) -> &str {
    readme.split("```sh\n").nth(1).and_then(|b| b.split("```").next()).expect("the README's first block")
}

#[test]
fn the_readme_opens_with_the_set_up_commands_ci_runs() {
    let readme = page("README.md");
    let block = set_up_block(&readme);
    let lines: Vec<&str> = block.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    assert_eq!(
        lines,
        [
            "cargo run -p integration-tests --example demo",
            "cargo run -p integration-tests --example demo -- --real-cluster 1.37",
            "cargo test --workspace",
        ],
        "{block}"
    );
    // `.ci/run` runs the README's test command, as it says.
    let ci = std::fs::read_to_string(workspace_root().join(".ci/run")).expect(".ci/run");
    let command = ci.split("# The README's test command.\n").nth(1).and_then(|c| c.lines().next());
    assert_eq!(command, Some("cargo test --workspace"), ".ci/run no longer runs the README's test command");
}

#[test]
fn the_readme_is_a_page_that_points_to_the_guide() {
    let readme = page("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines: move what is not set-up or install in brief to docs/");
    for link in ["(docs/README.md)", "(docs/migrating-from-nvidia.md)"] {
        assert!(readme.contains(link), "the README does not link {link}");
    }
}

#[test]
fn every_page_of_the_guide_is_in_its_index() {
    let index = page("docs/README.md");
    for page in pages() {
        let Ok(name) = page.path.strip_prefix("docs") else { continue };
        let name = name.display().to_string();
        if name != "README.md" {
            assert!(index.contains(&format!("]({name})")), "docs/README.md does not link {name}");
        }
    }
}

/// The inline links of a page outside fenced blocks: `[text](target)`.
fn links(text: &str) -> Vec<String> {
    integration_tests::docs::prose(text)
        .split("](")
        .skip(1)
        .map(|rest| rest.split(')').next().unwrap_or_default().to_string())
        .collect()
}

/// `path` relative to the workspace root, `..` resolved.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn check_link(page: &Page, target: &str) -> Result<(), String> {
    if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
        return Ok(());
    }
    if target.is_empty() || target.contains(char::is_whitespace) {
        return Err(format!("a link to {target:?}"));
    }
    let (file, section) = target.split_once('#').map_or((target, None), |(f, s)| (f, Some(s)));
    let path = if file.is_empty() {
        page.path.clone()
    } else {
        normal(&page.path.parent().unwrap_or(Path::new("")).join(file))
    };
    let on_disk = workspace_root().join(&path);
    if !on_disk.exists() {
        return Err(format!("{target}: {} does not exist", path.display()));
    }
    if let Some(section) = section {
        let text = std::fs::read_to_string(&on_disk).map_err(|e| format!("{target}: {e}"))?;
        let anchors: Vec<String> = headings(&text).into_iter().map(|(_, _, title)| anchor(title)).collect();
        if !anchors.iter().any(|a| a == section) {
            return Err(format!("{target}: no heading of {} has the anchor #{section} ({anchors:?})", path.display()));
        }
    }
    Ok(())
}

#[test]
fn every_link_of_the_readme_and_the_guide_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for target in links(&page.text) {
            checked += 1;
            if let Err(why) = check_link(&page, &target) {
                broken.push(format!("{}: {why}", page.path.display()));
            }
        }
    }
    assert!(checked >= 50, "only {checked} links found");
    assert!(broken.is_empty(), "links that do not resolve:\n{}", broken.join("\n"));
}

/// The anchors are GitHub's, as the links spell them.
#[test]
fn anchors_are_githubs() {
    assert_eq!(anchor("Upgrade, roll back, uninstall"), "upgrade-roll-back-uninstall");
    assert_eq!(anchor("CEL selectors: what is supported"), "cel-selectors-what-is-supported");
    assert_eq!(anchor("`gpu-dra-controller simulate`"), "gpu-dra-controller-simulate");
    assert_eq!(anchor("Reliability: the node's state files"), "reliability-the-nodes-state-files");
    assert_eq!(anchor("ComputeDomains (multi-node NVLink)"), "computedomains-multi-node-nvlink");
}

#[test]
fn every_suite_is_in_the_map_of_features_to_tests() {
    let map = integration_tests::docs::section("Where each feature is tested");
    let dir = workspace_root().join("tests/tests");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(stem) =
            path.file_stem().and_then(|s| s.to_str()).filter(|_| path.extension().is_some_and(|e| e == "rs"))
        else {
            continue;
        };
        if !map.contains(&format!("`{stem}`")) {
            missing.push(stem.to_owned());
        }
    }
    missing.sort();
    assert!(missing.is_empty(), "suites not in docs/contributing.md's map: {missing:?}");
}
