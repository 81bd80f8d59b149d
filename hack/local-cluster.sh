#!/usr/bin/env bash
# The main job: installs what is needed, builds oxhorn, and runs a local
# control plane with `oxhorn manager` serving on it. Arguments are passed on
# (--hold keeps the cluster up until Ctrl-C).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/install-test-deps.sh >/dev/null
cargo build --release --bin oxhorn --example local-cluster
# Where cargo put them: $CARGO_TARGET_DIR (relative to here, as cargo reads it) or target/.
release=${CARGO_TARGET_DIR:-target}/release
exec "$release/examples/local-cluster" --oxhorn "$release/oxhorn" "$@"
