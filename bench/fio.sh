#!/usr/bin/env bash
# Data-path benchmark: the same fio jobs on (a) a plain file on the local disk,
# (b) a 1-replica and (c) a 3-replica volume through the FUSE + loop device,
# all in one run, printing IOPS, bandwidth, p99 latency and each ratio to (a).
# Targets (DESIGN.md): 3-replica randwrite >= 0.40, 1-replica >= 0.60,
# randread >= 0.60.
#
#   bench/fio.sh [runtime-seconds]     (default 15 per job)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runtime=${1:-15}
size=$((1 << 30))
hack/install-test-deps.sh >/dev/null
cargo build --release --quiet --bin oxhorn
# Where cargo put it: $CARGO_TARGET_DIR (relative to here, as cargo reads it) or target/.
oxhorn=$(realpath "${CARGO_TARGET_DIR:-target}/release/oxhorn")
work=$(mktemp -d /var/tmp/oxhorn-fio-XXXXXX)
pids=()
cleanup() {
	# Engines first (they unmount and detach), then their replicas.
	for pid in $(printf '%s\n' "${pids[@]}" | tac); do
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

free_port_pair() {
	python3 - <<'PY'
import socket
while True:
    a = socket.socket(); a.bind(("127.0.0.1", 0)); port = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", port + 1)); print(port); break
    except OSError:
        pass
    finally:
        a.close(); b.close()
PY
}

# fio_job NAME TARGET RW BS IODEPTH -> JSON file
fio_job() {
	local name=$1 target=$2 rw=$3 bs=$4 depth=$5
	fio --name="$name" --filename="$target" --size="$size" --rw="$rw" --bs="$bs" \
		--iodepth="$depth" --ioengine=libaio --direct=1 --time_based --runtime="$runtime" \
		--ramp_time=2 --group_reporting --randrepeat=0 --output-format=json \
		--output="$work/$name.json" >/dev/null
}

run_jobs() {
	local label=$1 target=$2
	fio_job "$label-seqwrite" "$target" write 1M 16
	fio_job "$label-randwrite" "$target" randwrite 4k 32
	fio_job "$label-randread" "$target" randread 4k 32
}

# start_volume LABEL REPLICAS: sets $device (not a subshell: $pids must grow)
start_volume() {
	local label=$1 count=$2 replicas=() port
	for i in $(seq 1 "$count"); do
		port=$(free_port_pair)
		"$oxhorn" replica --volume "$label" --dir "$work/$label-r$i" --size "$size" \
			--listen "127.0.0.1:$port" \
			>"$work/$label-r$i.log" 2>&1 &
		pids+=($!)
		replicas+=(--replica "127.0.0.1:$port")
	done
	sleep 1
	port=$(free_port_pair)
	"$oxhorn" engine --volume "$label" --generation 1 --size "$size" "${replicas[@]}" --frontend fuse \
		--listen "127.0.0.1:$port" --run-dir "$work/run" --dev-dir "$work/dev" \
		>"$work/$label-engine.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 100); do
		[ -L "$work/dev/$label" ] && break
		sleep 0.1
	done
	device=$(readlink -e "$work/dev/$label")
}

# The data plane admits only processes holding the volume's key; one key
# serves every volume here, as each volume's processes share it.
OXHORN_VOLUME_KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export OXHORN_VOLUME_KEY
echo "fio: ${runtime}s per job, 1 GiB target, direct I/O, libaio" >&2
truncate -s "$size" "$work/local.img"
run_jobs local "$work/local.img"
start_volume r1 1
run_jobs r1 "$device"
start_volume r3 3
run_jobs r3 "$device"

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def load(name):
    job = json.load(open(f"{work}/{name}.json"))["jobs"][0]
    side = job["write"] if job["write"]["io_bytes"] else job["read"]
    p99 = side["clat_ns"]["percentile"].get("99.000000", 0) / 1000
    return side["iops"], side["bw"] / 1024, p99
print(f"{'job':<10} {'target':<10} {'IOPS':>10} {'MiB/s':>9} {'p99 us':>9} {'ratio':>7}")
for job in ["seqwrite", "randwrite", "randread"]:
    base = load(f"local-{job}")
    for target in ["local", "r1", "r3"]:
        iops, bw, p99 = load(f"{target}-{job}")
        ratio = iops / base[0] if base[0] else 0
        label = {"local": "local file", "r1": "1 replica", "r3": "3 replicas"}[target]
        print(f"{job:<10} {label:<10} {iops:>10.0f} {bw:>9.1f} {p99:>9.0f} {ratio:>7.2f}")
PY
