//! A driver installation for tests and demos on machines without one:
//! ELF libraries built with the system `cc` (each with its soname), an
//! `ld.so.cache` made for the tree by the system's own `ldconfig -r`, GSP
//! firmware, binaries and the persistenced socket, laid out like a real
//! install under `usr/lib/x86_64-linux-gnu`.

use std::io;
use std::path::Path;
use std::process::Command;

/// The library directory of the tree.
pub const LIBDIR: &str = "usr/lib/x86_64-linux-gnu";

/// Builds the tree under `root` for driver `version`, with `libs` as
/// (library, soname), e.g. `("libcuda.so", "libcuda.so.1")`.
pub fn build(root: &Path, version: &str, libs: &[(&str, &str)]) -> io::Result<()> {
    let dir = root.join(LIBDIR);
    std::fs::create_dir_all(&dir)?;
    for (library, soname) in libs {
        shared_object(&dir.join(format!("{library}.{version}")), soname)?;
    }
    std::fs::create_dir_all(root.join("etc"))?;
    std::fs::write(root.join("etc/ld.so.conf"), format!("/{LIBDIR}\n"))?;
    // -r: the tree's own cache, written into it (soname links made there).
    run(Command::new("ldconfig").arg("-r").arg(root))?;
    let firmware = root.join(format!("lib/firmware/nvidia/{version}"));
    std::fs::create_dir_all(&firmware)?;
    for f in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        std::fs::write(firmware.join(f), b"fw")?;
    }
    std::fs::create_dir_all(root.join("usr/bin"))?;
    for b in ["nvidia-smi", "nvidia-cuda-mps-control"] {
        std::fs::write(root.join("usr/bin").join(b), b"#!/bin/sh\n")?;
    }
    std::fs::create_dir_all(root.join("run/nvidia-persistenced"))?;
    std::fs::write(root.join("run/nvidia-persistenced/socket"), b"")?;
    Ok(())
}

/// An ELF shared object with this soname at `path`.
fn shared_object(path: &Path, soname: &str) -> io::Result<()> {
    let src = path.with_extension("c");
    std::fs::write(&src, "int nvidia_fake(void) { return 0; }\n")?;
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"]).arg(path).arg(&src);
    run(&mut cc)?;
    std::fs::remove_file(src)
}

fn run(command: &mut Command) -> io::Result<()> {
    let status = command.status()?;
    if status.success() { Ok(()) } else { Err(io::Error::other(format!("{command:?} failed: {status}"))) }
}
