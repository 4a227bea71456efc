#!/usr/bin/env bash
# Builds the generator of NVIDIA's kubelet-plugin state (this directory's
# module: checkpoint files and CDI specs as kubernetes-sigs/
# dra-driver-nvidia-gpu's releases wrote them, see main.go) into a cache
# outside the clone, keyed by a hash of its sources and the Go version:
#   $CACHE/nvidia-state/<key>/nvidia-state
# (CACHE = $GPU_DRA_KUBE_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver,
# the cache tests/kube-bins/build.sh uses). Built once per machine and
# source version; then this takes milliseconds. A build goes to a temporary
# directory renamed into place, under a lock, as kube-bins/build.sh does.
#
#   usage: build.sh
# On success the last line of stdout is
#   nvidia-state-bin=<path>
# Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/go-build-lib.sh
. "$here/../go-build-lib.sh"
go_build_module "$here" nvidia-state "the NVIDIA state generator" "the NVIDIA state generator" \
	"once per machine and source version; about 80 s of CPU cold"
