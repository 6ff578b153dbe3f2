#!/usr/bin/env bash
# storeerr.sh SLUICE ENVOYLOAD CONFIG CALLERS...: runs `SLUICE serve
# --config CONFIG` (testdata/serve-redis-deny.yaml) as a process of its
# own, drives its gRPC port (127.0.0.1:18484) with ENVOYLOAD for 60 s per
# caller count, and prints, from sluice's /metrics on 127.0.0.1:18483, how
# many decisions were answered by on_store_error (bench/README.md).
set -euo pipefail
bin=$1 load=$2 cfg=$3
shift 3
"$bin" serve --config "$cfg" >/dev/null 2>&1 &
pid=$!
trap 'kill $pid' EXIT
sleep 2
scrape() {
  curl -s http://127.0.0.1:18483/metrics |
    awk '/^sluice_decisions_total/ { if ($0 ~ /store_error/) e += $2; t += $2 } END { printf "%d %d\n", e, t }'
}
for c in "$@"; do
  read -r e0 t0 < <(scrape)
  "$load" -addr 127.0.0.1:18484 -callers "$c" -duration 60s -warmup 0s | tail -1
  read -r e1 t1 < <(scrape)
  awk -v c="$c" -v e=$((e1 - e0)) -v t=$((t1 - t0)) \
    'BEGIN { printf "callers %d: %d of %d decisions from on_store_error (%.4f%%)\n", c, e, t, 100 * e / t }'
done
