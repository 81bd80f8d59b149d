#!/usr/bin/env bash
# The main job: installs what is needed, builds oxhorn and its images, and
# installs it from its manifest on a local cluster with two real kubelet
# nodes, where a pod writes to a claim on one and a pod on the other reads it
# (examples/local-cluster.rs).
# Arguments are passed on (--hold keeps the cluster up until Ctrl-C).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/install-test-deps.sh >/dev/null
hack/build-image.sh >/dev/null
cargo build --release --bin oxhorn --example local-cluster
# Where cargo put them: $CARGO_TARGET_DIR (relative to here, as cargo reads it) or target/.
release=${CARGO_TARGET_DIR:-target}/release
exec "$release/examples/local-cluster" --oxhorn "$release/oxhorn" "$@"
