#!/usr/bin/env bash
# Writes the σ_min grid of a sweep, one value per line, as dpaudit computes it (the `sigma_min`
# column of a quick GDP-only run of the same sweep: exact shortest round-trip values, so a slice
# of them given back as `--sigma-min v1,v2,…` gives the same rows bit for bit):
#
#   scripts/slurm/sweep-grid.sh DPAUDIT CONFIG.toml 'A..B' POINTS OUT/grid.txt [--log]
set -euo pipefail
fail() { echo "sweep-grid.sh: $*" >&2; exit 2; }
[ $# -ge 5 ] || fail "usage: sweep-grid.sh DPAUDIT CONFIG.toml A..B POINTS GRID.txt [--log]"
bin=$1 config=$2 range=$3 points=$4 grid=$5
shift 5
tmp=$(mktemp "$grid.XXXXXX")
trap 'rm -f "$tmp"' EXIT
"$bin" sweep "$config" --sigma-min "$range" --points "$points" "$@" --sample-rate 1 --accountant gdp \
  --format csv --quiet >"$tmp"
[ "$(head -1 "$tmp" | cut -d, -f1)" = sigma_min ] || fail "$config: the sweep's first column is not sigma_min"
sed 1d "$tmp" | cut -d, -f1 | awk '!seen[$0]++' >"$tmp.grid"
mv "$tmp.grid" "$grid"
echo "$(wc -l <"$grid") σ_min values in $grid"
