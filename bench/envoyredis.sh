#!/usr/bin/env bash
# envoyredis.sh SLUICE REFERENCE ENVOYLOAD: the Envoy rate limit service on
# Redis, sluice serve beside envoyproxy/ratelimit (REFERENCE, built with
# `go build ./src/service_cmd`), both on testdata/envoy-reference.yaml, the
# layout of bench/README.md ("Envoy rate limit service on Redis, on
# Intel"): the server on SERVER_CPU (default 0), redis-server on REDIS_CPU
# (default 1), the load client on CLIENT_CPUS (default 1).
#
# ROUNDS (default 4) rounds, each running sluice and then the reference,
# each on a fresh redis-server and a fresh server: envoyload -client CLIENT
# (default h2) with 64 callers over 4 connections, WARMUP (default 2s) and
# DURATION (default 6s), printing calls/s, latencies and each process's CPU
# per call. REDIS_SERVER (default redis-server) names the Redis binary, or
# a wrapper that execs it (its PID must be Redis's). Binaries built as in
# bench/README.md; nothing is compiled here.
set -euo pipefail
sluice=$1 reference=$2 envoyload=$3
here=$(cd "$(dirname "$0")" && pwd)
server_cpu=${SERVER_CPU:-0} redis_cpu=${REDIS_CPU:-1} client_cpus=${CLIENT_CPUS:-1}
rounds=${ROUNDS:-4} client=${CLIENT:-h2} duration=${DURATION:-6s} warmup=${WARMUP:-2s}
redis=${REDIS_SERVER:-redis-server}
rt=$(mktemp -d)
mkdir -p "$rt/ratelimit/config"
cp "$here/testdata/envoy-reference.yaml" "$rt/ratelimit/config/config.yaml"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null || true; pids=(); }
trap 'stop; rm -rf "$rt"' EXIT

listening() { # listening PORT PID: waits until PORT accepts, or PID has exited
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.05
  done
  echo "envoyredis.sh: nothing listens on port $1" >&2
  return 1
}

run() { # run sluice|reference ROUND
  taskset -c "$redis_cpu" $redis --port 16493 --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
  local rpid=$!
  pids+=("$rpid")
  listening 16493 "$rpid"
  if [ "$1" = sluice ]; then
    LIMIT_RESPONSE_HEADERS_ENABLED=false REDIS_URL='redis://127.0.0.1:16493?timeout=1s' GRPC_PORT=18496 \
      taskset -c "$server_cpu" "$sluice" serve -config "$here/testdata/envoy-reference.yaml" \
      -listen 127.0.0.1:18495 -shutdown-drain 0 >/dev/null 2>&1 &
  else
    USE_STATSD=false REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:16493 GRPC_PORT=18496 PORT=18495 \
      DEBUG_PORT=18497 RUNTIME_ROOT="$rt" RUNTIME_SUBDIRECTORY=ratelimit LOG_LEVEL=warn \
      taskset -c "$server_cpu" "$reference" >/dev/null 2>&1 &
  fi
  local spid=$!
  pids+=("$spid")
  listening 18496 "$spid"
  echo "== round $2: $1, $client client"
  taskset -c "$client_cpus" "$envoyload" -addr 127.0.0.1:18496 -pid "$spid" -redis-pid "$rpid" \
    -callers 64 -duration "$duration" -warmup "$warmup" -client "$client"
  stop
  sleep 0.5 # the ports are free again
}

for r in $(seq "$rounds"); do
  run sluice "$r"
  run reference "$r"
done
