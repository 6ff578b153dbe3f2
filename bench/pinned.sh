#!/usr/bin/env bash
# pinned.sh DIR: the benchmarks of bench/README.md that want a quiet machine
# of 16 or more cores, in one run, from binaries built elsewhere (nothing
# is compiled here, so the machine needs no Go). DIR holds, each built with
# CGO_ENABLED=0 (static), optionally gzipped (NAME.gz):
#
#   sluice       cd .. && go build -tags vtprotobuf ./cmd/sluice
#   fd           go build -tags vtprotobuf ./cmd/frontdoor
#   bench.test   go test -c .            (the memory-store comparison)
#   memory.test  cd .. && go test -c ./memory
#   sluice-before (optional) sluice built from an earlier commit: its front
#                doors are driven too, against the same floors
#
# It prints the machine, then:
#   1. BenchmarkMemory on two pinned cores (PAIR_CPUS, default 2,3; -cpu 2);
#   2. BenchmarkMemory's parallel column on every core (-cpu $(nproc));
#   3. the memory store's in-package benchmarks on one core (ONE_CPU, 2);
#   4. frontdoor.sh with the servers on SERVER_CPUS (0-3) and the load on
#      CLIENT_CPUS (4-11), for sluice (and sluice-before).
# Each part's output is also written to $OUT (default /tmp/pinned).
# BENCHTIME (default 400ms) and COUNT (default 6) set the Go benchmarks'
# length; ROUNDS, DURATION and CONNS pass to frontdoor.sh, and so do PAIRS,
# SLICE and RESTARTS (frontdoor pair: alternating slices, medians with
# intervals, over runs on fresh servers).
#
#   CGO_ENABLED=0 ... (the builds above, into .devbin/run) && bench/pinned.sh .devbin/run
set -euo pipefail
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/pinned}
mkdir -p "$out"
bin=$(mktemp -d)
for f in "$dir"/*; do
  [ -f "$f" ] || continue
  case $f in
  *.gz) gzip -dc "$f" >"$bin/$(basename "$f" .gz)" ;;
  *) cp "$f" "$bin/" ;;
  esac
done
chmod +x "$bin"/*
pair=${PAIR_CPUS:-2,3} one=${ONE_CPU:-2} cpus=$(nproc) bt=${BENCHTIME:-400ms} count=${COUNT:-6}

{
  date -u
  uname -r
  lscpu | grep -E '^(Model name|Vendor ID|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L3|CPU max MHz|Hypervisor)'
  cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || true
  uptime
} | tee "$out/machine.txt"

bench() { # bench NAME CPUS ARGS...: a test binary's benchmarks, pinned
  local name=$1 pin=$2
  shift 2
  echo "== $name (cores $pin)"
  taskset -c "$pin" "$@" -test.run '^$' -test.benchmem | grep -E '^(Benchmark|cpu:)' | tee "$out/$name.txt"
}
bench memory-2cores "$pair" "$bin/bench.test" -test.bench 'Memory|Clock|Monotonic' -test.cpu 2 -test.count "$count" -test.benchtime "$bt"
bench memory-allcores "0-$((cpus - 1))" "$bin/bench.test" -test.bench 'Memory/.*/parallel' -test.cpu "$cpus" -test.count $(((count + 1) / 2)) -test.benchtime "$bt"
bench memory-inpackage "$one" "$bin/memory.test" -test.bench 'OneKey|ManyKeysParallel|AllThree' -test.cpu 1 -test.count $(((count + 1) / 2)) -test.benchtime "$bt"

if command -v perf >/dev/null && perf stat -e instructions true 2>&1 | grep -q '[0-9] *instructions'; then
  echo "== perf counters, sluice onekey and serial (core 2)"
  for b in 'Memory/sluice-take/onekey' 'Memory/sethvargo/onekey' 'Memory/sluice-take/serial' 'Memory/sethvargo/serial'; do
    echo "-- $b"
    taskset -c "$one" perf stat -e cycles,instructions,cache-misses,branch-misses "$bin/bench.test" -test.run '^$' -test.bench "$b\$" -test.benchtime 2000000x 2>&1 | grep -E 'ns/op|cycles|instructions|misses'
  done | tee "$out/perf.txt"
else
  echo "== perf: no hardware counters here"
fi

for s in sluice sluice-before; do
  [ -x "$bin/$s" ] || continue
  echo "== front doors: $s, servers on ${SERVER_CPUS:-0-3}, load on ${CLIENT_CPUS:-4-11}"
  "$here/frontdoor.sh" "$bin/$s" "$bin/fd" | tee "$out/frontdoor-$s.txt"
  sleep 1 # the servers' ports are free again before the next
done
