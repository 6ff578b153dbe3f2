#!/usr/bin/env bash
# wrkpair.sh SLUICE FD: sluice serve's HTTP doors against a bare net/http
# handler, measured by wrk, an independent load generator: both servers
# pinned to SERVER_CPUS (default 0), wrk (1 thread, CONNS connections,
# default 16) on CLIENT_CPUS (default 1), X-User or the take's key drawn
# from 10,000 users (wrk/auth.lua, wrk/take.lua). The proxy door is
# sluice's reverse proxy against a Go reverse proxy that decides nothing
# (frontdoor bareproxy, the same transport settings), both in front of
# the bare handler, all three on SERVER_CPUS, driven with wrk/auth.lua's
# requests. Each pair drives the floor and sluice for DURATION each
# (default 4s), alternating which goes first; PAIRS pairs (default 10)
# per door in DOORS (default "auth take proxy"). Prints each pair's
# requests per second and their ratio (sluice over the floor), then the
# median ratio per door.
#
#   cd bench && CGO_ENABLED=0 go build -o /tmp/fd ./cmd/frontdoor &&
#     (cd .. && CGO_ENABLED=0 go build -o /tmp/sluice ./cmd/sluice)
#   ./wrkpair.sh /tmp/sluice /tmp/fd
set -euo pipefail
sluice=$1 fd=$2
here=$(cd "$(dirname "$0")" && pwd)
server=${SERVER_CPUS:-0} client=${CLIENT_CPUS:-1} conns=${CONNS:-16}
dur=${DURATION:-4s} pairs=${PAIRS:-10} doors=${DOORS:-auth take proxy}
pids=()
stop() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT
taskset -c "$server" "$fd" bare -listen 127.0.0.1:18490 >/dev/null 2>&1 &
pids+=($!)
taskset -c "$server" "$sluice" serve --config "$here/testdata/frontdoor-http.yaml" --grpc-listen off --shutdown-drain 0 >/dev/null 2>&1 &
pids+=($!)
taskset -c "$server" "$fd" bareproxy -listen 127.0.0.1:18493 -upstream http://127.0.0.1:18490 >/dev/null 2>&1 &
pids+=($!)
taskset -c "$server" "$sluice" serve --config "$here/testdata/frontdoor-proxy.yaml" --grpc-listen off --shutdown-drain 0 >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  curl -sf -o /dev/null http://127.0.0.1:18490/v1/auth && curl -sf -o /dev/null -H 'X-User: u' http://127.0.0.1:18492/v1/auth &&
    curl -sf -o /dev/null -H 'X-User: u' http://127.0.0.1:18493/v1/auth && curl -sf -o /dev/null -H 'X-User: u' http://127.0.0.1:18498/v1/auth && break
  sleep 0.1
done
rps() { # rps ADDR DOOR: requests per second; a non-2xx answer fails the run
  local out script=$2 path=$2
  [ "$2" = proxy ] && script=auth path=auth # the proxied request is auth.lua's
  out=$(taskset -c "$client" wrk -t1 -c"$conns" -d"$dur" -s "$here/wrk/$script.lua" "http://$1/v1/$path")
  if grep -q "Non-2xx" <<<"$out"; then echo "non-2xx answers from $1: $out" >&2; exit 1; fi
  awk '/Requests\/sec/ {print $2}' <<<"$out"
}
for door in $doors; do
  ratios=()
  floor=127.0.0.1:18490 mine=127.0.0.1:18492
  [ "$door" = proxy ] && floor=127.0.0.1:18493 mine=127.0.0.1:18498
  for i in $(seq "$pairs"); do
    if [ $((i % 2)) = 1 ]; then b=$(rps $floor "$door"); s=$(rps $mine "$door")
    else s=$(rps $mine "$door"); b=$(rps $floor "$door"); fi
    r=$(awk -v s="$s" -v b="$b" 'BEGIN {printf "%.3f", s / b}')
    ratios+=("$r")
    echo "$door pair $i: floor $b req/s, sluice $s req/s, ratio $r"
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk -v d="$door" '{a[NR]=$1} END {m = NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%s: median ratio %.3f (%s to %s) over %d pairs\n", d, m, a[1], a[NR], NR}'
done
