#!/usr/bin/env bash
# csi-sanity (built by hack/install-test-deps.sh) against a real oxhorn
# cluster: tests/it/sanity.rs starts the test control plane (etcd +
# kube-apiserver) and three `oxhorn manager` nodes, then runs csi-sanity over
# node 1's unix socket with its own staging and target dirs, the StorageClass
# parameters in tests/it/sanity.rs, a 32 MiB test volume and a 48 MiB expand
# size. Prints csi-sanity's report and ends with its summary line.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
hack/install-test-deps.sh >/dev/null
report=$(mktemp)
trap 'rm -f "$report"' EXIT
status=0
# The test's own assertion names the failed specs; a backtrace of it would
# only push them out of a log's tail.
RUST_BACKTRACE=0 cargo test --locked --test it sanity:: -- --ignored --nocapture 2>&1 | tee "$report" || status=$?
echo
grep -E '^\s*\[(FAIL|TIMEDOUT|PANICKED|INTERRUPTED)\]' "$report" || true
grep -E '^(SUCCESS!|FAIL!) -- ' "$report" | tail -1 || echo "csi-sanity did not report a summary"
exit "$status"
