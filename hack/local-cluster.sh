#!/usr/bin/env bash
# The main job: installs what it needs (hack/install-deps.sh, not the
# test-only tools), builds oxhorn and its images, and installs it from its
# manifest on a local cluster with two real kubelet nodes, where a pod
# writes to a claim on one and a pod on the other reads it
# (testbed/examples/local-cluster.rs).
#
# oxhorn is built once, on the host: the manager-only node runs that
# binary, and hack/build-image.sh --binary puts it into the image. The Go
# tools build beside it, in the background, to use both cores while one
# build waits on a download or a link. Each step logs what it does and its
# time to stderr.
#
# Arguments are passed on (--hold keeps the cluster up until Ctrl-C).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log_name=local-cluster
# shellcheck source-path=SCRIPTDIR source=lib.sh
. hack/lib.sh
started=$SECONDS

# The Debian packages first: cargo needs protoc.
hack/install-deps.sh --packages >/dev/null
log "building the Go tools in the background (cold: 30 min or more on two CPUs; they log as [install-deps])"
hack/install-deps.sh --tools >/dev/null &
tools=$!
trap 'kill_trees "$tools"' EXIT
timed "cargo build --release oxhorn and the local-cluster example (cold: 15 min or more on two CPUs)" \
	cargo build --release --locked -p oxhorn --bin oxhorn -p oxhorn-testbed --example local-cluster
if ! wait "$tools"; then
	log "hack/install-deps.sh --tools failed"
	exit 1
fi
trap - EXIT
# Where cargo put them: $CARGO_TARGET_DIR (relative to here, as cargo reads it) or target/.
release=${CARGO_TARGET_DIR:-target}/release
timed "hack/build-image.sh --binary $release/oxhorn (cold: a minute or two, its Debian base)" \
	hack/build-image.sh --binary "$release/oxhorn" >/dev/null
log "set up in $(elapsed "$started"); starting the local cluster"
exec "$release/examples/local-cluster" --oxhorn "$release/oxhorn" "$@"
