#!/usr/bin/env bash
# Makes the image's root filesystem from Debian's packages, without a
# container engine and without running any package's maintainer scripts:
# each .deb is downloaded with apt-get (the version apt's lists name as
# candidate) and unpacked with dpkg-deb into a merged-/usr tree, as
# debian:bookworm-slim lays it out. What the maintainer scripts would have
# made and the driver needs is made here: the CA bundle, /etc/passwd and
# /etc/group with the image's user, /etc/nsswitch.conf, and dpkg's status
# file (so scanners see which Debian packages the image holds).
# Used by ./build.sh and by the Dockerfile, so both hold the same files.
#
#   usage: debian-root.sh <new root dir> [<.deb cache dir>]
#          debian-root.sh --versions      (prints package=version, one a line)
# Progress goes to stderr.
set -euo pipefail

# The C library and the unwinder the Rust binaries link (ldd), the CA
# bundle (the Dockerfile's ca-certificates), base-files (os-release, the
# directory skeleton, the licences), gcc-12-base (libgcc-s1's copyright).
# The programs the plugin runs (nvidia-smi, nvidia-cuda-mps-control,
# nvidia-imex, nvidia-imex-ctl) come from the node's driver root and need
# this C library's loader; nothing else is run.
PACKAGES=(base-files ca-certificates gcc-12-base libc6 libgcc-s1)

versions() { # prints <package>=<candidate version> for each package
	local package version
	for package in "${PACKAGES[@]}"; do
		version=$(apt-cache policy "$package" 2>/dev/null | sed -n 's/^ *Candidate: //p')
		if [[ -z $version || $version == "(none)" ]]; then
			return 1
		fi
		echo "$package=$version"
	done
}

# apt's lists are missing on a fresh machine or container (Debian's images
# ship none): fetch them once when we may.
ensure_lists() {
	versions >/dev/null && return 0
	[[ $(id -u) == 0 ]] || {
		echo "debian-root.sh: apt has no candidate for ${PACKAGES[*]}: run apt-get update (as root)" >&2
		exit 1
	}
	echo "debian-root.sh: apt-get update (apt knows no candidate for ${PACKAGES[*]})" >&2
	apt-get update >&2
	versions >/dev/null || { echo "debian-root.sh: apt still has no candidate for ${PACKAGES[*]}" >&2; exit 1; }
}

if [[ ${1:-} == --versions ]]; then
	ensure_lists
	versions
	exit 0
fi
root=${1:?usage: debian-root.sh <new root dir> [<.deb cache dir>]}
debs=${2:-}
[[ ! -e $root ]] || { echo "debian-root.sh: $root exists; give a new directory" >&2; exit 2; }
ensure_lists
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -n $debs ]] || debs=$work/debs
mkdir -p "$debs"

# The .debs, downloaded once into the cache (named by version, so a new
# point release downloads anew and an old file is never mistaken for it).
files=()
while IFS== read -r package version; do
	file=$debs/${package}_${version//:/%3a}.deb
	if [[ ! -s $file ]]; then
		echo "debian-root.sh: downloading $package $version" >&2
		mkdir -p "$work/download"
		# As root, apt drops to its _apt user and warns when that user
		# cannot write the directory; the download is the same.
		(cd "$work/download" && apt-get download -q -o APT::Sandbox::User=root "$package=$version") >&2
		# Renamed into place: a build running at once reads whole files.
		partial=$(mktemp "$file.XXXXXX")
		mv "$work/download/"*.deb "$partial"
		chmod 644 "$partial"
		mv "$partial" "$file"
		rm -rf "$work/download"
	fi
	files+=("$file")
done < <(versions)

# A merged /usr, as Debian 12 installs it: /bin, /sbin, /lib and /lib64
# are links into /usr, and the packages' files under them land there.
mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib" "$root/usr/lib64"
for dir in bin sbin lib lib64; do ln -s "usr/$dir" "$root/$dir"; done
for file in "${files[@]}"; do
	dpkg-deb --fsys-tarfile "$file" | tar -x --same-permissions --keep-directory-symlink --numeric-owner -C "$root"
done

# What debian:bookworm-slim leaves out of every package (its
# /etc/dpkg/dpkg.cfg.d/docker): documentation but the copyright files,
# manual pages, info, lintian's overrides, translations.
find "$root/usr/share/doc" -mindepth 1 \( -type f -o -type l \) ! -name copyright -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/lintian" "$root/usr/share/locale" "$root/usr/share/groff"
# libgcc-s1's documentation is a link to gcc-12-base's (kept above).
[[ -e $root/usr/share/doc/libgcc-s1 ]] || ln -s gcc-12-base "$root/usr/share/doc/libgcc-s1"

# ca-certificates' postinst: every certificate it ships enabled
# (/etc/ca-certificates.conf) and concatenated into the bundle TLS clients
# read, in update-ca-certificates' order and with its trailing newline.
(cd "$root/usr/share/ca-certificates" && find . -name '*.crt' | sed 's#^\./##' | LC_ALL=C sort) >"$work/certs"
[[ -s $work/certs ]] || { echo "debian-root.sh: ca-certificates shipped no certificate" >&2; exit 1; }
{
	echo "# Made by the gpu-dra-driver image's debian-root.sh: every certificate"
	echo "# of the ca-certificates package, as its postinst enables them."
	cat "$work/certs"
} >"$root/etc/ca-certificates.conf"
mkdir -p "$root/etc/ssl/certs"
while read -r cert; do
	sed -e '$a\' "$root/usr/share/ca-certificates/$cert"
done <"$work/certs" >"$root/etc/ssl/certs/ca-certificates.crt"

# base-passwd's and libc-bin's postinst, reduced to what the image needs:
# root, and the image's user (65532, "nonroot" as in distroless images);
# names resolved from files, hosts from files then DNS.
printf '%s\n' 'root:x:0:0:root:/root:/usr/sbin/nologin' 'nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$root/etc/group"
printf '%s\n' 'passwd: files' 'group: files' 'shadow: files' 'hosts: files dns' 'networks: files' \
	'protocols: files' 'services: files' 'ethers: files' 'rpc: files' >"$root/etc/nsswitch.conf"
chmod 644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf" "$root/etc/ca-certificates.conf" \
	"$root/etc/ssl/certs/ca-certificates.crt"

# dpkg's record of the installed packages (control fields + status).
mkdir -p "$root/var/lib/dpkg"
for file in "${files[@]}"; do
	dpkg-deb -f "$file" | sed '1a Status: install ok installed'
	echo
done >"$root/var/lib/dpkg/status"
chmod 644 "$root/var/lib/dpkg/status"
echo "debian-root.sh: made $root from $(versions | tr '\n' ' ')" >&2
