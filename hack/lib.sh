# shellcheck shell=bash disable=SC2154 # log_name and bin are the sourcing script's
# Shared by the set-up scripts (sourced, not run): logging with elapsed
# times, version stamps, apt packages and background jobs.
#
# The sourcing script sets log_name (its log lines' prefix) and, for the
# stamps, bin (the directory of the built tools).

log() { printf '[%s] %s\n' "$log_name" "$*" >&2; }

# elapsed START: the time since START (a value of $SECONDS), as 1m05s.
elapsed() {
	local s=$((SECONDS - $1))
	printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# timed WHAT CMD...: runs CMD, saying WHAT before and how long it took
# after. WHAT says roughly how long on a cold machine, so a long step is
# expected.
timed() {
	local what=$1 start=$SECONDS
	shift
	log "$what"
	"$@"
	log "done in $(elapsed "$start"): ${what%% (*}"
}

# stamped NAME VERSION: true when $bin/NAME at VERSION is already built.
stamped() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" >"$bin/.$1.version"; }

# kube_ldflags VERSION: the -ldflags that make a binary of the
# k8s.io/kubernetes module report VERSION (e2e.test logs it; some tests
# compare it with the server's).
kube_ldflags() {
	local version=$1 ver=${1#v} ldflags="-s -w" kv
	for kv in gitVersion=$version gitMajor=${ver%%.*} gitMinor=$(echo "$ver" | cut -d. -f2) \
		gitTreeState=clean buildDate=1970-01-01T00:00:00Z; do
		ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
	done
	echo "$ldflags"
}

# install_apt PACKAGE...: installs those of the Debian packages not
# installed yet.
install_apt() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return
	export DEBIAN_FRONTEND=noninteractive
	timed "apt: installing ${missing[*]} (a few minutes)" apt_get_install "${missing[@]}"
}
apt_get_install() {
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# in_parallel FUNCTION...: runs each FUNCTION as a background job and
# waits for all of them, saying each minute which still run (so a long
# build is not silent); fails naming those that failed. A job's own log
# lines say what it does and how long it took. Jobs still running when the
# script exits (interrupted) are ended with their children.
in_parallel() {
	local names=() failed=() i start=$SECONDS next=60 running
	parallel_pids=()
	trap 'kill_trees "${parallel_pids[@]}"' EXIT
	for i in "$@"; do
		"$i" &
		names+=("$i")
		parallel_pids+=($!)
	done
	while :; do
		running=()
		for i in "${!parallel_pids[@]}"; do
			kill -0 "${parallel_pids[$i]}" 2>/dev/null && running+=("${names[$i]}")
		done
		[ ${#running[@]} -eq 0 ] && break
		if [ $((SECONDS - start)) -ge $next ]; then
			log "still running after $(elapsed "$start"): ${running[*]}"
			next=$((next + 60))
		fi
		sleep 1
	done
	for i in "${!parallel_pids[@]}"; do
		wait "${parallel_pids[$i]}" || failed+=("${names[$i]}")
	done
	trap - EXIT
	[ ${#failed[@]} -eq 0 ] || {
		log "failed: ${failed[*]}"
		return 1
	}
}

# kill_trees PID...: ends each process, then its descendants (listed
# first: once it is gone they have another parent). Background jobs of a
# script ignore SIGINT, so Ctrl-C alone does not stop them.
kill_trees() {
	local pid children
	for pid in "$@"; do
		children=$(ps -o pid= --ppid "$pid" 2>/dev/null || true)
		kill "$pid" 2>/dev/null || true
		# shellcheck disable=SC2086 # one PID a word
		[ -z "$children" ] || kill_trees $children
	done
}
