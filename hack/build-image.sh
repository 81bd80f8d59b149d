#!/usr/bin/env bash
# Builds the product image from the Dockerfile and the CSI sidecar images
# with buildah (no Docker engine, no registry), and writes each as an archive
# `ctr -n k8s.io images import` takes under the image's full name.
#
#   hack/build-image.sh                  oxhorn built in the Dockerfile's build stage
#   hack/build-image.sh --binary FILE    oxhorn as FILE, built on this host
#
# With --binary, the product image is the Dockerfile's runtime stage with
# FILE (a `cargo build --release --locked --bin oxhorn` of this Debian
# release) copied in, its debug sections compressed as the build stage does;
# hack/local-cluster.sh and hack/test.sh build oxhorn once so, for the host
# and the image. The build stage and its Rust image are then not needed.
#
# The Dockerfile's base images (debian:bookworm-slim, rust:1.95-bookworm) are
# made locally when buildah's storage lacks them: the first with mmdebstrap,
# the second from it plus a C toolchain and the host's Rust 1.95.0 (rustup).
# The Dockerfile itself stays as it is, buildable with a registry elsewhere.
# The build keeps cargo's registry and target directory in cache mounts, so
# a rebuild after a source change is incremental. Each sidecar image is the
# Debian base with the binary hack/install-deps.sh built as its
# entrypoint. Image names come from deploy/images.env.
#
# Every step is skipped when its result is already there: a base image that
# exists, a sidecar image whose binary has not changed, an archive of the
# image as it is; so a second run only checks. What earlier runs left in
# buildah's storage that no image uses any more is removed.
#
#   OXHORN_CACHE      where hack/install-deps.sh put the sidecar
#                     binaries (default: ~/.cache/oxhorn)
#   OXHORN_IMAGE_DIR  where the archives go (default: $OXHORN_CACHE/images),
#                     one <short name>.tar per image: oxhorn.tar,
#                     csi-provisioner.tar, ...
#
# Needs root (buildah's storage, mmdebstrap). Logs go to stderr, each long
# step with its time; prints the archive directory as its last line.
set -euo pipefail

RUST_TOOLCHAIN=1.95.0
DEBIAN_SUITE=bookworm
# Local stand-ins for the registry's images of the same names, made because no
# registry is reachable here; the Dockerfile names them in their short form.
DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
RUST_IMAGE=docker.io/library/rust:${RUST_TOOLCHAIN%.*}-bookworm
# The Dockerfile's build stage, kept as the cache of the next build.
BUILD_CACHE_IMAGE=localhost/oxhorn-build:cache
# The Dockerfile's runtime stage, the base of the image --binary makes.
RUNTIME_IMAGE=localhost/oxhorn-runtime:cache

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
cache=${OXHORN_CACHE:-${HOME}/.cache/oxhorn}
bin=$cache/bin
out=${OXHORN_IMAGE_DIR:-$cache/images}

log_name=build-image
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
die() { log "$*"; exit 1; }

binary=
case ${1:-} in
'') ;;
--binary)
	if ! { [ $# -eq 2 ] && [ -f "$2" ] && [ -x "$2" ]; }; then
		die "--binary needs an executable file, not '${2:-}'"
	fi
	binary=$2
	;;
*) die "usage: $0 [--binary FILE]" ;;
esac

# shellcheck source-path=SCRIPTDIR source=../deploy/images.env
. "$root/deploy/images.env"
# The sidecars: variable of deploy/images.env naming the image, and binary
# (the image's short name).
sidecars=(
	CSI_PROVISIONER_IMAGE:csi-provisioner
	CSI_ATTACHER_IMAGE:csi-attacher
	CSI_RESIZER_IMAGE:csi-resizer
	CSI_SNAPSHOTTER_IMAGE:csi-snapshotter
	SNAPSHOT_CONTROLLER_IMAGE:snapshot-controller
)

[ "$(id -u)" = 0 ] || die "needs root (buildah's storage, mmdebstrap)"
for tool in buildah mmdebstrap mmtarfilter objcopy; do
	command -v "$tool" >/dev/null || die "$tool is missing: run hack/install-deps.sh"
done

# The working container of the moment, removed at exit however it ends.
container=
scratch=$(mktemp -d "${TMPDIR:-/tmp}/oxhorn-build-image.XXXXXX")
cleanup() {
	if [ -n "$container" ]; then
		buildah umount "$container" >/dev/null 2>&1 || true
		buildah rm "$container" >/dev/null 2>&1 || true
	fi
	rm -rf "$scratch"
}
trap cleanup EXIT

# new_container IMAGE: a working container of IMAGE in $container.
new_container() { container=$(buildah from --quiet --pull=false "$1"); }
# commit IMAGE: commits $container as IMAGE and removes it.
commit() {
	buildah commit --quiet --rm "$container" "$1" >/dev/null
	container=
}

image_id() { buildah inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null; }
label() { # IMAGE KEY
	buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null
}

# The Debian base: minbase, without documentation, man pages or locales,
# configured as the registry's image is (apt's downloaded packages and
# binary caches removed after each run, no translations, no services
# started by package scripts); /dev, the host name and resolv.conf are the
# container runtime's.
make_debian() {
	image_id "$DEBIAN_IMAGE" >/dev/null && return
	log "making $DEBIAN_IMAGE with mmdebstrap (a local stand-in, a minute or two)"
	local mirror=http://deb.debian.org/debian mnt start=$SECONDS
	# merged-usr: /usr merged by mmdebstrap itself, not by usrmerge (which
	# would bring perl).
	if ! mmdebstrap --quiet --variant=minbase \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/groff/*' \
		--dpkgopt='path-exclude=/usr/share/lintian/*' \
		--dpkgopt='path-exclude=/usr/share/linda/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-include=/usr/share/locale/locale.alias' \
		--aptopt='Acquire::Languages "none"' \
		--aptopt='APT::AutoRemove::SuggestsImportant "false"' \
		--aptopt='Dir::Cache::pkgcache ""' \
		--aptopt='Dir::Cache::srcpkgcache ""' \
		--aptopt='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; }' \
		--aptopt='APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; }' \
		"$DEBIAN_SUITE" - \
		"deb $mirror $DEBIAN_SUITE main" \
		"deb $mirror $DEBIAN_SUITE-updates main" \
		"deb $mirror-security $DEBIAN_SUITE-security main" 2>"$scratch/mmdebstrap.log" |
		mmtarfilter --path-exclude='/dev/*' --path-exclude=/etc/hostname \
			--path-exclude=/etc/resolv.conf >"$scratch/debian.tar"; then
		cat "$scratch/mmdebstrap.log" >&2
		die "mmdebstrap failed"
	fi
	new_container scratch
	mnt=$(buildah mount "$container")
	tar -C "$mnt" --numeric-owner --xattrs --xattrs-include='*' -xpf "$scratch/debian.tar"
	printf '#!/bin/sh\n# Package scripts start no services in a container.\nexit 101\n' \
		>"$mnt/usr/sbin/policy-rc.d"
	chmod 755 "$mnt/usr/sbin/policy-rc.d"
	buildah umount "$container" >/dev/null
	rm -f "$scratch/debian.tar"
	buildah config \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--cmd bash \
		--label io.oxhorn.stand-in="mmdebstrap $DEBIAN_SUITE minbase, by hack/build-image.sh" \
		"$container"
	commit "$DEBIAN_IMAGE"
	log "done in $(elapsed "$start"): making $DEBIAN_IMAGE"
}

# The Rust build image: the Debian base, what the registry's image has for
# building crates (gcc, libc headers, make, pkg-config, git, CA
# certificates, with the host's local CAs), and the host's Rust toolchain
# under /usr/local as there:
# RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=/usr/local/cargo, rustup and its
# proxies (cargo, rustc, ...) in /usr/local/cargo/bin. No documentation.
make_rust() {
	image_id "$RUST_IMAGE" >/dev/null && return
	command -v rustup >/dev/null || die "rustup is missing: it provides the Rust toolchain to copy"
	local cargo toolchain name mnt proxy start=$SECONDS
	if ! cargo=$(rustup which cargo --toolchain "$RUST_TOOLCHAIN" 2>/dev/null); then
		log "rustup toolchain install $RUST_TOOLCHAIN"
		rustup toolchain install --profile minimal "$RUST_TOOLCHAIN" >&2
		cargo=$(rustup which cargo --toolchain "$RUST_TOOLCHAIN")
	fi
	toolchain=$(dirname "$(dirname "$cargo")")
	name=$(basename "$toolchain")
	log "making $RUST_IMAGE from $DEBIAN_IMAGE and the host's $name (a local stand-in, about a minute)"
	new_container "$DEBIAN_IMAGE"
	# The host's own CAs, trusted here as on the host: the build downloads
	# crates over HTTPS from this network, which may intercept TLS. Only
	# this builder has them, not the product image.
	if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
		buildah copy --quiet "$container" /usr/local/share/ca-certificates/ \
			/usr/local/share/ca-certificates/ >/dev/null
	fi
	buildah run --network host "$container" -- sh -ec '
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			ca-certificates gcc libc6-dev make pkg-config git >/dev/null
		rm -rf /var/lib/apt/lists/*' >&2
	mnt=$(buildah mount "$container")
	mkdir -p "$mnt/usr/local/rustup/toolchains/$name" "$mnt/usr/local/cargo/bin"
	tar -C "$toolchain" --exclude=./share/doc --exclude=./lib/rustlib/src \
		--exclude='./lib/rustlib/manifest-rust-docs-*' --exclude='./lib/rustlib/manifest-rust-src' -cf - . |
		tar -C "$mnt/usr/local/rustup/toolchains/$name" --no-same-owner -xf -
	sed -i '/^rust-docs-\|^rust-src$/d' "$mnt/usr/local/rustup/toolchains/$name/lib/rustlib/components"
	printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n\n[overrides]\n' "$name" \
		>"$mnt/usr/local/rustup/settings.toml"
	install -m 755 "$(readlink -f "$(command -v rustup)")" "$mnt/usr/local/cargo/bin/rustup"
	for proxy in "$toolchain"/bin/*; do
		ln -s rustup "$mnt/usr/local/cargo/bin/$(basename "$proxy")"
	done
	buildah umount "$container" >/dev/null
	buildah config \
		--env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
		--env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--env RUST_VERSION="$RUST_TOOLCHAIN" \
		--label io.oxhorn.stand-in="$DEBIAN_IMAGE with the host's $name, by hack/build-image.sh" \
		"$container"
	commit "$RUST_IMAGE"
	log "done in $(elapsed "$start"): making $RUST_IMAGE"
}

# The base images the Dockerfile names must be the ones made here: anything
# else would be pulled from a registry this machine cannot reach.
check_dockerfile_bases() {
	local from want=" $DEBIAN_IMAGE $RUST_IMAGE "
	while read -r from; do
		case $from in */*) ;; *) from=docker.io/library/$from ;; esac
		[[ $want == *" $from "* ]] ||
			die "the Dockerfile's base $from is none of those made here ($want): update RUST_TOOLCHAIN or DEBIAN_SUITE"
	done < <(awk 'toupper($1) == "FROM" && !($2 in stage) { print $2 } toupper($3) == "AS" { stage[$4] }' "$root/Dockerfile")
}

# The product image, from the Dockerfile. --layers keeps each step's result,
# so an unchanged context builds nothing; --network host lets apt and cargo
# download without a CNI network. The build stage is tagged too
# ($BUILD_CACHE_IMAGE): its last step is then no dangling image for
# prune_stale, and a rebuild of an unchanged context finds it.
build_oxhorn() {
	local bud=(buildah bud --quiet --layers --pull=false --network host -f "$root/Dockerfile")
	timed "buildah bud $OXHORN_IMAGE (cold: about 11 min, its cargo build; unchanged: seconds)" \
		"${bud[@]}" -t "$OXHORN_IMAGE" "$root" >&2
	"${bud[@]}" --target build -t "$BUILD_CACHE_IMAGE" "$root" >/dev/null
}

# build_oxhorn_from FILE: the product image as the Dockerfile's runtime
# stage ($RUNTIME_IMAGE, built from an empty context: the stage copies
# nothing in) with FILE as /usr/local/bin/oxhorn, its debug sections
# compressed (a third the size) as in the build stage.
build_oxhorn_from() {
	local file=$1 context=$scratch/context
	mkdir -p "$context"
	timed "buildah bud --target runtime (the Dockerfile's runtime stage: about 20 s when new)" \
		buildah bud --quiet --layers --pull=false --network host -f "$root/Dockerfile" \
		--target runtime -t "$RUNTIME_IMAGE" "$context" >/dev/null
	up_to_date "$OXHORN_IMAGE" "$RUNTIME_IMAGE" "$file" && return
	log "building $OXHORN_IMAGE from $file"
	objcopy --compress-debug-sections=zlib "$file" "$scratch/oxhorn"
	add_binary "$OXHORN_IMAGE" "$RUNTIME_IMAGE" "$file" "$scratch/oxhorn" /usr/local/bin/oxhorn
}

# up_to_date IMAGE BASE FILE: true when IMAGE was made by add_binary from
# BASE and FILE as they are now (its labels say).
up_to_date() {
	[ "$(label "$1" io.oxhorn.binary-sha256 || true)" = "$(sha256sum <"$3" | cut -d' ' -f1)" ] &&
		[ "$(label "$1" io.oxhorn.base || true)" = "$(image_id "$2")" ]
}

# add_binary IMAGE BASE FILE COPY PATH [entrypoint]: IMAGE as BASE with COPY
# (FILE, or what was made of it) at PATH, labelled for up_to_date; with
# "entrypoint", PATH is its entrypoint, with no command (no argument but
# the pod's).
add_binary() {
	local image=$1 base=$2 file=$3 copy=$4 path=$5
	new_container "$base"
	buildah copy --quiet --chmod 0755 "$container" "$copy" "$path" >/dev/null
	if [ "${6:-}" = entrypoint ]; then
		# The base's command cleared first, or buildah warns that it
		# would be the entrypoint's argument.
		buildah config --cmd '' "$container"
		buildah config --entrypoint "[\"$path\"]" "$container"
	fi
	buildah config \
		--label io.oxhorn.binary-sha256="$(sha256sum <"$file" | cut -d' ' -f1)" \
		--label io.oxhorn.base="$(image_id "$base")" \
		"$container"
	commit "$image"
}

# sidecar IMAGE BINARY: IMAGE as the Debian base with $bin/BINARY as
# /BINARY, its entrypoint (as the upstream images have it); rebuilt when the
# binary or the base changed.
build_sidecar() {
	local image=$1 binary=$2
	[ -x "$bin/$binary" ] || die "$bin/$binary is missing: run hack/install-deps.sh"
	up_to_date "$image" "$DEBIAN_IMAGE" "$bin/$binary" && return
	log "building $image from $bin/$binary"
	add_binary "$image" "$DEBIAN_IMAGE" "$bin/$binary" "$bin/$binary" "/$binary" entrypoint
}

# prune_stale: removes what earlier builds left that no image uses any more
# (an image its rebuild replaced, the steps of a build of an earlier
# context): the dangling images derived from the stand-ins (other images
# of the store are left alone), each round making their parents dangling in
# turn.
prune_stale() {
	local ids
	while ids=$(buildah images --all --quiet --no-trunc \
		--filter dangling=true --filter label=io.oxhorn.stand-in) && [ -n "$ids" ]; do
		# shellcheck disable=SC2086 # one ID a line
		buildah rmi $ids >/dev/null || break
	done
}

# archive_of FILE: the image ID (its config's digest) and the name an
# oci-archive FILE holds.
archive_of() {
	local index manifest
	index=$(tar -xOf "$1" index.json 2>/dev/null) || return 0
	manifest=$(grep -m1 -o '"digest":"sha256:[0-9a-f]*"' <<<"$index" | cut -d'"' -f4)
	printf '%s %s\n' \
		"$(tar -xOf "$1" "blobs/sha256/${manifest#sha256:}" 2>/dev/null |
			grep -o '"config":{[^}]*}' | grep -o 'sha256:[0-9a-f]*')" \
		"$(grep -o '"org.opencontainers.image.ref.name":"[^"]*"' <<<"$index" | cut -d'"' -f4)"
}

# export_image IMAGE SHORT: $out/SHORT.tar, an oci-archive of IMAGE whose
# reference is IMAGE in full (ctr imports it under that name; a bare tag
# would become import-<date>:<tag>), written when it does not hold the image
# as it is. Its layers are compressed: a third of a docker-archive's size,
# and ctr imports it as fast.
export_image() {
	local image=$1 file=$out/$2.tar id
	id=$(image_id "$image")
	[ -f "$file" ] && [ "$(archive_of "$file")" = "sha256:${id#sha256:} $image" ] && return
	# Not *.tar until complete: readers take every *.tar of the directory.
	rm -f "$out/.$2.tar.partial"
	timed "writing $file (seconds)" \
		buildah push --quiet "$image" "oci-archive:$out/.$2.tar.partial:$image" >&2
	mv -f "$out/.$2.tar.partial" "$file"
}

check_dockerfile_bases
make_debian
if [ -n "$binary" ]; then
	build_oxhorn_from "$binary"
else
	make_rust
	build_oxhorn
fi
mkdir -p "$out"
export_image "$OXHORN_IMAGE" oxhorn
for sidecar in "${sidecars[@]}"; do
	var=${sidecar%%:*}
	build_sidecar "${!var}" "${sidecar#*:}"
	export_image "${!var}" "${sidecar#*:}"
done
prune_stale
log "images ready in $out"
echo "$out"
