#!/usr/bin/env bash
# Trains the shipped demonstration pair on the MNIST split fixtures/splits/mnist-dp.toml (4,000
# members, 2,000 non-members, 4,000 public rows; made by scripts/make_mnist_split.py, remade if
# missing), in the way DP diffusion models are trained in practice: public pretraining, then
# DP fine-tuning on the private rows.
#   OUT/mnist-public-ddpm the mnist-ddpm architecture trained from scratch on the public rows only
#                         (no privacy cost to the members: `train --dp --init` accepts it after
#                         checking its card's split, data and row hashes)
#   OUT/mnist-dp-ddpm     from it, DP-SGD on the members (Poisson q, clip C, noise σ, Adam, EMA)
#                         with m canaries (CANARIES, default 1000: each joins the private rows
#                         with probability ½) for `mia --audit one-run`
#   OUT/mnist-nodp-ddpm   its non-private twin: from the same public model, same steps, lr, EMA,
#                         and a fixed batch of the DP run's expected size q·n (no clipping/noise)
#
#   scripts/train_mnist_dp_ddpm.sh DPAUDIT cpu|cuda OUT
#
# Defaults (override with the environment variables in brackets): public pretraining 750 steps
# [PRE_STEPS] at batch 128 [PRE_BATCH], lr 2e-3; fine-tuning σ = 1.72 [SIGMA], q = 0.25 [Q]
# (≈ 1,125 of 4,500 rows per step), 100 steps [STEPS] -> PLD ε ≈ 8 at δ = 1e-5; lr 2e-4 [LR],
# EMA 0.999 [EMA], C = 1 [CLIP], δ = 1e-5, a checkpoint every 25 steps [EVERY] in
# OUT/<name>/checkpoint/ (resume with --init). PRE=path skips pretraining and starts from that
# public-only folder.
# DP noise, Poisson sampling, the canaries and the initial weights come from the OS CSPRNG unless
# SEED is set (a seeded run is not private against anyone who knows the seed). Existing folders
# are refused unless FORCE=1. Each run writes its card (dpaudit-card.toml: the command, hashes, ε)
# and the DP run its ledger (dpaudit-ledger.toml); stderr goes to OUT/<name>.log. PARALLEL=1
# trains the two fine-tunings at once (two processes; set RAYON_NUM_THREADS=1 on a small CPU
# machine).
set -euo pipefail
if [ $# -ne 3 ]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
BIN=$1
DEV=$2
OUT=$3
case "$DEV" in
  cpu|cuda) ;;
  *) echo "device must be cpu or cuda, got '$DEV'" >&2; exit 2 ;;
esac
: "${STEPS:=100}" "${CHUNK:=256}" "${CANARIES:=1000}" "${EVERY:=25}" "${PRE_STEPS:=750}" "${PRE_BATCH:=128}"
: "${SIGMA:=1.72}" "${Q:=0.25}" "${LR:=2e-4}" "${EMA:=0.999}" "${CLIP:=1}"
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
if [ -z "${PRE:-}" ]; then
  PRE="$OUT/mnist-public-ddpm"
  /usr/bin/time -v "$BIN" train --unet mnist-ddpm --device "$DEV" --data "$DATA" --split "$SPLIT" \
    --on public --steps "$PRE_STEPS" --batch-size "$PRE_BATCH" --lr 2e-3 --ema "$EMA" \
    --checkpoint-every 250 ${EXTRA[@]+"${EXTRA[@]}"} \
    --out "$PRE" 2> "$OUT/mnist-public-ddpm.log" > "$OUT/mnist-public-ddpm.out"
fi
CAN=()
if [ "$CANARIES" -gt 0 ]; then CAN+=(--canaries "$CANARIES"); fi
/usr/bin/time -v "$BIN" train --unet mnist-ddpm --device "$DEV" --data "$DATA" --split "$SPLIT" \
  --init "$PRE" --dp --noise-multiplier "$SIGMA" --clip "$CLIP" --sample-rate "$Q" --delta 1e-5 \
  --steps "$STEPS" --batch-size "$CHUNK" --lr "$LR" --ema "$EMA" ${CAN[@]+"${CAN[@]}"} \
  --checkpoint-every "$EVERY" ${EXTRA[@]+"${EXTRA[@]}"} \
  --out "$OUT/mnist-dp-ddpm" 2> "$OUT/mnist-dp-ddpm.log" > "$OUT/mnist-dp-ddpm.out" &
DP_PID=$!
if [ "${PARALLEL:-0}" != 1 ]; then wait "$DP_PID"; fi
/usr/bin/time -v "$BIN" train --unet mnist-ddpm --device "$DEV" --data "$DATA" --split "$SPLIT" \
  --init "$PRE" --steps "$STEPS" --batch-size "$BATCH" --lr "$LR" --ema "$EMA" --checkpoint-every "$EVERY" \
  ${EXTRA[@]+"${EXTRA[@]}"} \
  --out "$OUT/mnist-nodp-ddpm" 2> "$OUT/mnist-nodp-ddpm.log" > "$OUT/mnist-nodp-ddpm.out"
wait "$DP_PID"
set +x
cat "$OUT"/*.out
