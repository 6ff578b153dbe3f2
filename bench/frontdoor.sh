#!/usr/bin/env bash
# frontdoor.sh SLUICE FRONTDOOR: sluice's front doors against their floors,
# each server a process of its own pinned to SERVER_CPUS (default 0-3),
# the load client (FRONTDOOR load) pinned to CLIENT_CPUS (default 4-11).
# For each door of DOORS (default "auth take grpc") it alternates ROUNDS (default 3) rounds
# of DURATION (default 10s) on the floor and on sluice, and prints each
# round's line, then per door: calls/s of each, their ratio, the server's
# CPU per call of each and the difference (bench/README.md, "Front doors against their floors").
# RATE (calls/s, default 0: a closed loop) offers both sides the same load
# instead, below what either can take, so that the CPU per call compares
# the same traffic rather than two servers saturated differently.
# PAIRS (default 0: off) instead drives each door's floor and sluice
# alternately in that many pairs of SLICE (default 250ms) each, one
# process of the load client (frontdoor pair), and prints per door the
# median and 95% interval of sluice's extra CPU per call, of the CPU
# ratio (the calls/s ratio of a saturated server) and of the calls/s
# ratio: what a shared machine's drift does not move.
# RESTARTS (default 1), with PAIRS, runs each door's pairs that many
# times, each on servers started afresh, and then prints the median and
# 95% interval of the runs' median extras (frontdoor medians): two
# processes of one binary differ by more than the pairs of one run show
# (where their memory landed, what their caches share), so comparing
# builds needs runs on several processes.
#
# Both built as the image builds sluice, with the generated marshalling:
#
#   cd bench && CGO_ENABLED=0 go build -tags vtprotobuf -o /tmp/fd ./cmd/frontdoor &&
#     (cd .. && CGO_ENABLED=0 go build -tags vtprotobuf -o /tmp/sluice ./cmd/sluice) &&
#     ./frontdoor.sh /tmp/sluice /tmp/fd
set -euo pipefail
sluice=$1 fd=$2
here=$(cd "$(dirname "$0")" && pwd)
server=${SERVER_CPUS:-0-3} client=${CLIENT_CPUS:-4-11}
rounds=${ROUNDS:-3} duration=${DURATION:-10s} conns=${CONNS:-64} doors=${DOORS:-auth take grpc} rate=${RATE:-0}
pairs=${PAIRS:-0} slice=${SLICE:-250ms} restarts=${RESTARTS:-1}
pids=()
stop() { kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null || true; pids=(); }
# The servers are gone, and their ports free, when this script ends.
trap stop EXIT

start() { # start NAME CMD...: runs CMD pinned to the server cores
  taskset -c "$server" "${@:2}" >/dev/null 2>&1 &
  pids+=($!)
  eval "$1=$!"
}
start_all() {
  start bare "$fd" bare -listen 127.0.0.1:18490
  start noop "$fd" noop -listen 127.0.0.1:18491
  start shttp "$sluice" serve --config "$here/testdata/frontdoor-http.yaml" --grpc-listen off
  start sgrpc "$sluice" serve --config "$here/testdata/frontdoor-grpc.yaml"
  sleep 2
  # Every server is up and listening before the first load: on a busy
  # machine two seconds may not be enough, and a server that exited (its
  # port taken) is named here rather than by the load's failure.
  for port in 18490 18491 18492 18494 18495; do
    for _ in $(seq 100); do
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
      sleep 0.1
    done
  done
  for name in bare noop shttp sgrpc; do
    kill -0 "${!name}" 2>/dev/null || { echo "frontdoor.sh: the $name server exited at start (is its port taken?)" >&2; exit 1; }
  done
}
start_all
fresh=1 # the servers have answered no pair yet

load() { # load DOOR ADDR PID SIDE
  printf '%s ' "$4"
  taskset -c "$client" "$fd" load -door "$1" -addr "$2" -pid "$3" -conns "$conns" -duration "$duration" -rate "$rate"
}
sides() { # sides DOOR: floor and mine, each (ADDR PID), of the servers running
  case $1 in
  grpc) floor=(127.0.0.1:18491 "$noop") mine=(127.0.0.1:18495 "$sgrpc") ;;
  *) floor=(127.0.0.1:18490 "$bare") mine=(127.0.0.1:18492 "$shttp") ;;
  esac
}
out=$(mktemp)
for door in $doors; do
  sides "$door"
  if ((pairs > 0)); then
    extras=()
    for r in $(seq "$restarts"); do
      if ((restarts > 1 && !fresh)); then
        stop; start_all; sides "$door"
      fi
      fresh=0
      line=$(taskset -c "$client" "$fd" pair -door "$door" -floor "${floor[0]}" -floor-pid "${floor[1]}" -addr "${mine[0]}" -pid "${mine[1]}" \
        -conns "$conns" -rate "$rate" -pairs "$pairs" -slice "$slice")
      echo "$line"
      extras+=("$(sed -n 's/.*extra µs\/call \([-0-9.]*\) .*/\1/p' <<<"$line")")
    done
    ((restarts > 1)) && "$fd" medians -door "$door" -- "${extras[@]}"
    continue
  fi
  for r in $(seq "$rounds"); do
    if ((r % 2)); then
      load "$door" "${floor[@]}" floor; load "$door" "${mine[@]}" sluice
    else
      load "$door" "${mine[@]}" sluice; load "$door" "${floor[@]}" floor
    fi
  done | tee -a "$out"
done
# Per door: calls/s and CPU per call over all rounds of each side.
((pairs > 0)) || awk '{ k = $2; s = $1; n[k, s] += $4; r[k, s] += $6; c[k, s] += $8 * $4; m[k, s]++; doors[k] = 1 }
  END { for (k in doors) {
    fr = r[k, "floor"] / m[k, "floor"]; sr = r[k, "sluice"] / m[k, "sluice"]
    fc = c[k, "floor"] / n[k, "floor"]; sc = c[k, "sluice"] / n[k, "sluice"]
    printf "%s: floor %.0f calls/s, sluice %.0f calls/s, ratio %.2f; server CPU floor %.2f µs/call, sluice %.2f, extra %.2f\n", k, fr, sr, sr / fr, fc, sc, sc - fc } }' "$out"
