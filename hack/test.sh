#!/usr/bin/env bash
# Runs every test: installs the test dependencies (idempotent), then format
# and lint checks, then unit, integration and csi-sanity tests against a real
# control plane that the tests start themselves.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/install-test-deps.sh >/dev/null
cargo fmt --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked
