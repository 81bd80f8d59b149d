#!/usr/bin/env bash
# Runs Kubernetes' external-storage e2e suite (test/e2e/storage/external of
# k8s.io/kubernetes, the version hack/tools/go.mod pins) against Oxhorn on
# the local cluster of hack/local-cluster.sh, as every kubernetes-csi driver
# is validated: e2e.test -storage.testdriver=deploy/e2e/driver.yaml.
#
#   hack/e2e.sh [--full] [--focus REGEX] [--skip REGEX] [--report-dir DIR]
#               [--no-build] [--list] [-- E2E.TEST FLAGS...]
#
#   --full        also the [Slow], [Serial] and [Disruptive] tests
#   --focus R     only the External Storage tests whose name also matches R
#                 (e.g. 'provisioning.*should provision storage with defaults')
#   --skip R      leave out the tests whose name matches R
#   --report-dir  where the reports go (default:
#                 $OXHORN_CACHE/e2e-reports/<UTC date and time>)
#   --no-build    skip the install and build steps: run what an earlier
#                 run (or hack/local-cluster.sh and hack/install-e2e-deps.sh)
#                 built, leaving the shared image archives and tools alone
#   --list        only list the tests the other options select (a dry run
#                 of e2e.test, with no cluster), and their count; those
#                 whose capability the driver lacks skip themselves when run
#   after --      flags for e2e.test itself (-ginkgo.v, -ginkgo.fail-fast, ...)
#
# Which tests: those of the External Storage suite the driver definition
# enables, minus the [Flaky] ones, those of features off by default
# (Alpha, BetaOffByDefault, OffByDefault labels), and those of features
# Oxhorn lacks: a test labelled Feature:X runs only for the features listed
# in SUPPORTED_FEATURES. [LinuxOnly] tests run: the nodes are Linux. Without
# --full, [Slow], [Serial] and [Disruptive] tests are left out too.
#
# Steps: hack/install-deps.sh and hack/install-e2e-deps.sh (each does
# nothing when done already); the release build of oxhorn and
# testbed/examples/local-cluster.rs, and the image of that oxhorn
# (hack/build-image.sh --binary); the local cluster,
# kept up (--hold) with the e2e images imported into each kubelet node
# (--import-images), since no registry is reachable and the tests' pods pull
# only missing images; e2e.test against it. The kubelet nodes of all
# processes on this machine take turns, so the cluster may first wait for
# another's to stop. The cluster is stopped when the run ends, however it
# ends: once up, with SIGINT, which lets it delete its demo claim and stop
# its processes; before, with TERM, which kills it outright (the test bed
# sweeps what is left at its next start). An interrupt or TERM of this
# script during e2e.test lets e2e.test clean up and write its reports first.
#
# Prints the counts of passed, failed and skipped tests, the failed tests'
# names and why tests were skipped. Exits with e2e.test's status (130 or 143
# when interrupted).
# The report directory holds e2e.log (e2e.test's output), junit_01.xml,
# report.json (Ginkgo's) and cluster.log (the local cluster's output).
# Needs root, as hack/local-cluster.sh.
set -euo pipefail

# Feature:X labels of tests Oxhorn can pass: snapshots as data sources, and
# xfs (deploy/e2e/driver.yaml says why).
SUPPORTED_FEATURES='VolumeSnapshotDataSource, VolumeSourceXFS'
# Taints e2e's start-up check lets a Ready node have (it waits, 30 minutes,
# for every other tainted node): the manager-only node's (a node with no
# kubelet, which no test pod may land on), and control-plane nodes'. Tests
# pick nodes without NoSchedule taints, so none lands there.
NON_BLOCKING_TAINTS=oxhorn.io/manager-only,node-role.kubernetes.io/control-plane

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${OXHORN_CACHE:-${HOME}/.cache/oxhorn}
bin=$cache/bin

log() { printf '[e2e] %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }
usage() { sed -n '/^#   hack\/e2e.sh/,/^#   after --/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }

full=false focus='' skip='' report='' build=true list=false
while [ $# -gt 0 ]; do
	case $1 in
	--full) full=true ;;
	--focus) [ $# -ge 2 ] || usage; focus=$2; shift ;;
	--skip) [ $# -ge 2 ] || usage; skip=$2; shift ;;
	--report-dir) [ $# -ge 2 ] || usage; report=$2; shift ;;
	--no-build) build=false ;;
	--list) list=true ;;
	--) shift; break ;;
	-h | --help) usage ;;
	*) log "unknown argument: $1"; usage ;;
	esac
	shift
done

# Tests this test bed cannot run, for reasons of the machine, not Oxhorn's:
# they look into a node through a hostexec pod, which enters pid 1's mount
# namespace (this VM's init, out of reach: opening /proc/1/ns/mnt is
# refused) and looks for pods under /var/lib/kubelet, where two kubelets
# sharing one host cannot both keep theirs (each has a root directory of
# its own); and (--full only) those that stop or restart a kubelet with
# systemctl over SSH or a hostexec pod, neither of which exists here; and
# those that grow the default filesystem, ext4, whose growth (online, or
# at staging after the claim grew) needs CAP_SYS_RESOURCE, which this VM's
# capability bounding set withholds from every process (tests/it grows
# xfs for this reason; the block and xfs patterns still run), generic
# ephemeral volumes' included.
TESTBED_SKIP='should not mount / map unused volumes in a pod|while kubelet is down|kubelet restart|\(default fs\)\(allowExpansion\)|Ephemeral-volume \(default fs\).*expansion of pvcs created for ephemeral pvcs'

# The tests: e2e.test's flags that select them.
filter="!Flaky && !Alpha && !BetaOffByDefault && !OffByDefault && Feature: isSubsetOf {$SUPPORTED_FEATURES}"
$full || filter="!Slow && !Serial && !Disruptive && $filter"
selection=(
	-storage.testdriver="$root/deploy/e2e/driver.yaml"
	-ginkgo.focus="External.Storage${focus:+.*($focus)}"
	-ginkgo.label-filter="$filter"
)
selection+=(-ginkgo.skip="$TESTBED_SKIP${skip:+|$skip}")

if $list; then
	[ -x "$bin/e2e.test" ] || die "$bin/e2e.test is missing: run hack/install-e2e-deps.sh"
	scratch=$(mktemp -d "${TMPDIR:-/tmp}/oxhorn-e2e-list.XXXXXX")
	trap 'rm -rf "$scratch"' EXIT
	# A dry run reaches no cluster, but wants a -kubeconfig.
	"$bin/e2e.test" "${selection[@]}" -ginkgo.dry-run -ginkgo.no-color \
		-ginkgo.json-report="$scratch/report.json" -kubeconfig=/dev/null "$@" \
		>"$scratch/e2e.log" 2>&1 || { tail -n 30 "$scratch/e2e.log" >&2; die "e2e.test -ginkgo.dry-run failed"; }
	jq -r '[.[].SpecReports[] | select(.LeafNodeType == "It" and .State == "passed")
		| ((.ContainerHierarchyTexts // []) + [.LeafNodeText]) | join(" ")] | sort
		| (.[], "\(length) tests")' "$scratch/report.json"
	exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (the local cluster's kubelet nodes)"

report=${report:-$cache/e2e-reports/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$report"
report=$(cd "$report" && pwd)

cd "$root"
if $build; then
	hack/install-deps.sh >/dev/null
	images=$(hack/install-e2e-deps.sh | tail -n 1)
	log "cargo build --release (oxhorn, the local-cluster example)"
	cargo build --quiet --release --locked -p oxhorn --bin oxhorn \
		-p oxhorn-testbed --example local-cluster
	# Where cargo put it: $CARGO_TARGET_DIR (relative to here) or target/.
	hack/build-image.sh --binary "${CARGO_TARGET_DIR:-target}/release/oxhorn" >/dev/null
else
	# Where hack/install-e2e-deps.sh puts them.
	images=${OXHORN_E2E_IMAGE_DIR:-$cache/e2e-images}
fi
# Where cargo put them: $CARGO_TARGET_DIR (relative to here, as cargo reads
# it) or target/.
release=$(cd "${CARGO_TARGET_DIR:-target}/release" && pwd)
for built in "$release/oxhorn" "$release/examples/local-cluster" "$bin/e2e.test"; do
	[ -x "$built" ] || die "$built is missing: run without --no-build"
done

# The cluster runs in the background, in a process group of its own (job
# control on while it starts): an interrupt of this script is not the
# cluster's, which stop_cluster sends it itself, to it alone (its own
# processes are in groups of their own and die with it).
cluster=''
# shellcheck disable=SC2317 # run by the EXIT trap
stop_cluster() {
	[ -n "$cluster" ] || return 0
	if kill -0 "$cluster" 2>/dev/null; then
		log "stopping the local cluster (its output: $report/cluster.log)"
		# Once up it waits for SIGINT, and then deletes its claim and stops
		# its processes. Before, SIGINT might be ignored (by a script run in
		# the background with it ignored): TERM ends it outright.
		if grep -q '^Ctrl-C stops the cluster' "$report/cluster.log"; then
			kill -INT "$cluster" 2>/dev/null || true
		else
			kill -TERM "$cluster" 2>/dev/null || true
		fi
	fi
	wait "$cluster" 2>/dev/null || true
	cluster=''
}
trap stop_cluster EXIT
# An interrupt or a TERM ends the run: before e2e.test runs, at once; while
# it runs, once it has cleaned up after an interrupt of its own (its
# reports are then written, and summed up as usual).
e2e='' interrupted=''
# shellcheck disable=SC2317 # run by the INT and TERM traps
on_signal() {
	interrupted=$1
	if [ -n "$e2e" ]; then
		# Ginkgo takes TERM as it takes an interrupt (and TERM, unlike
		# INT, is never ignored from the start).
		kill -TERM "$e2e" 2>/dev/null || true
	else
		exit "$interrupted"
	fi
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

log "starting the local cluster (it may wait its turn for the kubelet nodes)"
# There before the cluster's shell opens it: the loop below reads it at once.
: >"$report/cluster.log"
set -m
"$release/examples/local-cluster" --oxhorn "$release/oxhorn" --hold \
	--import-images "$images" >"$report/cluster.log" 2>&1 &
cluster=$!
set +m

# The cluster prints `export KUBECONFIG=...` once it is up, then waits for
# SIGINT.
kubeconfig=''
waited=0
while [ -z "$kubeconfig" ]; do
	if ! kill -0 "$cluster" 2>/dev/null; then
		tail -n 30 "$report/cluster.log" >&2
		die "the local cluster ended before it was up (all of its output: $report/cluster.log)"
	fi
	kubeconfig=$(sed -n 's/^export KUBECONFIG=//p' "$report/cluster.log" | head -n 1)
	if [ -z "$kubeconfig" ]; then
		sleep 2
		waited=$((waited + 2))
		[ $((waited % 60)) -eq 0 ] && log "still waiting for the cluster ($waited s): $(tail -n 1 "$report/cluster.log")"
	fi
done
log "cluster up: export KUBECONFIG=$kubeconfig"

args=(
	"${selection[@]}"
	-kubeconfig="$kubeconfig"
	-kubectl-path="$bin/kubectl"
	# No cloud: the fallback provider, which needs nothing.
	-provider=skeleton
	-repo-root="$root"
	-non-blocking-taints="$NON_BLOCKING_TAINTS"
	-report-dir="$report"
	-ginkgo.json-report="$report/report.json"
	-ginkgo.no-color
	# Ginkgo's default is an hour; a --full run takes longer.
	-ginkgo.timeout=24h
)
log "e2e.test $(printf '%q ' "${args[@]}" "$@")"
# In the background, in a process group of its own (as the cluster), so
# that a signal of this script reaches it once, from on_signal, and `wait`
# returns to run the trap at once.
set -m
KUBECONFIG=$kubeconfig "$bin/e2e.test" "${args[@]}" "$@" >"$report/e2e.log" 2>&1 &
e2e=$!
set +m
status=0
while :; do
	wait "$e2e" && status=0 || status=$?
	# A trap's return leaves it running: wait again.
	kill -0 "$e2e" 2>/dev/null || break
done
log "e2e.test exited with $status; its output: $report/e2e.log"

# The summary, from Ginkgo's JSON report. Specs the filters left out are
# "skipped" without a message; those that ran and skipped themselves (a
# capability the driver lacks) have one.
if [ -s "$report/report.json" ]; then
	jq -r '
		def name: ((.ContainerHierarchyTexts // []) + [.LeafNodeText]) | join(" ");
		[.[].SpecReports[] | select(.LeafNodeType == "It")] as $specs
		| ($specs | map(select(.State == "passed"))) as $passed
		| ($specs | map(select(.State | IN("failed", "panicked", "timedout", "aborted", "interrupted")))) as $failed
		| ($specs | map(select(.State == "skipped" and ((.Failure.Message // "") != "")))) as $skipped
		| ($specs | map(select(.State == "skipped" and ((.Failure.Message // "") == "")))) as $unselected
		| "passed: \($passed | length), failed: \($failed | length), skipped: \($skipped | length) (not selected: \($unselected | length))",
		  (if ($failed | length) > 0 then "failed:", ($failed[] | "  [\(.State)] \(name)") else empty end),
		  (if ($skipped | length) > 0 then "skipped, by reason:",
		    ($skipped | group_by(.Failure.Message) | map({n: length, why: .[0].Failure.Message})
		     | sort_by(-.n)[] | "  \(.n) \(.why | split("\n")[0])")
		  else empty end)
	' "$report/report.json"
else
	log "no report.json: e2e.test did not get to run the specs (end of $report/e2e.log follows)"
	tail -n 30 "$report/e2e.log" >&2
fi
log "reports in $report"
exit "${interrupted:-$status}"
