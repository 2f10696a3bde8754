#!/bin/bash
# Two exporter builds, A and B, side by side on this host's noise: ROUNDS
# rounds, each running scripts/bench_exporter.py (100 VMs x 4 vCPUs, 100
# scrapes) for A then B, each with VMs of PLAIN_VMM (a kvmscope without its
# own stats, e.g. 939ba05) and then with VMs of its own build. Prints one
# line per round and exporter: wall median, own scrape time, CPU per scrape
# (ms), without and then with the VMMs' own stats. Take medians per column.
#
#   scripts/bench_exporter_ab.sh A_BINARY B_BINARY PLAIN_VMM [ROUNDS]
set -euo pipefail
a=$1 b=$2 plain=$3 rounds=${4:-5}
cd "$(dirname "$0")/.."
figures() {
    python3 scripts/bench_exporter.py --kvmscope "$1" --vmm-kvmscope "$2" \
        --vms 100 --vcpus 4 --scrapes 100 |
        sed -n 's/^every stat:.*wall median \([0-9.]*\) ms.*own \([0-9.]*\) ms; CPU \([0-9.]*\) .*/\1 \2 \3/p'
}
echo "round exporter | without: wall own cpu | with: wall own cpu"
for r in $(seq "$rounds"); do
    for x in "$a" "$b"; do
        echo "$r $x | $(figures "$x" "$plain") | $(figures "$x" "$x")"
    done
done
