#!/usr/bin/env bash
# Installs everything the build and the tests need, idempotently.
#
# Debian packages go through apt; hack/iscsi-pattern.c is compiled; Go programs (kube-apiserver, kubelet,
# kube-scheduler, kube-controller-manager, kubectl, csi-sanity, the CSI sidecars and
# snapshot-controller) are built from the Go module proxy into a cache
# directory and stamped with their version, so a second run does nothing. The VolumeSnapshot CRDs go to $cache/crds/snapshot.
# cargo-afl (the fuzzer of hack/fuzz.sh) is installed with `cargo install`
# into the same bin directory, and its AFL++ runtime built under
# $cache/share (its XDG data directory; hack/fuzz.sh sets the same).
# The object-store emulators: MinIO (S3) built from the Go module proxy, and
# Azurite (Azure Blob) from npm under $cache/azurite, run as $bin/azurite-blob
# with Node.js (Debian's nodejs and npm where the machine has no npm).
#
#   OXHORN_CACHE  where built tools live (default: ~/.cache/oxhorn)
#
# Prints the bin directory holding the tools as its last line.
set -euo pipefail

KUBE_VERSION=v1.35.4
CSI_TEST_VERSION=v5.4.0
# external-provisioner v6.4.0 needs a sig-storage-lib-external-provisioner
# version the proxy does not have.
PROVISIONER_VERSION=v6.3.0
ATTACHER_VERSION=v4.13.0
RESIZER_VERSION=v2.3.0
SNAPSHOTTER_VERSION=v8.7.0
CARGO_AFL_VERSION=0.18.2
# MinIO tags no semver releases and its repository was archived in February
# 2026: this is the pseudo-version of its last commit.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
# The last Azurite whose engines field admits Node.js 18, Debian 12's
# (3.36.0 wants 21, 3.37.0 22).
AZURITE_VERSION=3.35.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${OXHORN_CACHE:-${HOME}/.cache/oxhorn}
bin=$cache/bin
mkdir -p "$bin"

log() { printf '[install-test-deps] %s\n' "$*" >&2; }

apt_packages=(
	etcd-server        # the control plane's store
	protobuf-compiler  # protoc, for tonic-prost-build
	libprotobuf-dev    # google/protobuf/*.proto includes
	libclang-dev       # bindgen users among the crates
	pkg-config
	e2fsprogs xfsprogs util-linux
	fuse3              # fusermount3, for the FUSE frontend
	fio                # bench/
	iproute2           # ip, bridge: the partition tests' namespaces and bridges
	containerd runc    # the test bed's real kubelet nodes run pods with these
	containernetworking-plugins  # a CNI configuration containerd accepts
	busybox-static umoci         # the test images, built locally
	buildah mmdebstrap           # hack/build-image.sh: the product and sidecar images, and their Debian base
	libiscsi-bin tgt             # tests/it/iscsi and bench/: libiscsi's conformance suite and tools, and tgtd to compare with
	libiscsi-dev gcc libc6-dev   # hack/iscsi-pattern.c, the iSCSI integrity tests' client
	nfs-ganesha nfs-ganesha-vfs rpcbind  # tests/it/backup_nfs: an NFSv3 server in userspace (no kernel nfsd here)
)
# Node.js and npm for Azurite. A machine with an npm already keeps its own:
# NodeSource's nodejs package, for one, conflicts with Debian's npm.
command -v npm >/dev/null 2>&1 || apt_packages+=(nodejs npm)

install_apt() {
	local missing=()
	for p in "${apt_packages[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return
	log "apt: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Debian's etcd-server starts a system etcd on :2379; tests run their own.
quiet_system_etcd() {
	if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
		systemctl disable --now etcd >/dev/null 2>&1 || true
	fi
	ln -sf "$(command -v etcd)" "$bin/etcd"
}

# stamped NAME VERSION: true when NAME at VERSION is already built.
stamped() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" >"$bin/.$1.version"; }

build_kube() {
	local ver=${KUBE_VERSION#v} ldflags
	ldflags="-s -w"
	for kv in gitVersion=$KUBE_VERSION gitMajor=${ver%%.*} gitMinor=$(echo "$ver" | cut -d. -f2) \
		gitTreeState=clean buildDate=1970-01-01T00:00:00Z; do
		ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
	done
	for tool in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
		stamped "$tool" "$KUBE_VERSION" && continue
		log "go build $tool $KUBE_VERSION (several minutes on a cold cache)"
		(cd "$here/tools" && go build -trimpath -ldflags "$ldflags" -o "$bin/$tool" "k8s.io/kubernetes/cmd/$tool")
		stamp "$tool" "$KUBE_VERSION"
	done
}

build_csi_sanity() {
	stamped csi-sanity "$CSI_TEST_VERSION" && return
	log "go install csi-sanity $CSI_TEST_VERSION"
	GOBIN=$bin go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_TEST_VERSION"
	stamp csi-sanity "$CSI_TEST_VERSION"
}

# module_dir MODULE VERSION: the module's source, downloaded into the module cache.
module_dir() {
	(cd / && go mod download -json "$1@$2") | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'
}

# Module zips leave nested modules out: a `replace M => ./dir` pointing at one
# gets M at the same version from the proxy (external-snapshotter's client).
fill_nested_modules() { # WORK VERSION
	local work=$1 version=$2 module dir
	sed -n 's|^replace \([^ ]*\) => \(\./[^ ]*\)$|\1 \2|p' "$work/go.mod" |
		while read -r module dir; do
			[ -e "$work/$dir" ] && continue
			mkdir -p "$work/$dir"
			cp -r "$(module_dir "$module" "$version")/." "$work/$dir"
		done
}

# build_commands MODULE VERSION CMD...: builds each ./cmd/CMD of the module.
# The sidecars' go.mod files have replace directives, which `go install
# pkg@version` refuses; building inside a writable copy of the module honours
# them.
build_commands() {
	local module=$1 version=$2 missing=() cmd src work
	shift 2
	for cmd in "$@"; do
		stamped "$cmd" "$version" || missing+=("$cmd")
	done
	[ ${#missing[@]} -eq 0 ] && return
	src=$(module_dir "$module" "$version")
	# Under the cache, so a failed build's copy is replaced by the next run.
	work=$cache/src/${module//\//_}@$version
	rm -rf "$work"
	mkdir -p "$work"
	cp -r "$src/." "$work"
	chmod -R u+w "$work"
	fill_nested_modules "$work" "$version"
	chmod -R u+w "$work"
	for cmd in "${missing[@]}"; do
		log "go build $cmd $version (minutes on a cold cache)"
		(cd "$work" && go build -mod=mod -trimpath \
			-ldflags "-s -w -X main.version=$version" -o "$bin/$cmd" "./cmd/$cmd")
		stamp "$cmd" "$version"
	done
	rm -rf "$work"
	rmdir "$cache/src" 2>/dev/null || true
}

build_sidecars() {
	local csi=github.com/kubernetes-csi
	build_commands "$csi/external-provisioner/v6" "$PROVISIONER_VERSION" csi-provisioner
	build_commands "$csi/external-attacher/v4" "$ATTACHER_VERSION" csi-attacher
	build_commands "$csi/external-resizer/v2" "$RESIZER_VERSION" csi-resizer
	build_commands "$csi/external-snapshotter/v8" "$SNAPSHOTTER_VERSION" \
		csi-snapshotter snapshot-controller
}

# The VolumeSnapshot CRDs (snapshots, contents, classes) and the
# VolumeGroupSnapshot ones, which snapshot-controller waits minutes for
# otherwise, of the snapshotter's version.
fetch_snapshot_crds() {
	local dir=$cache/crds/snapshot src
	[ "$(cat "$dir/.version" 2>/dev/null)" = "$SNAPSHOTTER_VERSION" ] && return
	log "fetching the VolumeSnapshot CRDs $SNAPSHOTTER_VERSION"
	src=$(module_dir github.com/kubernetes-csi/external-snapshotter/client/v8 "$SNAPSHOTTER_VERSION")
	rm -rf "$dir"
	mkdir -p "$dir"
	cp "$src"/config/crd/*snapshot.storage.k8s.io_*.yaml "$dir/"
	chmod u+w "$dir"/*.yaml
	echo "$SNAPSHOTTER_VERSION" >"$dir/.version"
}

# MinIO, the S3 server of the object-store tests. Its go.mod has no replace
# directives, so `go install` builds it.
build_minio() {
	stamped minio "$MINIO_VERSION" && return
	log "go install minio $MINIO_VERSION (minutes on a cold cache)"
	GOBIN=$bin go install -trimpath -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION"
	stamp minio "$MINIO_VERSION"
}

# Azurite, the Azure Blob emulator, in a directory of its own; $bin/azurite-blob
# starts its blob service alone.
install_azurite() {
	local dir=$cache/azurite
	stamped azurite-blob "$AZURITE_VERSION" && return
	log "npm install azurite $AZURITE_VERSION"
	rm -rf "$dir"
	mkdir -p "$dir"
	npm install --prefix "$dir" --omit=dev --no-audit --no-fund --loglevel=error \
		"azurite@$AZURITE_VERSION" >/dev/null
	ln -sf "$dir/node_modules/.bin/azurite-blob" "$bin/azurite-blob"
	stamp azurite-blob "$AZURITE_VERSION"
}

# afl_runtime_built: true when cargo-afl's AFL++ runtime exists for the
# rustc in use (cargo-afl keys it by rustc version and commit).
afl_runtime_built() {
	local release commit
	release=$(rustc -vV | sed -n 's/^release: //p')
	commit=$(rustc -vV | sed -n 's/^commit-hash: //p')
	[ -e "$XDG_DATA_HOME/afl.rs/rustc-$release-${commit:0:7}/afl.rs-$CARGO_AFL_VERSION/afl-llvm/afl-compiler-rt.o" ]
}

# cargo-afl and its AFL++ runtime, built from source with the stable
# toolchain (no LLVM plugins, so no nightly). Installing it builds the
# runtime too; `config --build` covers an install whose runtime build failed
# or a newer rustc.
install_cargo_afl() {
	export XDG_DATA_HOME=$cache/share
	if ! stamped cargo-afl "$CARGO_AFL_VERSION"; then
		log "cargo install cargo-afl $CARGO_AFL_VERSION (minutes: it builds AFL++)"
		# Its own temporary target directory, not the caller's.
		env -u CARGO_TARGET_DIR cargo install --quiet --locked --force \
			--root "$cache" cargo-afl --version "$CARGO_AFL_VERSION"
		stamp cargo-afl "$CARGO_AFL_VERSION"
	fi
	afl_runtime_built && return
	log "building the AFL++ runtime of cargo-afl $CARGO_AFL_VERSION"
	PATH=$bin:$PATH cargo afl config --build --force >/dev/null
}

# The iSCSI integrity tests' libiscsi client, rebuilt when its source
# changes.
build_iscsi_pattern() {
	local source=$here/iscsi-pattern.c sum
	sum=$(sha256sum "$source" | cut -c1-16)
	stamped iscsi-pattern "$sum" && return
	log "building iscsi-pattern"
	gcc -O2 -Wall -Werror -o "$bin/iscsi-pattern" "$source" -liscsi
	stamp iscsi-pattern "$sum"
}

install_apt
quiet_system_etcd
build_iscsi_pattern
build_kube
build_csi_sanity
build_sidecars
fetch_snapshot_crds
build_minio
install_azurite
install_cargo_afl
log "tools ready in $bin"
echo "$bin"
