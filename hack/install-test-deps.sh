#!/usr/bin/env bash
# Installs everything the build and the tests need, idempotently.
#
# Debian packages go through apt; Go programs (kube-apiserver, kubectl,
# csi-sanity) are built from the Go module proxy into a cache directory and
# stamped with their version, so a second run does nothing.
#
#   OXHORN_CACHE  where built tools live (default: ~/.cache/oxhorn)
#
# Prints the bin directory holding the tools as its last line.
set -euo pipefail

KUBE_VERSION=v1.35.4
CSI_TEST_VERSION=v5.4.0

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
)

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
	for tool in kube-apiserver kubectl; do
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

install_apt
quiet_system_etcd
build_kube
build_csi_sanity
log "tools ready in $bin"
echo "$bin"
