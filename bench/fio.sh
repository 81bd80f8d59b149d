#!/usr/bin/env bash
# Data-path benchmark: the same fio jobs on (a) a plain file on the local disk,
# (b) a 1-replica and (c) a 3-replica volume through the FUSE + loop device,
# all in one run. Prints one table: IOPS, bandwidth, mean and p99 latency,
# each target's ratio to (a), and the CPU seconds the engine and replicas
# spent per GiB moved, with the peak memory they held. See bench/README.md.
#
#   bench/fio.sh [runtime-seconds]     (default 15 per job)
#   PERF_JOB=r3-randwrite PERF_OUT=/tmp/perf.data bench/fio.sh   (and profile one job)
#   BASELINE_OXHORN=/path/to/other/oxhorn bench/fio.sh   (also (d) and (e), the
#       same volumes served by that build, and each job's IOPS of this build
#       over that one's: what a change costs)
#   BASELINE_TRANSPORT=dev-fuse bench/fio.sh   (the same, (d) and (e) served
#       through that FUSE transport, by this build unless BASELINE_OXHORN)
#
# The engines take the kernel's FUSE requests through /dev/fuse, or through
# FUSE_TRANSPORT (dev-fuse, io-uring, auto); the fuse module's enable_uring
# is on for the run, put back as it was after.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runtime=${1:-15}
ramp=2
size=$((1 << 30))
hack/install-test-deps.sh >/dev/null
cargo build --release --quiet --bin oxhorn
# Where cargo put it: $CARGO_TARGET_DIR (relative to here, as cargo reads it) or target/.
oxhorn=$(realpath "${CARGO_TARGET_DIR:-target}/release/oxhorn")
work=$(mktemp -d /var/tmp/oxhorn-fio-XXXXXX)
pids=()
uring=/sys/module/fuse/parameters/enable_uring uring_was=
transport=${FUSE_TRANSPORT:-dev-fuse}
cleanup() {
	if [ -n "$uring_was" ]; then echo "$uring_was" >"$uring"; fi
	# Engines first (they unmount and detach), then their replicas.
	for pid in $(printf '%s\n' "${pids[@]}" | tac); do
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
if [ -w "$uring" ]; then
	uring_was=$(<"$uring")
	echo Y >"$uring"
fi

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

# CPU ticks (user + system) the given processes have used so far.
cpu_ticks() {
	local total=0 pid fields
	for pid in "$@"; do
		# Fields 14 and 15 (utime, stime) after the ")" closing the name.
		fields=$(sed 's/.*) //' "/proc/$pid/stat")
		total=$((total + $(awk '{print $12 + $13}' <<<"$fields")))
	done
	echo "$total"
}

# fio_job NAME TARGET RW BS IODEPTH [FIO-ARGS...] -> $work/NAME.json, and
# $work/NAME.cpu: the CPU seconds the volume's processes ($volume_pids) used
# after the ramp.
fio_job() {
	local name=$1 target=$2 rw=$3 bs=$4 depth=$5 sampler profiler=
	shift 5
	# Sampled after the ramp, so the ticks match the bytes fio reports.
	(sleep "$ramp" && cpu_ticks "${volume_pids[@]}" >"$work/$name.ticks") &
	sampler=$!
	# PERF_JOB=r3-randwrite (say) samples the whole machine during that job.
	if [ "$name" = "${PERF_JOB:-}" ]; then
		(sleep "$ramp" && perf record -a -g -F 499 -o "${PERF_OUT:-perf.data}" -- sleep "$runtime" \
			2>/dev/null) &
		profiler=$!
	fi
	fio --name="$name" --filename="$target" --size="$size" --rw="$rw" --bs="$bs" \
		--iodepth="$depth" --ioengine=libaio --direct=1 --time_based --runtime="$runtime" \
		--ramp_time="$ramp" --group_reporting --randrepeat=0 --output-format=json \
		--output="$work/$name.json" "$@" >/dev/null
	wait "$sampler" ${profiler:+"$profiler"}
	echo "$(($(cpu_ticks "${volume_pids[@]}") - $(cat "$work/$name.ticks")))" >"$work/$name.cpu"
}

run_jobs() {
	local label=$1 target=$2
	fio_job "$label-seqwrite" "$target" write 1M 16
	fio_job "$label-randwrite" "$target" randwrite 4k 32
	fio_job "$label-randread" "$target" randread 4k 32
	fio_job "$label-qd1write" "$target" randwrite 4k 1
	# A database's log: each 4K appended and made durable before the next.
	fio_job "$label-syncwrite" "$target" write 4k 1 --fdatasync=1
	# Peak resident memory of the volume's processes, in KiB.
	local pid kib=0
	for pid in "${volume_pids[@]}"; do
		kib=$((kib + $(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status")))
	done
	echo "$kib" >"$work/$label.hwm"
}

# start_volume LABEL REPLICAS [BINARY [TRANSPORT]]: sets $device and
# $volume_pids (not a subshell: $pids must grow); BINARY, by default this
# tree's oxhorn, serves it, its FUSE frontend on TRANSPORT ($transport; empty:
# the binary's default, for builds older than the flag).
start_volume() {
	local label=$1 count=$2 oxhorn=${3:-$oxhorn} fuse=${4-$transport} replicas=() port
	volume_pids=()
	for i in $(seq 1 "$count"); do
		port=$(free_port_pair)
		"$oxhorn" replica --volume "$label" --dir "$work/$label-r$i" --size "$size" \
			--listen "127.0.0.1:$port" \
			>"$work/$label-r$i.log" 2>&1 &
		pids+=($!)
		volume_pids+=($!)
		replicas+=(--replica "127.0.0.1:$port")
	done
	sleep 1
	port=$(free_port_pair)
	"$oxhorn" engine --volume "$label" --generation 1 --size "$size" "${replicas[@]}" --frontend fuse \
		${fuse:+--fuse-transport "$fuse"} \
		--listen "127.0.0.1:$port" --run-dir "$work/run" --dev-dir "$work/dev" \
		>"$work/$label-engine.log" 2>&1 &
	pids+=($!)
	volume_pids+=($!)
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
echo "fio: ${runtime}s per job (after ${ramp}s ramp), 1 GiB target, direct I/O, libaio;" \
	"FUSE over $transport${BASELINE_TRANSPORT:+ (baseline: $BASELINE_TRANSPORT)};" \
	"$(nproc) CPUs, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >&2
truncate -s "$size" "$work/local.img"
volume_pids=()
run_jobs local "$work/local.img"
start_volume r1 1
run_jobs r1 "$device"
start_volume r3 3
run_jobs r3 "$device"
if [ -n "${BASELINE_OXHORN:-}${BASELINE_TRANSPORT:-}" ]; then
	baseline=$(realpath "${BASELINE_OXHORN:-$oxhorn}")
	start_volume b1 1 "$baseline" "${BASELINE_TRANSPORT:-}"
	run_jobs b1 "$device"
	start_volume b3 3 "$baseline" "${BASELINE_TRANSPORT:-}"
	run_jobs b3 "$device"
fi

python3 - "$work" "$(getconf CLK_TCK)" <<'PY'
import json, sys
work, hz = sys.argv[1], int(sys.argv[2])
def load(name):
    job = json.load(open(f"{work}/{name}.json"))["jobs"][0]
    side = job["write"] if job["write"]["io_bytes"] else job["read"]
    lat = side["clat_ns"]
    p99 = lat["percentile"].get("99.000000", 0) / 1000
    cpu = int(open(f"{work}/{name}.cpu").read()) / hz
    gib = side["io_bytes"] / (1 << 30)
    fio_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100
    mean = lat["mean"] / 1000
    sync = job.get("sync", {}).get("lat_ns", {})
    if sync.get("N"):
        # A durable write's time is its write's and its fdatasync's.
        mean += sync["mean"] / 1000
        p99 += sync.get("percentile", {}).get("99.000000", 0) / 1000
    return dict(iops=side["iops"], bw=side["bw"] / 1024, mean=mean,
                p99=p99, cpu_per_gib=cpu / gib if gib else 0, fio_cpu=fio_cpu)
import os
labels = {"local": "local file", "r1": "1 replica", "r3": "3 replicas"}
baseline = os.path.exists(f"{work}/b1.hwm")
if baseline:
    labels |= {"b1": "1 (base)", "b3": "3 (base)"}
print(f"{'job':<16} {'target':<10} {'IOPS':>8} {'MiB/s':>7} {'mean us':>8} {'p99 us':>7} "
      f"{'ratio':>6} {'CPU s/GiB':>9} {'fio CPU':>7}")
jobs = [("seqwrite", "1M write QD16"), ("randwrite", "4K randwrite QD32"),
        ("randread", "4K randread QD32"), ("qd1write", "4K randwrite QD1"),
        ("syncwrite", "4K write+fdatasync")]
for job, title in jobs:
    base = load(f"local-{job}")
    for target in labels:
        r = load(f"{target}-{job}")
        # At QD1 the ratio is of latency (lower is better); elsewhere of IOPS.
        if job in ("qd1write", "syncwrite"):
            ratio = r["mean"] / base["mean"] if base["mean"] else 0
        else:
            ratio = r["iops"] / base["iops"] if base["iops"] else 0
        cpu = f"{r['cpu_per_gib']:.1f}" if target != "local" else "-"
        print(f"{title:<16} {labels[target]:<10} {r['iops']:>8.0f} {r['bw']:>7.1f} {r['mean']:>8.0f} "
              f"{r['p99']:>7.0f} {ratio:>6.2f} {cpu:>9} {r['fio_cpu']:>6.0%}")
print("ratio: IOPS / the local file's; at QD1, mean latency / the local file's (with")
print("fdatasync, the write's and the fdatasync's latency together).")
print("CPU s/GiB: user + system seconds of the engine and replica processes per GiB moved;")
print("fio CPU: fio's own share of one CPU.")
for target in [t for t in labels if t != "local"]:
    kib = int(open(f"{work}/{target}.hwm").read())
    print(f"peak memory, engine + replicas, {labels[target]}: {kib / 1024:.0f} MiB")
if baseline:
    print("\nthis build / the baseline (BASELINE_OXHORN, BASELINE_TRANSPORT), IOPS:")
    for job, title in jobs:
        ratios = [load(f"r{n}-{job}")["iops"] / max(load(f"b{n}-{job}")["iops"], 1e-9)
                  for n in (1, 3)]
        print(f"{title:<18} 1 replica {ratios[0]:.3f}   3 replicas {ratios[1]:.3f}")
PY
