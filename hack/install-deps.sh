#!/usr/bin/env bash
# Installs what building oxhorn and its images and running the main job
# (hack/local-cluster.sh) need, idempotently; hack/install-test-deps.sh
# runs it, then adds what only the tests need.
#
# Debian packages go through apt. Go programs are built from the Go module
# proxy into a cache directory and stamped with their version, so a second
# run does nothing: kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet and kubectl (one `go build`, which compiles what they share once),
# and beside them the CSI sidecars and snapshot-controller, which
# hack/build-image.sh makes images of. The VolumeSnapshot CRDs go to
# $cache/crds/snapshot.
#
#   OXHORN_CACHE  where built tools live (default: ~/.cache/oxhorn)
#
# --packages installs only the Debian packages (what cargo needs to build
# oxhorn), --tools only the rest; no argument, both. Logs go to stderr,
# each long step with its time; prints the bin directory holding the tools
# as its last line.
set -euo pipefail

KUBE_VERSION=v1.35.4
# external-provisioner v6.4.0 needs a sig-storage-lib-external-provisioner
# version the proxy does not have.
PROVISIONER_VERSION=v6.3.0
ATTACHER_VERSION=v4.13.0
RESIZER_VERSION=v2.3.0
SNAPSHOTTER_VERSION=v8.7.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${OXHORN_CACHE:-${HOME}/.cache/oxhorn}
bin=$cache/bin
log_name=install-deps
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

with_packages=true with_tools=true
case ${1:-} in
'') ;;
--packages) with_tools=false ;;
--tools) with_packages=false ;;
*) log "usage: $0 [--packages|--tools]"; exit 2 ;;
esac
mkdir -p "$bin"

apt_packages=(
	etcd-server        # the control plane's store
	protobuf-compiler  # protoc, for tonic-prost-build
	libprotobuf-dev    # google/protobuf/*.proto includes
	gcc libc6-dev      # the linker, and the C of ring and zstd-sys
	pkg-config
	binutils           # objcopy: hack/build-image.sh compresses the binary's debug sections
	procps             # ps: hack/lib.sh ends an interrupted run's jobs
	e2fsprogs xfsprogs util-linux  # mkfs, losetup, blkid: the manager-only node's volumes
	fuse3              # fusermount3, for the FUSE frontend
	containerd runc    # the test bed's real kubelet nodes run pods with these
	containernetworking-plugins  # a CNI configuration containerd accepts
	busybox-static umoci         # the nodes' pod image, built locally
	buildah mmdebstrap           # hack/build-image.sh: the product and sidecar images, and their Debian base
)

# Debian's etcd-server starts a system etcd on :2379; tests run their own.
quiet_system_etcd() {
	if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
		systemctl disable --now etcd >/dev/null 2>&1 || true
	fi
	ln -sf "$(command -v etcd)" "$bin/etcd"
}

# The five Kubernetes commands in one `go build` (-o DIR/), which compiles
# the packages they share once and links them side by side.
build_kube() {
	local tool missing=() packages=() out
	for tool in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
		stamped "$tool" "$KUBE_VERSION" || missing+=("$tool")
	done
	[ ${#missing[@]} -eq 0 ] && return
	for tool in "${missing[@]}"; do
		packages+=("k8s.io/kubernetes/cmd/$tool")
	done
	# Built beside $bin and moved in once all are built: a stamp never
	# names a binary of another version.
	out=$cache/build/kube
	rm -rf "$out"
	mkdir -p "$out"
	timed "go build ${missing[*]} $KUBE_VERSION (cold: 20 min or more on two CPUs)" \
		go -C "$here/tools" build -trimpath -ldflags "$(kube_ldflags "$KUBE_VERSION")" -o "$out/" "${packages[@]}"
	for tool in "${missing[@]}"; do
		mv -f "$out/$tool" "$bin/$tool"
		stamp "$tool" "$KUBE_VERSION"
	done
	rm -rf "$out"
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

# build_commands MODULE VERSION CMD...: builds each ./cmd/CMD of the module,
# in one `go build`. The sidecars' go.mod files have replace directives,
# which `go install pkg@version` refuses; building inside a writable copy
# of the module honours them.
build_commands() {
	local module=$1 version=$2 missing=() cmd src work packages=()
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
		packages+=("./cmd/$cmd")
	done
	mkdir -p "$work/out"
	timed "go build ${missing[*]} $version (cold: 5 to 15 min each)" \
		go -C "$work" build -mod=mod -trimpath \
		-ldflags "-s -w -X main.version=$version" -o "$work/out/" "${packages[@]}"
	for cmd in "${missing[@]}"; do
		mv -f "$work/out/$cmd" "$bin/$cmd"
		stamp "$cmd" "$version"
	done
	rm -rf "$work"
}

# The sidecars one after the other (each a module of its own, with its own
# versions of the libraries), beside build_kube.
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

if $with_packages; then
	install_apt "${apt_packages[@]}"
	quiet_system_etcd
fi
if $with_tools; then
	command -v go >/dev/null || { log "go is missing: the Go toolchain builds the Kubernetes tools"; exit 1; }
	fetch_snapshot_crds
	in_parallel build_kube build_sidecars
	rmdir "$cache/src" "$cache/build" 2>/dev/null || true
fi
log "tools ready in $bin"
echo "$bin"
