#!/usr/bin/env bash
# Builds the Go side of the allocator comparison (this directory's module:
# k8s.io/dynamic-resource-allocation as the kube-scheduler runs it) into a
# cache outside the clone, keyed by a hash of its sources and the Go
# version:
#   $CACHE/go-allocator/<key>/go-allocator
# (CACHE = $GPU_DRA_KUBE_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver,
# the cache tests/kube-bins/build.sh uses). Built once per machine and
# source version; then this takes milliseconds. A build goes to a temporary
# directory renamed into place, under a lock, as kube-bins/build.sh does.
#
#   usage: build.sh
# On success the last line of stdout is
#   go-allocator-bin=<path>
# Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/go-build-lib.sh
. "$here/../go-build-lib.sh"
go_build_module "$here" go-allocator "the Go allocator comparison" "the Go allocator" \
	"once per machine and source version; about 2 min of CPU cold"
