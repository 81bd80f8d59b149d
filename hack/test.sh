#!/usr/bin/env bash
# Runs every test: installs the test dependencies (idempotent), then format,
# lint and API-doc checks, then unit and integration tests against a real control
# plane that the tests start themselves (the install tests run the images
# hack/build-image.sh builds), 30 s of fuzzing per fuzz target
# (hack/fuzz.sh), then csi-sanity (sanity-tests/run.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/install-test-deps.sh >/dev/null
cargo fmt --check
# --workspace: the test bed crate (testbed/) too.
cargo clippy --locked --workspace --all-targets -- -D warnings
# The API docs build without warnings (broken or private links included).
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
hack/build-image.sh >/dev/null
cargo test --locked --workspace
# A short coverage-guided run of each fuzz target from its corpus (fuzz/).
hack/fuzz.sh frame 30
hack/fuzz.sh iscsi 30
hack/fuzz.sh store 30
sanity-tests/run.sh
