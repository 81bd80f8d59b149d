#!/usr/bin/env bash
# Fuzzes one target of fuzz/ with afl for a given time, starting from its
# committed corpus, and fails if afl saved any crash or hang.
#
#   hack/fuzz.sh <frame|fuse|iscsi|store> <seconds>
#
# Needs cargo-afl and its AFL++ runtime, which hack/install-test-deps.sh
# installs into $OXHORN_CACHE (default ~/.cache/oxhorn). The instrumented
# build goes to $CARGO_TARGET_DIR/afl (default target/afl): its flags differ
# from a normal build's, so it keeps a directory of its own. afl's output
# (queue, crashes, hangs, fuzzer_stats) is left in
# $CARGO_TARGET_DIR/afl/out/<target> for inspection; the store target's
# replica directories live in a temporary directory under /dev/shm, removed
# at exit.
#
#
#   hack/fuzz.sh <frame|fuse|iscsi|store> <seconds> --update-corpus
#
# also replaces fuzz/corpus/<target> with the run's queue minimised by
# afl-cmin (inputs named by their content's hash), when the run found
# nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { echo "usage: $0 <frame|fuse|iscsi|store> <seconds> [--update-corpus]" >&2; exit 2; }
[ $# -eq 2 ] || { [ $# -eq 3 ] && [ "$3" = --update-corpus ]; } || usage
target=$1 seconds=$2 update=${3:-}
case $target in frame | fuse | iscsi | store) ;; *) usage ;; esac
[[ $seconds =~ ^[1-9][0-9]*$ ]] || usage

cache=${OXHORN_CACHE:-${HOME}/.cache/oxhorn}
export PATH=$cache/bin:$PATH
# Where hack/install-test-deps.sh built cargo-afl's AFL++ runtime.
export XDG_DATA_HOME=$cache/share
if ! command -v cargo-afl >/dev/null; then
	echo "cargo-afl is not in $cache/bin: run hack/install-test-deps.sh" >&2
	exit 1
fi

afl_dir=${CARGO_TARGET_DIR:-$PWD/target}/afl
CARGO_TARGET_DIR=$afl_dir cargo afl build --quiet --locked --release \
	-p oxhorn-fuzz --features afl --bin "$target"

out=$afl_dir/out/$target
rm -rf "$out"
mkdir -p "$out"
scratch=$(mktemp -d "$([ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/oxhorn-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export OXHORN_FUZZ_DIR=$scratch

# No UI; no CPU frequency or core_pattern checks and no core pinning (a
# shared CI machine); a hang is an input running over 2 s (the slowest
# store inputs take a few milliseconds).
AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
	AFL_NO_AFFINITY=1 \
	cargo afl fuzz -i "fuzz/corpus/$target" -o "$out" -V "$seconds" -t 2000 \
	-- "$afl_dir/release/$target" >"$out/afl.log" 2>&1 || {
	tail -n 30 "$out/afl.log" >&2
	echo "fuzz $target: afl-fuzz failed (log: $out/afl.log)" >&2
	exit 1
}

stats=$out/default/fuzzer_stats
stat() { sed -n "s/^$1 *: //p" "$stats"; }
execs=$(stat execs_done) crashes=$(stat saved_crashes) hangs=$(stat saved_hangs)
echo "fuzz $target: $execs executions in $(stat run_time) s ($(stat execs_per_sec)/s)," \
	"$crashes crashes, $hangs hangs, corpus $(stat corpus_count)"
if [ "$crashes" != 0 ] || [ "$hangs" != 0 ]; then
	echo "fuzz $target: findings in $out/default/crashes and $out/default/hangs;" \
		"replay one with: $afl_dir/release/$target < <file>" >&2
	exit 1
fi

if [ -n "$update" ]; then
	# cargo-afl's afl-cmin is AFL++'s Python one, which finds no tuples in
	# these persistent-mode targets; the shell one does.
	release=$(rustc -vV | sed -n 's/^release: //p')
	commit=$(rustc -vV | sed -n 's/^commit-hash: //p')
	version=$(cat "$cache/bin/.cargo-afl.version")
	cmin=$XDG_DATA_HOME/afl.rs/rustc-$release-${commit:0:7}/afl.rs-$version/afl/bin/afl-cmin.bash
	AFL_NO_UI=1 "$cmin" -i "$out/default/queue" -o "$out/cmin" -- "$afl_dir/release/$target" >"$out/cmin.log" 2>&1
	rm -f "fuzz/corpus/$target"/*
	for input in "$out/cmin"/*; do
		cp "$input" "fuzz/corpus/$target/$(sha256sum <"$input" | cut -c1-16)"
	done
	echo "fuzz $target: corpus of $(find "fuzz/corpus/$target" -type f | wc -l) inputs," \
		"$(cat "fuzz/corpus/$target"/* | wc -c) bytes"
fi
