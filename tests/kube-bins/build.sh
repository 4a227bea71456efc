#!/usr/bin/env bash
# Builds the real control plane for the tests -- etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler -- from the Go modules pinned in
# this directory, into a cache outside the clone keyed by version:
#   $CACHE/kube/<k8s version>/bin/{kube-apiserver,kube-controller-manager,kube-scheduler}
#   $CACHE/etcd/<etcd version>/bin/etcd
# (CACHE = $GPU_DRA_KUBE_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver).
# A version already in the cache is not rebuilt, so this runs in well under
# a second once built; a build goes to a temporary directory renamed into
# place at the end, so an interrupted build leaves nothing half-made, and a
# lock keeps two test runs from building the same version twice.
#
#   usage: build.sh <minor, e.g. 1.37> [node]
# On success the last two lines of stdout are
#   kube-bin-dir=<dir>
#   etcd-bin-dir=<dir>
# With `node`, the pieces of one real node are made too and printed before
# those two lines (see the end of this file): the release's kubelet,
# containerd (pinned in ./containerd), runc from Debian (installed with
# apt-get when missing), and the pause and test images as an OCI archive
# made from Debian's busybox-static.
# Progress goes to stderr.
set -euo pipefail
minor=${1:?usage: build.sh <kubernetes minor, e.g. 1.37> [node]}
with_node=${2:-}
[[ -z $with_node || $with_node == node ]] || { echo "build.sh: unknown second argument '$with_node' (allowed: node)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
kube_module=$here/k8s-$minor
[[ -f $kube_module/go.mod ]] || {
	echo "build.sh: no pinned module for Kubernetes $minor ($kube_module/go.mod); pinned: $(cd "$here" && ls -d k8s-* | tr '\n' ' ')" >&2
	exit 2
}
command -v go >/dev/null || {
	echo "build.sh: the go command is not on PATH; the real-cluster tests need Go (>= 1.24) to build Kubernetes $minor" >&2
	exit 1
}
# The go line of a module decides the toolchain; `auto` fetches a newer one
# from the proxy only when a pinned module's go line asks for it (e.g.
# GOTOOLCHAIN=go1.27.3 may be exported by the caller).
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} GOFLAGS=-mod=mod
# Static binaries, as Kubernetes' and etcd's own release builds make these
# commands (and no C compiler time).
export CGO_ENABLED=0

required_version() { # <module dir> <module path>
	sed -n "s#^[[:space:]]*$2 \(v[^ ]*\).*#\1#p" "$1/go.mod" | head -n1
}
kube_version=$(required_version "$kube_module" k8s.io/kubernetes)
etcd_version=$(required_version "$here/etcd" go.etcd.io/etcd/server/v3)
[[ -n $kube_version && -n $etcd_version ]] || { echo "build.sh: cannot read the pinned versions from the go.mod files" >&2; exit 1; }

cache=${GPU_DRA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}
mkdir -p "$cache"

# progress_every <seconds> <what>: a line on stderr every <seconds> until
# killed, so that a long silent `go build` (minutes on 2 cores) shows it
# is alive.
progress_every() {
	local every=$1 what=$2 began=$SECONDS
	# sleep holds no pipe of ours: killed, the ticker leaves nothing open.
	while sleep "$every" </dev/null >/dev/null 2>&1; do
		echo "build.sh: still $what ($((SECONDS - began)) s so far)" >&2
	done
}

# build_into <final dir> <module dir> <ldflags> <packages...>
# (build tags from $tags when set)
# (a package path ending in /vN builds a binary named after the element
# before it: etcd's server/v3 becomes "server", renamed "etcd" here)
build_into() {
	local final=$1 module=$2 ldflags=$3
	shift 3
	[[ -d $final ]] && return 0
	exec 9>"$final.lock"
	flock 9
	if [[ ! -d $final ]]; then
		local tmp
		tmp=$(mktemp -d "$final.building.XXXXXX")
		chmod 755 "$tmp"
		echo "build.sh: building $* into $final (once per machine and version; minutes on a small machine)" >&2
		local start=$SECONDS
		# Without the lock (9>&-): the ticker's sleep would hold it up to a
		# minute after the build, and every caller waiting on it.
		progress_every 60 "building $*" 9>&- &
		local ticker=$!
		(cd "$module" && go build -trimpath ${tags:+-tags "$tags"} -ldflags="-s -w $ldflags" -o "$tmp/" "$@") >&2 || {
			kill "$ticker" 2>/dev/null
			rm -rf "$tmp"
			echo "build.sh: building $* failed" >&2
			exit 1
		}
		kill "$ticker" 2>/dev/null
		[[ -e $tmp/server ]] && mv "$tmp/server" "$tmp/etcd"
		mv "$tmp" "$final"
		echo "build.sh: built $* in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	rm -f "$final.lock"
}

mkdir -p "$cache/kube/$kube_version" "$cache/etcd/$etcd_version"
# The version the binaries report (/version, and what clients such as the
# driver's compatibility check read), stamped as Kubernetes' own build does.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	major=${kube_version#v}; major=${major%%.*}
	stamp+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=${minor#*.} -X $pkg.gitTreeState=clean"
done
build_into "$cache/kube/$kube_version/bin" "$kube_module" "$stamp" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
build_into "$cache/etcd/$etcd_version/bin" "$here/etcd" "" go.etcd.io/etcd/server/v3

if [[ $with_node == node ]]; then source "$here/node.sh"; fi
echo "kube-bin-dir=$cache/kube/$kube_version/bin"
echo "etcd-bin-dir=$cache/etcd/$etcd_version/bin"
