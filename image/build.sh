#!/usr/bin/env bash
# Builds the driver's container image as an OCI archive on this machine,
# with no container engine: the release binaries (cargo, as the Dockerfile
# builds them) on a minimal root of Debian packages (./debian-root.sh),
# written as an OCI image layout in one tar by ./oci_archive.py. The same
# binaries and .deb versions give the same bytes (and digests).
#
#   usage: image/build.sh [--out DIR] [--check-reproducible]
#     --out DIR               where the archive goes (default
#                             $CACHE/image, CACHE = $GPU_DRA_KUBE_CACHE,
#                             else ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver)
#     --check-reproducible    write the archive a second time from the same
#                             inputs and fail unless the bytes are equal
#   environment:
#     GPU_DRA_IMAGE_PLUGIN, GPU_DRA_IMAGE_CONTROLLER
#                             take these gpu-kubelet-plugin and
#                             gpu-dra-controller instead of building them
#                             (the tests pass the ones cargo built for them)
#     GPU_DRA_IMAGE_REPOSITORY  the image's name (default: the chart's
#                             image.repository, ghcr.io/example/gpu-dra-driver)
#     SOURCE_DATE_EPOCH       the files' and the image's date (default: 0)
#
# Writes DIR/gpu-dra-driver-<version>.oci.tar, tagged
# <repository>:<version> (load it with `ctr -n k8s.io images import`,
# `kind load image-archive`, or `docker load`). An archive whose inputs
# (binaries, scripts, package versions, name, date) are those of the last
# build is kept as it is. On success the last lines of stdout are
#   image-archive=<file>
#   image-name=<repository>:<version>
#   image-digest=sha256:<hex>   (the manifest's)
# Progress and the image's summary go to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${GPU_DRA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}
out=$cache/image
check=no
while (($#)); do
	case $1 in
	--out) out=${2:?--out needs a directory}; shift 2 ;;
	--check-reproducible) check=yes; shift ;;
	*) echo "build.sh: unknown argument '$1' (allowed: --out DIR, --check-reproducible)" >&2; exit 2 ;;
	esac
done
repository=${GPU_DRA_IMAGE_REPOSITORY:-ghcr.io/example/gpu-dra-driver}
epoch=${SOURCE_DATE_EPOCH:-0}

# Debian's tools this needs; python3 is installed when missing, as
# tests/kube-bins/node.sh installs runc (the rest is in every Debian).
for tool in apt-get apt-cache dpkg dpkg-deb tar sha256sum; do
	command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing: this script builds on Debian (12)" >&2; exit 1; }
done
if ! command -v python3 >/dev/null; then
	if [[ $(id -u) == 0 ]]; then
		echo "build.sh: installing python3 from Debian (apt-get)" >&2
		apt-get install -y --no-install-recommends python3 >&2 ||
			{ apt-get update >&2 && apt-get install -y --no-install-recommends python3 >&2; }
	else
		echo "build.sh: the image's writer needs python3: apt-get install python3 (as root)" >&2
		exit 1
	fi
fi

# The binaries as the Dockerfile builds them: the plugin with the
# size-optimised `node` profile, the controller with `release`; cargo
# rebuilds nothing that is up to date, and its messages name the files.
cargo_executable() { # <profile> <package>: builds it, prints its path
	(cd "$repo" && cargo build --locked --profile "$1" -p "$2" --bin "$2" --message-format=json-render-diagnostics) |
		python3 -c 'import json, sys
name = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == name and m.get("executable"):
        print(m["executable"])' "$2"
}
plugin=${GPU_DRA_IMAGE_PLUGIN:-}
controller=${GPU_DRA_IMAGE_CONTROLLER:-}
if [[ -z $plugin ]]; then
	echo "build.sh: cargo build --profile node -p gpu-kubelet-plugin (minutes when it compiles: fat LTO)" >&2
	plugin=$(cargo_executable node gpu-kubelet-plugin)
fi
if [[ -z $controller ]]; then
	echo "build.sh: cargo build --release -p gpu-dra-controller" >&2
	controller=$(cargo_executable release gpu-dra-controller)
fi
for binary in "$plugin" "$controller"; do
	[[ -f $binary && -x $binary ]] || { echo "build.sh: no executable at '$binary'" >&2; exit 1; }
done
[[ $(basename "$plugin") == gpu-kubelet-plugin && $(basename "$controller") == gpu-dra-controller ]] || {
	echo "build.sh: the binaries must be named gpu-kubelet-plugin and gpu-dra-controller (got $plugin, $controller)" >&2
	exit 1
}
# The version is what the shipped binaries say they are.
version=$("$plugin" --version | awk '{print $2}')
controller_version=$("$controller" --version | awk '{print $2}')
[[ -n $version && $version == "$controller_version" ]] || {
	echo "build.sh: the binaries disagree on their version ('$version', '$controller_version')" >&2
	exit 1
}

arch=$(dpkg --print-architecture)
packages=$("$here/debian-root.sh" --versions)
archive=$out/gpu-dra-driver-$version.oci.tar
inputs=$( (
	sha256sum "$plugin" "$controller" "$here/debian-root.sh" "$here/oci_archive.py" | cut -d' ' -f1
	echo "$packages" "$repository" "$version" "$arch" "$epoch"
) | sha256sum | cut -d' ' -f1)
mkdir -p "$out"

write_archive() { # <archive file>: prints image-digest=...
	local work
	work=$(mktemp -d)
	# Unpacked as root, the root's files keep the packages' modes.
	"$here/debian-root.sh" "$work/root" "$cache/image-debs" &&
		python3 "$here/oci_archive.py" --root "$work/root" --binary "$plugin" --binary "$controller" \
			--name "$repository" --version "$version" --arch "$arch" --epoch "$epoch" \
			--history "$(echo "$packages" | tr '\n' ' ')" --out "$1"
	local status=$?
	rm -rf "$work"
	return $status
}

# One build of an archive at a time (tests of one run may ask at once).
exec 9>"$archive.lock"
flock 9
if [[ -f $archive && -f $archive.inputs && $(cat "$archive.inputs") == "$inputs" && $check == no ]]; then
	echo "build.sh: $archive is up to date (same binaries, packages and scripts)" >&2
	digest=$(cat "$archive.digest")
else
	rm -f "$archive.inputs"
	digest=$(write_archive "$archive")
	digest=${digest#image-digest=}
	echo "$digest" >"$archive.digest"
	echo "$inputs" >"$archive.inputs"
fi
if [[ $check == yes ]]; then
	again=$(mktemp -d)
	second=$(write_archive "$again/second.oci.tar" 2>/dev/null)
	first_sum=$(sha256sum <"$archive" | cut -d' ' -f1)
	second_sum=$(sha256sum <"$again/second.oci.tar" | cut -d' ' -f1)
	rm -rf "$again"
	[[ ${second#image-digest=} == "$digest" && $first_sum == "$second_sum" ]] || {
		echo "build.sh: not reproducible: a second build gave manifest ${second#image-digest=}, archive sha256:$second_sum (first: $digest, sha256:$first_sum)" >&2
		exit 1
	}
	echo "build.sh: reproducible: a second build gave the same archive (sha256:$first_sum)" >&2
fi
exec 9>&-
echo "image-archive=$archive"
echo "image-name=$repository:$version"
echo "image-digest=$digest"
