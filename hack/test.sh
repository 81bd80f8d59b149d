#!/usr/bin/env bash
# Runs every test: installs the test dependencies (hack/install-test-deps.sh:
# the main job's and the test-only tools, idempotent), then format, lint
# and API-doc checks, then unit and integration tests against a real
# control plane that the tests start themselves (the install tests run the
# images hack/build-image.sh builds, with oxhorn's release binary built
# here), 30 s of fuzzing per fuzz target (hack/fuzz.sh), then csi-sanity
# (sanity-tests/run.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/install-test-deps.sh >/dev/null
cargo fmt --check
# --workspace: the test bed crate (testbed/) too.
cargo clippy --locked --workspace --all-targets -- -D warnings
# The API docs build without warnings (broken or private links included).
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
# oxhorn's release binary, which the image gets as it is (built once, on
# this host, as hack/local-cluster.sh does).
cargo build --release --locked --bin oxhorn
# Where cargo put it: $CARGO_TARGET_DIR (relative to here, as cargo reads it) or target/.
hack/build-image.sh --binary "${CARGO_TARGET_DIR:-target}/release/oxhorn" >/dev/null
cargo test --locked --workspace
# A short coverage-guided run of each fuzz target from its corpus (fuzz/).
hack/fuzz.sh frame 30
hack/fuzz.sh fuse 30
hack/fuzz.sh iscsi 30
hack/fuzz.sh store 30
sanity-tests/run.sh
