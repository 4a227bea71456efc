# shellcheck shell=bash
# What the Go helper modules' build.sh scripts share (go-allocator,
# nvidia-state, kube-bins/helm): each builds one static binary into the
# per-machine cache outside the clone, once, under a lock, in a temporary
# directory renamed into place. Sourced by those scripts, not run.

# The per-machine cache, the one tests/kube-bins/build.sh uses too.
go_build_cache=${GPU_DRA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-driver}

# go_build_setup WHO: fails unless go is on PATH, saying WHO needs it. The
# go line of go.mod decides the toolchain (`auto` fetches a newer one only
# if it asks for one); binaries are static, no C compiler needed.
go_build_setup() {
	command -v go >/dev/null || {
		echo "build.sh: the go command is not on PATH; $1 needs Go (>= 1.26)" >&2
		exit 1
	}
	export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} CGO_ENABLED=0
}

# go_source_key DIR: a hash of DIR's module sources and the Go version, so
# that a change to either builds anew.
go_source_key() {
	(cd "$1" && cat go.mod go.sum ./*.go && go env GOVERSION) | sha256sum | cut -c1-16
}

# go_build_cached DIR FINAL BIN NAME COST GO-BUILD-ARGS...: unless FINAL/BIN
# is there, builds it with `go build GO-BUILD-ARGS` in DIR (NAME and COST
# for the progress lines). The lock (fd 9 on FINAL.lock) makes concurrent
# callers wait for one build instead of racing it.
go_build_cached() {
	local dir=$1 final=$2 bin=$3 name=$4 cost=$5
	shift 5
	mkdir -p "$(dirname "$final")"
	[[ -x $final/$bin ]] && return 0
	exec 9>"$final.lock"
	flock 9
	if [[ ! -x $final/$bin ]]; then
		local tmp start
		tmp=$(mktemp -d "$final.building.XXXXXX")
		chmod 755 "$tmp"
		echo "build.sh: building $name ($dir) into $final ($cost)" >&2
		start=$SECONDS
		# A line a minute while go builds (silent for minutes on 2 cores).
		# Without the lock (9>&-): its sleep would hold the lock up to a
		# minute after the build, and every waiting caller with it.
		(while sleep 60 </dev/null >/dev/null 2>&1; do echo "build.sh: still building $name ($((SECONDS - start)) s so far)" >&2; done) 9>&- &
		go_build_ticker=$!
		trap 'kill "$go_build_ticker" 2>/dev/null' EXIT
		(cd "$dir" && go build -mod=readonly -trimpath -o "$tmp/$bin" "$@") >&2 || {
			rm -rf "$tmp"
			echo "build.sh: building $name failed" >&2
			exit 1
		}
		rm -rf "$final"
		mv "$tmp" "$final"
		echo "build.sh: built $name in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	rm -f "$final.lock"
}

# go_build_module DIR BIN WHO NAME COST: the common case, binary BIN of the
# module in DIR (its main package at the root), keyed by its sources, in
# $go_build_cache/BIN/<key>; prints `BIN-bin=<path>` last.
go_build_module() {
	local dir=$1 bin=$2 who=$3 name=$4 cost=$5 final
	go_build_setup "$who"
	final=$go_build_cache/$bin/$(go_source_key "$dir")
	go_build_cached "$dir" "$final" "$bin" "$name" "$cost" -ldflags="-s -w" .
	echo "$bin-bin=$final/$bin"
}
