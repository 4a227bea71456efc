#!/usr/bin/env python3
"""Writes the driver's image as an OCI image layout in one tar file, with
nothing but Python's standard library, reproducibly: the same root
directory and binaries give the same bytes, hence the same digests.

Two layers, so that a new driver version shares the Debian layer with the
last one: the root made by debian-root.sh, then the two binaries in
/usr/local/bin. Every tar entry is sorted by name, owned by 0:0 with no
user or group names, and dated SOURCE_DATE_EPOCH; the gzip streams carry
no name and mtime 0. The image's configuration (user, entrypoint,
environment, labels) is the one the Dockerfile at the repository's root
describes; tests/tests/image.rs holds the two to the same values.

The index names the image twice, as containerd's own exporter does:
`io.containerd.image.name` (the full reference, which `ctr images import`
and `kind load image-archive` use) and `org.opencontainers.image.ref.name`
(the tag, per the OCI image layout).

usage: oci_archive.py --root DIR --binary FILE [--binary FILE] --name REPO
                      --version V --out FILE [--epoch N] [--history TEXT]
Prints a summary of what it wrote (digests, sizes, layers, largest files)
to stderr and `image-digest=sha256:<hex>` to stdout.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile

# The Dockerfile's USER, ENTRYPOINT, ENV and LABELs.
USER = "65532:65532"
BIN_DIR = "usr/local/bin"
ENTRYPOINT = ["/usr/local/bin/gpu-kubelet-plugin"]
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TITLE = "gpu-dra-driver"
DESCRIPTION = "Kubernetes DRA driver for NVIDIA GPUs: kubelet plugin and controller"
LICENSES = "Apache-2.0"

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

# dpkg's architecture names that differ from the OCI's (GOARCH).
OCI_ARCH = {"i386": "386", "armhf": "arm", "armel": "arm", "ppc64el": "ppc64le"}


def canonical_json(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class Entries:
    """The entries of one layer's tar, in name order, written
    deterministically."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.items = {}

    def _info(self, name, kind, mode):
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = self.epoch
        return info

    def directory(self, name, mode=0o755):
        self.items[name] = (self._info(name, tarfile.DIRTYPE, mode), None)

    def file(self, name, data, mode):
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.items[name] = (info, data)

    def symlink(self, name, target):
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.items[name] = (info, None)

    def add_tree(self, root):
        """Everything under `root`, with its modes; links kept as links
        (never followed), anything but files, directories and links
        refused."""
        for current, dirs, files in os.walk(root):
            dirs.sort()
            for base in sorted(dirs + files):
                path = os.path.join(current, base)
                name = os.path.relpath(path, root)
                st = os.lstat(path)
                mode = stat.S_IMODE(st.st_mode)
                if stat.S_ISLNK(st.st_mode):
                    self.symlink(name, os.readlink(path))
                elif stat.S_ISDIR(st.st_mode):
                    self.directory(name, mode)
                elif stat.S_ISREG(st.st_mode):
                    with open(path, "rb") as f:
                        self.file(name, f.read(), mode)
                else:
                    sys.exit(f"oci_archive.py: {path} is neither a file, a directory nor a link")

    def tar(self):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self.items):
                info, data = self.items[name]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return out.getvalue()


def gzipped(data):
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as z:
        z.write(data)
    return out.getvalue()


class Layout:
    """The blobs of an OCI image layout, by digest."""

    def __init__(self):
        self.blobs = {}

    def add(self, media_type, data, **extra):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the root filesystem (debian-root.sh's)")
    parser.add_argument("--binary", action="append", required=True, help="a program for /usr/local/bin")
    parser.add_argument("--name", required=True, help="repository, e.g. ghcr.io/example/gpu-dra-driver")
    parser.add_argument("--version", required=True, help="the driver's version: the tag and the version label")
    parser.add_argument("--out", required=True, help="the OCI archive to write")
    parser.add_argument("--arch", required=True, help="dpkg's architecture of the root (dpkg --print-architecture)")
    parser.add_argument("--epoch", type=int, default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    parser.add_argument("--history", default="", help="what the root layer was made from")
    args = parser.parse_args()

    layout = Layout()
    base = Entries(args.epoch)
    base.add_tree(args.root)
    programs = Entries(args.epoch)
    parts = BIN_DIR.split("/")
    for depth in range(1, len(parts) + 1):
        programs.directory("/".join(parts[:depth]))
    for binary in args.binary:
        with open(binary, "rb") as f:
            programs.file(f"{BIN_DIR}/{os.path.basename(binary)}", f.read(), 0o755)

    layers, diff_ids, summary = [], [], []
    for label, entries in (("Debian root", base), ("binaries", programs)):
        tar = entries.tar()
        diff_ids.append("sha256:" + hashlib.sha256(tar).hexdigest())
        layers.append(layout.add(LAYER, gzipped(tar)))
        summary.append((label, layers[-1], len(tar), len(entries.items)))

    created = datetime.datetime.fromtimestamp(args.epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    names = " ".join(os.path.basename(b) for b in args.binary)
    config = {
        "created": created,
        "architecture": OCI_ARCH.get(args.arch, args.arch),
        "os": "linux",
        "config": {
            "User": USER,
            "Env": [f"PATH={PATH}"],
            "Entrypoint": ENTRYPOINT,
            "Labels": {
                "org.opencontainers.image.title": TITLE,
                "org.opencontainers.image.description": DESCRIPTION,
                "org.opencontainers.image.version": args.version,
                "org.opencontainers.image.licenses": LICENSES,
            },
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [
            {"created": created, "created_by": f"image/debian-root.sh: {args.history}".strip()},
            {"created": created, "created_by": f"COPY {names} /{BIN_DIR}/"},
        ],
    }
    config_descriptor = layout.add(CONFIG, canonical_json(config))
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": config_descriptor, "layers": layers}
    reference = f"{args.name}:{args.version}"
    manifest_descriptor = layout.add(
        MANIFEST,
        canonical_json(manifest),
        platform={"architecture": config["architecture"], "os": "linux"},
        annotations={"io.containerd.image.name": reference, "org.opencontainers.image.ref.name": args.version},
    )
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": [manifest_descriptor]}

    archive = Entries(args.epoch)
    archive.file("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}), 0o644)
    archive.file("index.json", canonical_json(index), 0o644)
    archive.directory("blobs")
    archive.directory("blobs/sha256")
    for digest, data in layout.blobs.items():
        archive.file("blobs/sha256/" + digest.split(":", 1)[1], data, 0o644)
    data = archive.tar()
    partial = args.out + ".partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, args.out)

    mib = lambda n: f"{n / 1048576:.1f} MiB"  # noqa: E731
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    say(f"image {reference} ({config['architecture']}), manifest {manifest_descriptor['digest']}")
    say(f"  archive {args.out}: {mib(len(data))}, sha256:{hashlib.sha256(data).hexdigest()}")
    say(f"  user {USER}, entrypoint {ENTRYPOINT}")
    for label, layer, size, count in summary:
        say(f"  layer {label}: {mib(layer['size'])} compressed, {mib(size)} unpacked, {count} entries, {layer['digest']}")
    files = [(len(d), n) for n, (_, d) in {**base.items, **programs.items}.items() if d is not None]
    say("  largest files: " + ", ".join(f"/{n} {mib(s)}" for s, n in sorted(files, reverse=True)[:6]))
    print(f"image-digest={manifest_descriptor['digest']}")


if __name__ == "__main__":
    main()
