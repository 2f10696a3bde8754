#!/bin/bash
# Migration total time, pages and downtime for a 1 GiB guest whose vCPU wrote
# 512 MiB of zeros (backed on the source, so planned, then sent as zero runs)
# or of data, with two builds in turn: what the destination's prefetch bound
# costs a genuine migration (docs/BENCHMARKS.md).
#
#   scripts/bench_prefetch_zero.sh BUILD_A BUILD_B [ROUNDS]
set -u
if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_A BUILD_B [ROUNDS]" >&2
  exit 2
fi
A=$1
B=$2
ROUNDS=${3:-3}
for round in $(seq 1 "$ROUNDS"); do
  for K in "$A" "$B"; do
    for w in touch-zero touch; do
      D=$(mktemp -d /tmp/kvmscope-prefetch.XXXX)
      "$K" run --socket "$D/src.sock" --memory 1G --workload "$w size=512M" >/dev/null 2>&1 &
      S=$!
      "$K" run --incoming "unix:$D/m.sock" --socket "$D/dst.sock" --memory 1G --vcpus 1 >/dev/null 2>&1 &
      T=$!
      sleep 4
      "$K" migrate --socket "$D/src.sock" --to "unix:$D/m.sock" --json 2>/dev/null |
        python3 -c 'import json, sys; v = json.load(sys.stdin); r = v["ram"]
print("total %s ms, downtime %s ms, normal %s, duplicate %s" % (v.get("total-time"), v.get("downtime"), r["normal"], r["duplicate"]))' |
        sed "s|^|round $round $K $w: |"
      kill -TERM "$T" "$S" 2>/dev/null
      wait "$T" "$S" 2>/dev/null
      rm -rf "$D"
    done
  done
done
