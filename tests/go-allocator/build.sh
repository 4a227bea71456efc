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
command -v go >/dev/null || {
	echo "build.sh: the go command is not on PATH; the Go allocator comparison needs Go (>= 1.26)" >&2
	exit 1
}
# The go line of go.mod decides the toolchain (`auto` fetches a newer one
# only if it asks for one). A static binary, no C compiler needed.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} CGO_ENABLED=0

key=$( (cd "$here" && cat go.mod go.sum ./*.go && go env GOVERSION) | sha256sum | cut -c1-16)
cache=${GPU_DRA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}
final=$cache/go-allocator/$key
mkdir -p "$cache/go-allocator"
if [[ ! -x $final/go-allocator ]]; then
	exec 9>"$final.lock"
	flock 9
	if [[ ! -x $final/go-allocator ]]; then
		tmp=$(mktemp -d "$final.building.XXXXXX")
		chmod 755 "$tmp"
		echo "build.sh: building the Go allocator ($here) into $final (once per machine and source version; about 2 min of CPU cold)" >&2
		start=$SECONDS
		# A line a minute while go builds (silent for minutes on 2 cores).
		# Without the lock (9>&-): its sleep would hold the lock up to a
		# minute after the build, and every waiting caller with it.
		(while sleep 60 </dev/null >/dev/null 2>&1; do echo "build.sh: still building the Go allocator ($((SECONDS - start)) s so far)" >&2; done) 9>&- &
		ticker=$!
		trap 'kill "$ticker" 2>/dev/null' EXIT
		(cd "$here" && go build -mod=readonly -trimpath -ldflags="-s -w" -o "$tmp/go-allocator" .) >&2 || {
			rm -rf "$tmp"
			echo "build.sh: building the Go allocator failed" >&2
			exit 1
		}
		rm -rf "$final"
		mv "$tmp" "$final"
		echo "build.sh: built the Go allocator in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	rm -f "$final.lock"
fi
echo "go-allocator-bin=$final/go-allocator"
