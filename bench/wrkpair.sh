#!/usr/bin/env bash
# wrkpair.sh SLUICE FD: sluice serve's HTTP doors against a bare net/http
# handler, measured by wrk, an independent load generator: both servers
# pinned to SERVER_CPUS (default 0), wrk (1 thread, CONNS connections,
# default 16) on CLIENT_CPUS (default 1), X-User or the take's key drawn
# from 10,000 users (wrk/auth.lua, wrk/take.lua). Each pair drives the
# bare handler and sluice for DURATION each (default 4s), alternating
# which goes first; PAIRS pairs (default 10) per door in DOORS (default
# "auth take"). Prints each pair's requests per second and their ratio
# (sluice over bare), then the median ratio per door.
#
#   cd bench && CGO_ENABLED=0 go build -o /tmp/fd ./cmd/frontdoor &&
#     (cd .. && CGO_ENABLED=0 go build -o /tmp/sluice ./cmd/sluice)
#   ./wrkpair.sh /tmp/sluice /tmp/fd
set -euo pipefail
sluice=$1 fd=$2
here=$(cd "$(dirname "$0")" && pwd)
server=${SERVER_CPUS:-0} client=${CLIENT_CPUS:-1} conns=${CONNS:-16}
dur=${DURATION:-4s} pairs=${PAIRS:-10} doors=${DOORS:-auth take}
pids=()
stop() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT
taskset -c "$server" "$fd" bare -listen 127.0.0.1:18490 >/dev/null 2>&1 &
pids+=($!)
taskset -c "$server" "$sluice" serve --config "$here/testdata/frontdoor-http.yaml" --grpc-listen off --shutdown-drain 0 >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  curl -sf -o /dev/null http://127.0.0.1:18490/v1/auth && curl -sf -o /dev/null -H 'X-User: u' http://127.0.0.1:18492/v1/auth && break
  sleep 0.1
done
rps() { # rps ADDR DOOR: requests per second; a non-2xx answer fails the run
  local out
  out=$(taskset -c "$client" wrk -t1 -c"$conns" -d"$dur" -s "$here/wrk/$2.lua" "http://$1/v1/$2")
  if grep -q "Non-2xx" <<<"$out"; then echo "non-2xx answers from $1: $out" >&2; exit 1; fi
  awk '/Requests\/sec/ {print $2}' <<<"$out"
}
for door in $doors; do
  ratios=()
  for i in $(seq "$pairs"); do
    if [ $((i % 2)) = 1 ]; then b=$(rps 127.0.0.1:18490 "$door"); s=$(rps 127.0.0.1:18492 "$door")
    else s=$(rps 127.0.0.1:18492 "$door"); b=$(rps 127.0.0.1:18490 "$door"); fi
    r=$(awk -v s="$s" -v b="$b" 'BEGIN {printf "%.3f", s / b}')
    ratios+=("$r")
    echo "$door pair $i: bare $b req/s, sluice $s req/s, ratio $r"
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk -v d="$door" '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%s: median ratio %.3f (%s to %s) over %d pairs\n", d, m, a[1], a[NR], NR}'
done
