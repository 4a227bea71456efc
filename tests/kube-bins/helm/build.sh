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
# shellcheck source=tests/go-build-lib.sh
. "$here/../../go-build-lib.sh"
go_build_setup "building helm"
version=$(sed -n 's#^[[:space:]]*helm.sh/helm/v4 \(v[^ ]*\).*#\1#p' "$here/go.mod" | head -n1)
[[ -n $version ]] || { echo "build.sh: cannot read Helm's pinned version from $here/go.mod" >&2; exit 1; }
final=$go_build_cache/helm/$version/bin
# The version stamp of Helm's own release build (its Makefile): `helm
# version` says which Helm rendered the chart.
go_build_cached "$here" "$final" helm "helm $version" "once per machine and version; minutes on a small machine" \
	-ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
	helm.sh/helm/v4/cmd/helm
echo "helm-bin=$final/helm"
