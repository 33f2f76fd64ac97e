#!/usr/bin/env bash
# Screenshots of the HTML reports in docs/img/ (docs/reports.md, "What the reports look like"):
# runs each command into a scratch folder, then headless Chromium takes the top 1400 × 2400 px of
# its report.html. Look at every PNG after running it: conclusion first, no column cut off, one
# limit per report.
#
#   scripts/screenshots.sh                                   # uses target/release/dpaudit
#   DPAUDIT_BIN=/path/to/dpaudit scripts/screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${DPAUDIT_BIN:-target/release/dpaudit}
chrome=${CHROMIUM:-chromium}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

shot() {
  local name=$1
  shift
  echo "== $name: dpaudit $*" >&2
  # Exit 1 (a violated budget or claim) is a finished report too.
  "$bin" "$@" --out "$work/$name" --force -q >/dev/null || [ $? -eq 1 ]
  "$chrome" --headless --no-sandbox --hide-scrollbars --screenshot="docs/img/report-$name.png" \
    --window-size=1400,2400 "file://$work/$name/report.html" 2>/dev/null
}

shot analyze analyze fixtures/samplers/edm-cifar10-paper.toml
shot check check fixtures/events/clt-understates.toml --max-epsilon 0.5
shot verify verify fixtures/claims/dpagg-ti.toml
shot sweep sweep fixtures/samplers/edm-cifar10-paper.toml --sigma-min 0.01..1 --points 12 --log \
  --subsample-rate 1,0.1,0.01 --accountant gdp,rdp,clt --max-epsilon 20
shot mia mia --checkpoint models/digits-rapid.toml --null-test
echo "screenshots in docs/img/report-{analyze,check,verify,sweep,mia}.png" >&2
