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
#   bench-before.test, memory-before.test (optional) the test binaries of
#                an earlier commit: each run of parts 1-3 alternates with a
#                run of the earlier binary, written beside it as
#                NAME-before.txt, for benchstat
#   envoyload, ratelimit (optional) cd bench && go build -tags vtprotobuf
#                ./cmd/envoyload, and envoyproxy/ratelimit's
#                `go build ./src/service_cmd`: with both, and redis-server
#                on PATH (or REDIS_SERVER), envoyredis.sh runs sluice and
#                the reference on Redis, the server on ENVOY_CPUS (default
#                12,13,14: the server's, Redis's and the load's core)
#
# It prints the machine, then:
#   1. BenchmarkMemory on two pinned cores (PAIR_CPUS, default 2,3; -cpu 2);
#   2. BenchmarkMemory's parallel column on every core (-cpu $(nproc));
#   3. the memory store's in-package benchmarks on one core (ONE_CPU, 2);
#   4. frontdoor.sh with the servers on SERVER_CPUS (0-3) and the load on
#      CLIENT_CPUS (4-11), for sluice (and sluice-before);
#   5. envoyredis.sh, where its binaries are here.
# Each part's output is also written to $OUT (default /tmp/pinned).
# PARTS (default "1 2 3 4 5") names the parts to run, and MEMORY_BENCH
# (default 'Memory|Clock|Monotonic') part 1's benchmarks, for a run that
# must fit a short lease.
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
parts=" ${PARTS:-1 2 3 4 5} "
part() { [[ $parts == *" $1 "* ]]; }

{
  date -u
  uname -r
  lscpu | grep -E '^(Model name|Vendor ID|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L3|CPU max MHz|Hypervisor)'
  cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || true
  uptime
} | tee "$out/machine.txt"

bench() { # bench NAME CPUS BINARY ARGS...: a test binary's benchmarks, pinned;
  # with BINARY-before beside it, COUNT runs of one each, alternated
  local name=$1 pin=$2 binary=$3 n=1 prev=
  shift 3
  echo "== $name (cores $pin)"
  if [ -x "${binary%.test}-before.test" ]; then
    for a in "$@"; do case $prev in -test.count) n=$a ;; esac; prev=$a; done
    : >"$out/$name.txt"
    : >"$out/$name-before.txt"
    for _ in $(seq "$n"); do
      taskset -c "$pin" "$binary" "$@" -test.count 1 -test.run '^$' -test.benchmem | grep -E '^(Benchmark|cpu:)' | tee -a "$out/$name.txt"
      taskset -c "$pin" "${binary%.test}-before.test" "$@" -test.count 1 -test.run '^$' -test.benchmem | grep -E '^(Benchmark|cpu:)' | sed 's/^/before: /' | tee -a "$out/$name-before.txt"
    done
    sed -i 's/^before: //' "$out/$name-before.txt"
    return
  fi
  taskset -c "$pin" "$binary" "$@" -test.run '^$' -test.benchmem | grep -E '^(Benchmark|cpu:)' | tee "$out/$name.txt"
}
part 1 && bench memory-2cores "$pair" "$bin/bench.test" -test.bench "${MEMORY_BENCH:-Memory|Clock|Monotonic}" -test.cpu 2 -test.count "$count" -test.benchtime "$bt"
part 2 && bench memory-allcores "0-$((cpus - 1))" "$bin/bench.test" -test.bench 'Memory/.*/parallel' -test.cpu "$cpus" -test.count $(((count + 1) / 2)) -test.benchtime "$bt"
part 3 && bench memory-inpackage "$one" "$bin/memory.test" -test.bench 'OneKey|ManyKeysParallel|AllThree' -test.cpu 1 -test.count $(((count + 1) / 2)) -test.benchtime "$bt"

if ! part 1; then
  :
elif command -v perf >/dev/null && perf stat -e instructions true 2>&1 | grep -q '[0-9] *instructions'; then
  echo "== perf counters, sluice onekey and serial (core 2)"
  for b in 'Memory/sluice-take/onekey' 'Memory/sethvargo/onekey' 'Memory/sluice-take/serial' 'Memory/sethvargo/serial'; do
    echo "-- $b"
    taskset -c "$one" perf stat -e cycles,instructions,cache-misses,branch-misses "$bin/bench.test" -test.run '^$' -test.bench "$b\$" -test.benchtime 2000000x 2>&1 | grep -E 'ns/op|cycles|instructions|misses'
  done | tee "$out/perf.txt"
else
  echo "== perf: no hardware counters here"
fi

for s in sluice sluice-before; do
  part 4 && [ -x "$bin/$s" ] || continue
  echo "== front doors: $s, servers on ${SERVER_CPUS:-0-3}, load on ${CLIENT_CPUS:-4-11}"
  "$here/frontdoor.sh" "$bin/$s" "$bin/fd" | tee "$out/frontdoor-$s.txt"
  sleep 1 # the servers' ports are free again before the next
done

if part 5 && [ -x "$bin/envoyload" ] && [ -x "$bin/ratelimit" ]; then
  IFS=, read -r ecore rcore lcores <<<"${ENVOY_CPUS:-12,13,14}"
  echo "== Envoy service on Redis: server on core $ecore, Redis on $rcore, load on $lcores"
  SERVER_CPU=$ecore REDIS_CPU=$rcore CLIENT_CPUS=$lcores "$here/envoyredis.sh" "$bin/sluice" "$bin/ratelimit" "$bin/envoyload" | tee "$out/envoyredis.txt"
fi
