#!/usr/bin/env bash
# Builds the real helm CLI (Helm v4's main package, pinned in this
# directory's go.mod) into the per-machine cache the Kubernetes binaries use,
# keyed by Helm's version:
#   $CACHE/helm/<helm version>/bin/helm
# (CACHE = $GPU_DRA_KUBE_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver).
# A version already in the cache is not rebuilt; a build goes to a temporary
# directory renamed into place, under a lock, as ../build.sh does.
#
#   usage: build.sh
# On success the last line of stdout is
#   helm-bin=<path>
# Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v go >/dev/null || {
	echo "build.sh: the go command is not on PATH; building helm needs Go (>= 1.26)" >&2
	exit 1
}
# The go line of go.mod decides the toolchain (`auto` fetches a newer one
# only if it asks for one). A static binary, as Helm's release is built.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} CGO_ENABLED=0

version=$(sed -n 's#^[[:space:]]*helm.sh/helm/v4 \(v[^ ]*\).*#\1#p' "$here/go.mod" | head -n1)
[[ -n $version ]] || { echo "build.sh: cannot read Helm's pinned version from $here/go.mod" >&2; exit 1; }
cache=${GPU_DRA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}
final=$cache/helm/$version/bin
mkdir -p "$cache/helm/$version"
if [[ ! -x $final/helm ]]; then
	exec 9>"$final.lock"
	flock 9
	if [[ ! -x $final/helm ]]; then
		tmp=$(mktemp -d "$final.building.XXXXXX")
		chmod 755 "$tmp"
		echo "build.sh: building helm $version into $final (once per machine and version; minutes on a small machine)" >&2
		start=$SECONDS
		# The version stamp of Helm's own release build (its Makefile):
		# `helm version` says which Helm rendered the chart.
		ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
		(cd "$here" && go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm) >&2 || {
			rm -rf "$tmp"
			echo "build.sh: building helm $version failed" >&2
			exit 1
		}
		rm -rf "$final"
		mv "$tmp" "$final"
		echo "build.sh: built helm $version in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	rm -f "$final.lock"
fi
echo "helm-bin=$final/helm"
