#!/usr/bin/env bash
# The docs/attacks.md table of white-box one-run audits: correct DP-SGD trainings of the 8×8 MLP
# (hidden 256, depth 3; 312,896 parameters) on the 400 digits members, full batch (q = 1),
# T = 16 steps, C = 1, σ calibrated for ε ∈ {2, 4, 8} at δ = 1e-5, 5 seeds each, with 100,000
# gradient canaries and 1,000 input canaries in the same run (`--canary-kind both`); each run is
# audited once by `mia --audit one-run`: white-box (Steinke et al., the f-DP test, independent
# trials, Gaussian shift on the gradient canaries' observations) and black-box (the input
# canaries, attacked on the released model by the loss and PIA attacks). Prints one Markdown row
# per run; OUT keeps every report.
#
#   scripts/white_box_audit_table.sh DPAUDIT OUT
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,11p' "$0" >&2; exit 2; fi
BIN=$1; OUT=$2
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
common=(train --hidden 256 --depth 3 --lr 1e-3 --ema 0 --device cpu --quiet --dp --sample-rate 1 --clip 1 --steps 16 --force)
echo "| accounted ε | seed | Gaussian shift (lower bound) | independent trials | Steinke et al. (white-box) | f-DP test | black-box one-run (input canaries, same run) |"
echo "|---|---|---|---|---|---|---|"
for eps in 2 4 8; do
  sigma=$("$BIN" calibrate --target-epsilon "$eps" --sample-rate 1 --steps 16 --delta 1e-5 | tail -1 | awk '{print $3}')
  for seed in 1 2 3 4 5; do
    run="$OUT/e$eps-s$seed"
    "$BIN" "${common[@]}" --noise-multiplier "$sigma" --seed "$seed" --canaries 1000 --canary-kind both \
      --gradient-canaries 100000 --out "$run" >/dev/null
    "$BIN" mia --checkpoint "$run.toml" --audit one-run --attack loss,pia --timesteps 10,50,100 --format json --quiet > "$run.mia.json" || true
    python3 - "$eps" "$seed" "$run.mia.json" <<'PY'
import json, sys
eps, seed, path = sys.argv[1:]
r = json.load(open(path))
def bounds(model):
    return {v["source"].split(" (")[0]: v["epsilon"] for v in r["verdicts"]
            if "audit" in (v.get("source") or "") and model in v["source"]}
w, b = bounds("white-box"), bounds("black-box")
f = lambda x: "–" if x is None else f"{x:.3f}"
print(f"| {eps} | {seed} | {f(w.get('Gaussian-shift audit'))} | {f(w.get('independent-trials audit'))} | "
      f"{f(w.get('one-run audit'))} | {f(w.get('f-DP one-run audit'))} | {f(b.get('one-run audit'))} |")
PY
  done
done
