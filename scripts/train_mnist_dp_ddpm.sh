#!/usr/bin/env bash
# Trains the shipped demonstration pair on the MNIST split fixtures/splits/mnist-dp.toml (4,000
# members, 2,000 non-members, made by scripts/make_mnist_split.py; remade if missing):
#   OUT/mnist-dp-ddpm     DP-SGD (Poisson q, clip C, noise σ, Adam, EMA), the mnist-ddpm
#                         architecture, with m canaries (CANARIES, default 1000: each joins the
#                         private rows with probability ½) for `mia --audit one-run`
#   OUT/mnist-nodp-ddpm   its non-private twin: same architecture, steps, lr, EMA, and a fixed
#                         batch of the DP run's expected size q·n (no canaries, no clipping/noise)
#
#   scripts/train_mnist_dp_ddpm.sh DPAUDIT cpu|cuda OUT
#
# Defaults (override with the environment variables in brackets): σ = 2.28 [SIGMA], q = 0.25 [Q]
# (≈ 1,125 of 4,500 rows per step), 200 steps [STEPS] -> PLD ε ≈ 8 at δ = 1e-5; lr 2e-3 [LR],
# EMA 0.999 [EMA], C = 1 [CLIP], δ = 1e-5, per-sample chunk 256 [CHUNK], a checkpoint every 25
# steps [EVERY] in OUT/<name>/checkpoint/ (resume with --init).
# DP noise, Poisson sampling, the canaries and the initial weights come from the OS CSPRNG unless
# SEED is set (a seeded run is not private against anyone who knows the seed). Existing folders
# are refused unless FORCE=1. Each run writes its card (dpaudit-card.toml: the command, hashes, ε)
# and the DP run its ledger (dpaudit-ledger.toml); stderr goes to OUT/<name>.log. PARALLEL=1
# trains the two at once (two processes; set RAYON_NUM_THREADS=1 on a small CPU machine).
set -euo pipefail
if [ $# -ne 3 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
BIN=$1
DEV=$2
OUT=$3
case "$DEV" in
  cpu|cuda) ;;
  *) echo "device must be cpu or cuda, got '$DEV'" >&2; exit 2 ;;
esac
: "${STEPS:=200}" "${CHUNK:=256}" "${CANARIES:=1000}" "${EVERY:=25}"
: "${SIGMA:=2.28}" "${Q:=0.25}" "${LR:=2e-3}" "${EMA:=0.999}" "${CLIP:=1}"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SPLIT=fixtures/splits/mnist-dp.toml
DATA=fixtures/data/mnist/mnist-10k.u8.gz
if [ ! -f "$SPLIT" ]; then
  python3 scripts/make_mnist_split.py --members 4000 --nonmembers 2000 --seed 1 --out "$SPLIT" \
    --note "models/mnist-dp-ddpm and its non-private twin"
fi
MEMBERS=$(grep -c . <(grep '^members = ' "$SPLIT" | tr ',' '\n'))
# The DP run's expected batch: q · (members + the canaries that join, m/2 on average).
BATCH=$(awk "BEGIN { printf \"%d\", $Q * ($MEMBERS + $CANARIES / 2) + 0.5 }")
EXTRA=()
if [ -n "${SEED:-}" ]; then EXTRA+=(--seed "$SEED"); fi
if [ "${FORCE:-0}" = 1 ]; then EXTRA+=(--force); fi
mkdir -p "$OUT"
echo "members: $MEMBERS; DP: σ=$SIGMA q=$Q C=$CLIP steps=$STEPS lr=$LR; twin batch $BATCH" >&2
"$BIN" account --noise-multiplier "$SIGMA" --sample-rate "$Q" --steps "$STEPS" --delta 1e-5 --accountant pld >&2
# glibc: keep freed buffers instead of returning them to the OS after every layer (halves the
# system time of the per-sample gradient pass on CPU; no effect on the results).
export MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_:-1073741824}
export MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-1073741824}
set -x
CAN=()
if [ "$CANARIES" -gt 0 ]; then CAN+=(--canaries "$CANARIES"); fi
/usr/bin/time -v "$BIN" train --unet mnist-ddpm --device "$DEV" --data "$DATA" --split "$SPLIT" \
  --dp --noise-multiplier "$SIGMA" --clip "$CLIP" --sample-rate "$Q" --delta 1e-5 \
  --steps "$STEPS" --batch-size "$CHUNK" --lr "$LR" --ema "$EMA" ${CAN[@]+"${CAN[@]}"} \
  --checkpoint-every "$EVERY" ${EXTRA[@]+"${EXTRA[@]}"} \
  --out "$OUT/mnist-dp-ddpm" 2> "$OUT/mnist-dp-ddpm.log" > "$OUT/mnist-dp-ddpm.out" &
DP_PID=$!
if [ "${PARALLEL:-0}" != 1 ]; then wait "$DP_PID"; fi
/usr/bin/time -v "$BIN" train --unet mnist-ddpm --device "$DEV" --data "$DATA" --split "$SPLIT" \
  --steps "$STEPS" --batch-size "$BATCH" --lr "$LR" --ema "$EMA" --checkpoint-every "$EVERY" \
  ${EXTRA[@]+"${EXTRA[@]}"} \
  --out "$OUT/mnist-nodp-ddpm" 2> "$OUT/mnist-nodp-ddpm.log" > "$OUT/mnist-nodp-ddpm.out"
wait "$DP_PID"
set +x
cat "$OUT"/*.out
