# The pieces of one real node, sourced by build.sh with `node` (it defines
# build_into, $cache, $kube_module, $kube_version and $stamp). Prints
#   kubelet-bin-dir=<dir>      the release's kubelet
#   containerd-bin-dir=<dir>   containerd, containerd-shim-runc-v2, ctr
#   runc=<file>                Debian's runc
#   node-images=<file>         OCI archive: the pause and test images
# Each is made once per machine and version, as the control plane is.

# runc and busybox-static come from Debian. A fresh machine (CI) lacks
# them: install them when we may (root with apt-get), else say what to do.
missing=()
command -v runc >/dev/null || missing+=(runc)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing+=(busybox-static)
if ((${#missing[@]})); then
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
		echo "build.sh: installing ${missing[*]} from Debian (apt-get)" >&2
		apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
			{ apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
	else
		echo "build.sh: the real node needs ${missing[*]}: apt-get install ${missing[*]} (as root)" >&2
		exit 1
	fi
fi

# The kubelet, from the same pinned module as the control plane.
mkdir -p "$cache/kubelet/$kube_version"
build_into "$cache/kubelet/$kube_version/bin" "$kube_module" "$stamp" k8s.io/kubernetes/cmd/kubelet

# containerd as its static release is built (no cgo: no btrfs snapshotter,
# which the tests do not use).
containerd_version=$(required_version "$here/containerd" github.com/containerd/containerd/v2)
[[ -n $containerd_version ]] || { echo "build.sh: cannot read containerd's pinned version" >&2; exit 1; }
mkdir -p "$cache/containerd/$containerd_version"
tags="urfave_cli_no_docs osusergo netgo static_build" build_into "$cache/containerd/$containerd_version/bin" \
	"$here/containerd" "-X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
	github.com/containerd/containerd/v2/cmd/containerd \
	github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	github.com/containerd/containerd/v2/cmd/ctr

# Two images in one OCI archive, sharing one layer (busybox and its
# applets): the pod sandbox's ("pause": a shell that sleeps until SIGTERM)
# and the test containers' (a shell). No registry is needed:
# `ctr -n k8s.io images import` reads the archive; the manifests carry the
# names containerd gives the images (io.containerd.image.name).
busybox_version=$(dpkg-query -W -f='${Version}' busybox-static | tr ':~+' '___')
images=$cache/images/busybox-$busybox_version
if [[ ! -d $images ]]; then
	mkdir -p "$cache/images"
	tmp=$(mktemp -d "$images.building.XXXXXX")
	(
		set -euo pipefail
		cd "$tmp"
		mkdir -p rootfs/bin rootfs/etc rootfs/tmp rootfs/proc rootfs/sys rootfs/dev layout/blobs/sha256
		cp /bin/busybox rootfs/bin/busybox
		for applet in $(rootfs/bin/busybox --list); do
			[[ $applet == busybox ]] || ln -s busybox "rootfs/bin/$applet"
		done
		# Reproducible: fixed order, owner and times, so the digests only
		# change with busybox.
		tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C rootfs -cf layer.tar .
		blob() { # <file> -> prints sha256:<hex>, and stores the blob
			local sum
			sum=$(sha256sum "$1" | cut -d' ' -f1)
			cp "$1" "layout/blobs/sha256/$sum"
			echo "sha256:$sum"
		}
		size() { stat -c %s "$1"; }
		layer=$(blob layer.tar)
		manifest_entry() { # <name> <entrypoint JSON>
			printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Entrypoint":%s},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
				"$2" "$layer" >config.json
			local config
			config=$(blob config.json)
			printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
				"$config" "$(size config.json)" "$layer" "$(size layer.tar)" >manifest.json
			local manifest
			manifest=$(blob manifest.json)
			printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
				"$manifest" "$(size manifest.json)" "$1" "${1##*:}"
		}
		pause=$(manifest_entry localhost/gpu-dra-driver/pause:busybox \
			'["/bin/sh","-c","trap \"exit 0\" TERM INT; while true; do sleep 1 & wait $!; done"]')
		shell=$(manifest_entry localhost/gpu-dra-driver/busybox:test '["/bin/sh"]')
		printf '{"imageLayoutVersion":"1.0.0"}' >layout/oci-layout
		printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s,%s]}' \
			"$pause" "$shell" >layout/index.json
		tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C layout -cf images.tar .
		mkdir out && mv images.tar out/ && rm -rf rootfs layout layer.tar config.json manifest.json
	) || { rm -rf "$tmp"; echo "build.sh: making the node's images failed" >&2; exit 1; }
	# -T: a concurrent build that finished first keeps its (identical) copy.
	mv -T "$tmp/out" "$images" 2>/dev/null || true
	rm -rf "$tmp"
	echo "build.sh: made the pause and test images in $images/images.tar" >&2
fi

echo "kubelet-bin-dir=$cache/kubelet/$kube_version/bin"
echo "containerd-bin-dir=$cache/containerd/$containerd_version/bin"
echo "runc=$(command -v runc)"
echo "node-images=$images/images.tar"
