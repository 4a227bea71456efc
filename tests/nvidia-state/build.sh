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
command -v go >/dev/null || {
	echo "build.sh: the go command is not on PATH; the NVIDIA state generator needs Go (>= 1.26)" >&2
	exit 1
}
# The go line of go.mod decides the toolchain (`auto` fetches a newer one
# only if it asks for one). A static binary, no C compiler needed.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} CGO_ENABLED=0

key=$( (cd "$here" && cat go.mod go.sum ./*.go && go env GOVERSION) | sha256sum | cut -c1-16)
cache=${GPU_DRA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}
final=$cache/nvidia-state/$key
mkdir -p "$cache/nvidia-state"
if [[ ! -x $final/nvidia-state ]]; then
	exec 9>"$final.lock"
	flock 9
	if [[ ! -x $final/nvidia-state ]]; then
		tmp=$(mktemp -d "$final.building.XXXXXX")
		chmod 755 "$tmp"
		echo "build.sh: building the NVIDIA state generator ($here) into $final (once per machine and source version; about 80 s of CPU cold)" >&2
		start=$SECONDS
		# A line a minute while go builds (silent for minutes on 2 cores).
		# Without the lock's fd 9: a sleep holding it would keep the other
		# builders waiting for up to a minute after this one is done.
		(while sleep 60 </dev/null >/dev/null 2>&1; do echo "build.sh: still building the NVIDIA state generator ($((SECONDS - start)) s so far)" >&2; done) 9>&- &
		ticker=$!
		trap 'kill "$ticker" 2>/dev/null' EXIT
		(cd "$here" && go build -mod=readonly -trimpath -ldflags="-s -w" -o "$tmp/nvidia-state" .) >&2 || {
			rm -rf "$tmp"
			echo "build.sh: building the NVIDIA state generator failed" >&2
			exit 1
		}
		rm -rf "$final"
		mv "$tmp" "$final"
		echo "build.sh: built the NVIDIA state generator in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	rm -f "$final.lock"
fi
echo "nvidia-state-bin=$final/nvidia-state"
