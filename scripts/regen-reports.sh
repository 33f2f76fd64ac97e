#!/usr/bin/env bash
# Regenerates the example reports in reports/ from the shipped fixtures, so that a change in
# dpaudit's numbers or rendering shows up as a diff in review.
#
#   scripts/regen-reports.sh                                   # builds and uses a release binary
#   DPAUDIT_BIN=target/debug/dpaudit scripts/regen-reports.sh  # or any built binary
#
# Each sub-folder holds one report in every format (report.json/.md/.html, CSV tables, plots).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${DPAUDIT_BIN:-target/release/dpaudit}
[ -n "${DPAUDIT_BIN:-}" ] || cargo build --release --quiet

# CI guards on the shipped pipelines (exit 1 = over budget is expected for some: ignore it here).
for name in edm-cifar10-paper edm-cifar10-subsampled; do
  mkdir -p "reports/check-$name"
  "$bin" check "fixtures/samplers/$name.toml" --max-epsilon 8 --out "reports/check-$name" --force >/dev/null || true
done
mkdir -p reports/check-dpsgd-mnist reports/check-clt-understates
"$bin" check fixtures/events/dpsgd-mnist-sigma0.8.toml --max-epsilon 1 --out reports/check-dpsgd-mnist --force >/dev/null || true
"$bin" check fixtures/events/clt-understates.toml --max-epsilon 0.5 --out reports/check-clt-understates --force >/dev/null || true

# Published claims.
for name in dp-rdm-cifar10 dpagg-ti; do
  mkdir -p "reports/verify-$name"
  "$bin" verify "fixtures/claims/$name.toml" --out "reports/verify-$name" --force >/dev/null || true
done
echo "reports regenerated in reports/"
