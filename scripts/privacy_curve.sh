#!/usr/bin/env bash
# The empirical privacy curve of docs/attacks.md: one memorising MNIST setting trained at
# accounted ε ∈ {1, 4, 8} (DP-SGD) and ε = ∞ (the same training without clipping or noise), each
# run audited black-box (its input canaries and the membership attacks on its members) and, for
# the DP runs, white-box (its gradient canaries, every noisy update observed), beside its ledger.
#
#   scripts/privacy_curve.sh target/release/dpaudit curve
#   python3 scripts/privacy_curve_table.py curve        # the table and docs/img/privacy-curve.svg
#
# Setting: the tiny diffusers UNet (44,969 parameters) on the 32 members of
# fixtures/splits/mnist-curve.toml (32 non-members held out), full batch (q = 1: every member in
# every step, so the white-box Gaussian-shift reading is a sound lower bound), STEPS Adam steps at
# lr 2e-3; DP runs clip at C = 1 with σ calibrated by `dpaudit calibrate` for ε at δ = 1e-5. Every
# run carries INPUT input canaries (±1 images, each trained on with probability ½: the black-box
# one-run audit) and, with DP, GRADIENT Dirac gradient canaries (the white-box audit), through
# `train --canary-kind both`. Seeds are fixed (the runs are reproducible; a real audit would use
# the OS CSPRNG). About 6 minutes per run on 2 cores with nothing else running.
set -euo pipefail
BIN=${1:-target/release/dpaudit}
OUT=${2:-curve}
STEPS=${STEPS:-2500}
INPUT=${INPUT:-32}
GRADIENT=${GRADIENT:-1000}
EPSILONS=${EPSILONS:-"1 4 8 inf"}
DATA=fixtures/data/mnist/mnist-10k.u8.gz
SPLIT=fixtures/splits/mnist-curve.toml
mkdir -p "$OUT"
for e in $EPSILONS; do
  dir="$OUT/eps-$e"
  common=(--unet tiny --data "$DATA" --split "$SPLIT" --steps "$STEPS" --lr 2e-3 --seed 5
          --canaries "$INPUT" --out "$dir" --force --quiet)
  if [ "$e" = inf ]; then
    echo "== ε = ∞: no DP, batch 32"
    "$BIN" train "${common[@]}" --batch-size 32
  else
    sigma=$("$BIN" calibrate --target-epsilon "$e" --sample-rate 1 --steps "$STEPS" --delta 1e-5 --format json \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["answers"]["noise_multiplier"])')
    echo "== ε = $e: σ = $sigma"
    "$BIN" train "${common[@]}" --dp --noise-multiplier "$sigma" --clip 1 --sample-rate 1 \
      --canary-kind both --gradient-canaries "$GRADIENT"
  fi
  "$BIN" mia --checkpoint "$dir" --data "$DATA" --split "$SPLIT" --attack loss,pia \
    --timesteps 10,50,100 --audit one-run --bootstrap 1000 --out "$dir/mia" --force --quiet || [ $? -eq 1 ]
done
