#!/usr/bin/env bash
# Installs everything the build and the tests need, idempotently: what the
# main job needs (hack/install-deps.sh, run first), then what only the
# tests need.
#
# Debian packages go through apt; hack/iscsi-pattern.c is compiled;
# csi-sanity and MinIO (S3, the object-store tests) are built from the Go
# module proxy into the same bin directory and stamped with their version,
# so a second run does nothing.
# cargo-afl (the fuzzer of hack/fuzz.sh) is installed with `cargo install`
# into the same bin directory, and its AFL++ runtime built under
# $cache/share (its XDG data directory; hack/fuzz.sh sets the same).
# Azurite (Azure Blob) comes from npm under $cache/azurite, run as
# $bin/azurite-blob with Node.js (Debian's nodejs and npm where the machine
# has no npm). The builds run side by side.
#
#   OXHORN_CACHE  where built tools live (default: ~/.cache/oxhorn)
#
# Logs go to stderr, each long step with its time; prints the bin directory
# holding the tools as its last line.
set -euo pipefail

CSI_TEST_VERSION=v5.4.0
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
log_name=install-test-deps
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

"$here/install-deps.sh" >/dev/null

apt_packages=(
	libclang-dev       # bindgen users among the crates
	fio                # bench/
	iproute2           # ip, bridge: the partition tests' namespaces and bridges
	libiscsi-bin tgt             # tests/it/iscsi and bench/: libiscsi's conformance suite and tools, and tgtd to compare with
	libiscsi-dev                 # hack/iscsi-pattern.c, the iSCSI integrity tests' client
	nfs-ganesha nfs-ganesha-vfs rpcbind  # tests/it/backup_nfs: an NFSv3 server in userspace (no kernel nfsd here)
	prometheus         # tests/it/metrics: a real Prometheus scrapes the managers; promtool checks deploy/monitoring's rules
	chromium chromium-driver  # tests/it/dashboard: the dashboard driven in a headless browser over WebDriver
)
# Node.js and npm for Azurite. A machine with an npm already keeps its own:
# NodeSource's nodejs package, for one, conflicts with Debian's npm.
command -v npm >/dev/null 2>&1 || apt_packages+=(nodejs npm)

build_csi_sanity() {
	stamped csi-sanity "$CSI_TEST_VERSION" && return
	timed "go install csi-sanity $CSI_TEST_VERSION (about 2 min on a cold cache)" \
		env GOBIN="$bin" go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_TEST_VERSION"
	stamp csi-sanity "$CSI_TEST_VERSION"
}

# MinIO, the S3 server of the object-store tests. Its go.mod has no replace
# directives, so `go install` builds it.
build_minio() {
	stamped minio "$MINIO_VERSION" && return
	timed "go install minio $MINIO_VERSION (3 to 4 min on a cold cache)" \
		env GOBIN="$bin" go install -trimpath -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION"
	stamp minio "$MINIO_VERSION"
}

# Azurite, the Azure Blob emulator, in a directory of its own; $bin/azurite-blob
# starts its blob service alone.
install_azurite() {
	local dir=$cache/azurite
	stamped azurite-blob "$AZURITE_VERSION" && return
	rm -rf "$dir"
	mkdir -p "$dir"
	timed "npm install azurite $AZURITE_VERSION (about a minute)" \
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
		# Its own temporary target directory, not the caller's.
		timed "cargo install cargo-afl $CARGO_AFL_VERSION (about 3 min: it builds AFL++)" \
			env -u CARGO_TARGET_DIR cargo install --quiet --locked --force \
			--root "$cache" cargo-afl --version "$CARGO_AFL_VERSION"
		stamp cargo-afl "$CARGO_AFL_VERSION"
	fi
	afl_runtime_built && return
	timed "building the AFL++ runtime of cargo-afl $CARGO_AFL_VERSION (about a minute and a half)" \
		env PATH="$bin:$PATH" cargo afl config --build --force >/dev/null
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

install_apt "${apt_packages[@]}"
build_iscsi_pattern
in_parallel build_csi_sanity build_minio install_azurite install_cargo_afl
log "tools ready in $bin"
echo "$bin"
