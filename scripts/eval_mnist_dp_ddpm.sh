#!/usr/bin/env bash
# The docs/attacks.md table of the DP MNIST diffusion model and its non-private twin: loss, SecMI
# and PIA at t = 10, 50, 100, 200 on a seeded random 1,000 members and 1,000 non-members of
# fixtures/splits/mnist-dp.toml (AUC, TPR at 1 % and 0.1 % FPR, held-out ASR with its interval,
# each beside the limit of the DP model's ledger), the one-run audit of the DP model's canaries
# (ε lower bound against the accounted ε) and a sample grid of each model.
#
#   scripts/eval_mnist_dp_ddpm.sh DPAUDIT MODELS_DIR OUT [cpu|cuda]
#
# MODELS_DIR holds mnist-dp-ddpm/ (trained with canaries) and mnist-nodp-ddpm/, as
# scripts/train_mnist_dp_ddpm.sh writes them. Writes OUT/<model>/ (mia.md, mia.json, …),
# OUT/<model>.png and prints each report.
set -euo pipefail
if [ $# -lt 3 ]; then sed -n '2,12p' "$0" >&2; exit 2; fi
BIN=$1; MODELS=$2; OUT=$3; DEV=${4:-cpu}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DATA=fixtures/data/mnist/mnist-10k.u8.gz
SPLIT=fixtures/splits/mnist-dp.toml
: "${MAX:=1000}" "${PY:=/work/pyvenv/bin/python}"
mkdir -p "$OUT"
# PARALLEL=1: the two models at once (two processes; RAYON_NUM_THREADS=1 on a small machine).
one() {
  "$BIN" mia --checkpoint "$MODELS/$1" --data "$DATA" --split "$SPLIT" --device "$DEV" \
    --attack loss,secmi,pia --timesteps 10,50,100,200 --max-examples "$MAX" --seed 0 \
    --out "$OUT/$1" --scores-out "$OUT/$1.scores.csv" --format md --force -q
  "$PY" scripts/sample_grid.py "$MODELS/$1" "$OUT/$1.png"
}
pids=()
for m in mnist-dp-ddpm mnist-nodp-ddpm; do
  if [ "${PARALLEL:-0}" = 1 ]; then one "$m" > "$OUT/$m.txt" 2>&1 & pids+=($!); else one "$m" | tee "$OUT/$m.txt"; fi
done
for p in ${pids[@]+"${pids[@]}"}; do wait "$p"; done
if grep -q '^\[canaries\]' "$MODELS/mnist-dp-ddpm/dpaudit-card.toml"; then
  "$BIN" mia --checkpoint "$MODELS/mnist-dp-ddpm" --data "$DATA" --split "$SPLIT" \
    --device "$DEV" --audit one-run --attack loss,pia --timesteps 10,50,100 --max-examples 200 \
    --seed 0 --out "$OUT/mnist-dp-ddpm-audit" --format md --force -q
fi
