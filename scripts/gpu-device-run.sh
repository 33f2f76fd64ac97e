#!/usr/bin/env bash
# One run on a lent GPU machine (../shared/GPU.md): correctness of the CUDA build at each
# --precision, the attack comparison against PyTorch (fp32/tf32/bf16), DP-SGD steps/s against
# PyTorch, then scripts/train_mnist_dp_ddpm.sh in the time left. Outside CI.
#
#   bash CARRY/gpu-device-run.sh [DEADLINE_S]     (from the repository root; results in $OUT)
#
# CARRY is a git-ignored folder (e.g. target-carry/) holding: dpaudit.gz (the stripped, gzipped
# binary of `DPAUDIT_CUDA_FEATURES=cudnn DPAUDIT_CUDA_TESTS=1 scripts/cuda-build.sh`),
# optionally integration.gz (its integration-test binary), wheels/ (diffusers and
# importlib_metadata wheels for the machine's Python), and optionally compare_attacks_torch.py,
# bench_dpsgd_torch_gpu.py, train_mnist_dp_ddpm.sh and mnist-dp.toml to use instead of the tree's.
# Everything is written to a scratch folder and packed into $OUT/results.tar.gz (+ run.log):
# only a few files come back from the machine. DEVICE=cpu runs the same logic on a CPU build
# (BIN=..., a dry run before spending device time). PRECS_CMP picks the compared precisions.
# PHASES (default "eval tests auto compare dpsgd train") picks what runs; "timing" prints where a
# mia run's time goes at the comparison's MNIST size for TIMING_ATTACKS (default "pia secmi
# loss"; DPAUDIT_TIMING=1: opening the device, loading, each forward with the host's queueing
# time, the cuDNN plans and the loss attack's host noise within each attack, metrics; =phases,
# without the per-forward waits; =kernels, the GPU time per kind of kernel of the CUDA
# forward); "candle" adds the same
# fp32 comparison with candle's kernels instead of the CUDA UNet forward (DPAUDIT_UNET_CUDA=candle),
# before/after on one card; ROUNDS (default 2, the first a warm-up) the comparison's rounds;
# N_MNIST, N_CIFAR (default 1024, 256) its members and non-members each; ATTACKS its attacks;
# FIXED=1 adds --fixed-cost. "heuristic" compares CIFAR SecMI/PIA at PRECS_HEUR (default fp32)
# with DPAUDIT_CUDNN_ALGO=heuristic, "find" at PRECS_FIND (default tf32) with
# DPAUDIT_CUDNN_ALGO=find: the other side of the default (fp32 measures its algorithms once per
# machine into the record, tf32 and bf16 take cuDNN's heuristic; src/models/unet2d/cuda/algo_record.rs);
# "graph" compares MNIST SecMI/PIA with DPAUDIT_CUDA_GRAPH=1 (the forward replayed from CUDA
# graphs).
set -u
T0=$(date +%s)
DEADLINE=${1:-560}
R=$(pwd)
C=$(cd "$(dirname "$0")" && pwd)
OO=${OUT:-/tmp/devout}
mkdir -p "$OO"
O=$(mktemp -d /tmp/devwork.XXXX)
DEVICE=${DEVICE:-cuda}
exec > >(tee "$O/run.log") 2>&1
trap 'tar czf "$OO/results.tar.gz" -C "$O" . 2>/dev/null; cp "$O/run.log" "$OO/run.log"' EXIT
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
atleast() { local v=$1 m=$2; [ "$v" -lt "$m" ] && v=$m; echo "$v"; }
phase() { echo; echo "=== $* (t+$(($(date +%s) - T0)) s)"; }

phase setup
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null || echo "no nvidia-smi"
nproc
PY=${PY:-python3}
if [ "$DEVICE" = cuda ]; then
  CUDNN_LIB=$($PY - <<'EOF'
import glob, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for p in glob.glob(d + "/nvidia/cudnn/lib/libcudnn.so.9") + glob.glob(d + "/nvidia/cu13/lib/libcudnn.so.9"):
        print(p.rsplit("/", 1)[0]); sys.exit()
EOF
)
  if [ -z "$CUDNN_LIB" ]; then
    f=$(find / -xdev -name libcudnn.so.9 2>/dev/null | head -1)
    [ -n "$f" ] && CUDNN_LIB=$(dirname "$f")
  fi
  echo "cuDNN lib: ${CUDNN_LIB:-not found}"
  ls "${CUDNN_LIB:-/nonexistent}" 2>/dev/null | head -20
  export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib${CUDNN_LIB:+:$CUDNN_LIB}
  mkdir -p "$R/target-cuda/release/deps"
  gunzip -c "$C/dpaudit.gz" > "$R/target-cuda/release/dpaudit" && chmod +x "$R/target-cuda/release/dpaudit"
  BIN=$R/target-cuda/release/dpaudit
  if [ -f "$C/integration.gz" ]; then
    gunzip -c "$C/integration.gz" > "$R/target-cuda/release/deps/integration" && chmod +x "$R/target-cuda/release/deps/integration"
  fi
  ldd "$BIN" | grep -E "cudnn|cublas|cudart|nvrtc|curand|not found"
  mkdir -p "$C/py"
  $PY -m pip install -q --no-index --no-deps --target "$C/py" "$C"/wheels/diffusers-*.whl "$C"/wheels/importlib_metadata-*.whl 2>&1 | tail -2
  export PYTHONPATH=$C/py${PYTHONPATH:+:$PYTHONPATH}
else
  BIN=${BIN:-$R/target/release/dpaudit}
fi
$PY -c "import torch, diffusers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'cuda', torch.cuda.is_available())"
"$BIN" --version

# This branch's comparison script (the device's tree may be another checkout).
for f in compare_attacks_torch.py bench_dpsgd_torch_gpu.py train_mnist_dp_ddpm.sh; do
  [ -f "$C/$f" ] && cp "$C/$f" "scripts/$f"
done
[ -f "$C/mnist-dp.toml" ] && cp "$C/mnist-dp.toml" fixtures/splits/mnist-dp.toml
PHASES=" ${PHASES:-eval tests auto compare dpsgd train} "
# cuDNN's algorithm choices per shape are recorded here and reused by later runs
# (src/models/unet2d/cuda/algo_record.rs); the record comes back with the results.
export DPAUDIT_CUDNN_RECORD=${DPAUDIT_CUDNN_RECORD:-$O/cudnn-algorithms.tsv}
has() { [[ "$PHASES" == *" $1 "* ]]; }
if has eval; then
phase "correctness: model eval per precision vs the diffusers fixtures"
PRECS=fp32
[ "$DEVICE" = cuda ] && PRECS="fp32 tf32 bf16"
for fx in unet-28-c1-attn unet-28-c1-fourier unet-32-c3-attn unet-32-c3-noattn; do
  d=fixtures/diffusers/$fx
  for p in $PRECS; do
    "$BIN" model eval --checkpoint "$d" --input "$d/input.npy" --timesteps "$d/timesteps.npy" \
      --out "$O/eval-$fx-$p.npy" --batch 2 --device "$DEVICE" --precision "$p" --force 2>&1 | tail -1
  done
  DPAUDIT_UNET_CUDA=candle "$BIN" model eval --checkpoint "$d" --input "$d/input.npy" --timesteps "$d/timesteps.npy" \
    --out "$O/eval-$fx-candle.npy" --batch 2 --device "$DEVICE" --precision fp32 --force 2>&1 | tail -1
  DPAUDIT_UNET_ATTENTION=gemm "$BIN" model eval --checkpoint "$d" --input "$d/input.npy" --timesteps "$d/timesteps.npy" \
    --out "$O/eval-$fx-gemmattn.npy" --batch 2 --device "$DEVICE" --precision fp32 --force 2>&1 | tail -1
done
$PY - "$O" $PRECS <<'EOF' | tee "$O/model_eval.json"
import json, sys, numpy as np
out, precs = sys.argv[1], sys.argv[2:]
res = []
for fx in ["unet-28-c1-attn", "unet-28-c1-fourier", "unet-32-c3-attn", "unet-32-c3-noattn"]:
    want = np.load(f"fixtures/diffusers/{fx}/expected.npy").astype(np.float64)
    for p in precs:
        try:
            got = np.load(f"{out}/eval-{fx}-{p}.npy").astype(np.float64)
        except Exception as e:
            res.append(dict(fixture=fx, precision=p, error=str(e))); continue
        res.append(dict(fixture=fx, precision=p, max_abs=float(np.abs(got - want).max()),
                        rel_l2=float(np.linalg.norm(got - want) / np.linalg.norm(want))))
    try:
        a = np.load(f"{out}/eval-{fx}-fp32.npy").astype(np.float64)
        c = np.load(f"{out}/eval-{fx}-candle.npy").astype(np.float64)
        res.append(dict(fixture=fx, precision="fp32 vs candle's kernels", max_abs=float(np.abs(a - c).max()),
                        rel_l2=float(np.linalg.norm(a - c) / np.linalg.norm(c))))
    except Exception as e:
        res.append(dict(fixture=fx, precision="fp32 vs candle's kernels", error=str(e)))
    try:
        g = np.load(f"{out}/eval-{fx}-gemmattn.npy").astype(np.float64)
        c = np.load(f"{out}/eval-{fx}-candle.npy").astype(np.float64)
        res.append(dict(fixture=fx, precision="fp32 GEMM attention vs candle's kernels",
                        max_abs=float(np.abs(g - c).max()), rel_l2=float(np.linalg.norm(g - c) / np.linalg.norm(c))))
    except Exception as e:
        res.append(dict(fixture=fx, precision="fp32 GEMM attention vs candle's kernels", error=str(e)))
print(json.dumps(res, indent=1))
EOF
if has gate; then
  # Stop here when the CUDA UNet forward and candle's kernels disagree on any fixture; when only
  # the one-kernel attention disagrees, go on with the GEMM attention (DPAUDIT_UNET_ATTENTION=gemm).
  $PY - "$O/model_eval.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
def ok(kind):
    sel = [r for r in rows if r["precision"] == kind]
    bad = [r for r in sel if "error" in r or r["max_abs"] > 1e-3]
    print(f"gate ({kind}):", "ok" if sel and not bad else f"failed {bad}")
    return bool(sel) and not bad
fused, gemm = ok("fp32 vs candle's kernels"), ok("fp32 GEMM attention vs candle's kernels")
sys.exit(0 if fused else (4 if gemm else 1))
EOF
  rc=$?
  if [ "$rc" = 4 ]; then
    echo "GATE: the one-kernel attention disagrees with candle's kernels; going on with DPAUDIT_UNET_ATTENTION=gemm"
    export DPAUDIT_UNET_ATTENTION=gemm
  elif [ "$rc" != 0 ]; then
    echo "GATE: the CUDA forward disagrees with candle's kernels; stopping"; exit 3
  fi
fi
fi

if has tests && [ "$DEVICE" = cuda ] && [ -x "$R/target-cuda/release/deps/integration" ]; then
  phase "cuda integration tests (attacks::cpu_and_cuda, attacks::device_cuda, diffusers::cuda_, diffusers::cudnn_, diffusers::timing, diffusers::mia)"
  # The test binary runs the dpaudit binary and reads fixtures/ at the absolute paths of its build
  # (scripts/cuda-build.sh's CARGO_TARGET_DIR and checkout): recreate them as links.
  TB=$(strings "$R/target-cuda/release/deps/integration" | grep -o '/[A-Za-z0-9_./-]*/release/dpaudit' | head -1)
  TB=${TB:-/work/target-cuda/release/dpaudit}
  ROOTB=$(strings "$R/target-cuda/release/deps/integration" | grep -o '/[A-Za-z0-9_./-]*DPAUDIT_BLESS' | head -1 | sed 's#DPAUDIT_BLESS$##')
  ROOTB=${ROOTB:-/work/main}
  echo "test binary expects dpaudit at ${TB:-?} and the checkout at ${ROOTB:-?}"
  if [ -n "$TB" ] && [ ! -e "$TB" ]; then mkdir -p "$(dirname "$TB")" && ln -s "$BIN" "$TB"; fi
  if [ -n "$ROOTB" ] && [ ! -e "$ROOTB" ]; then mkdir -p "$(dirname "$ROOTB")" && ln -s "$R" "$ROOTB"; fi
  (cd "${ROOTB:-$R}" && timeout "$(atleast $(( $(left) - ${TESTS_AFTER:-5} )) 20)" target-cuda/release/deps/integration attacks::cpu_and_cuda attacks::device_cuda \
     diffusers::cuda_ diffusers::cudnn_ diffusers::timing diffusers::mia_on_the_mnist --test-threads 2 2>&1 | tail -15)
fi

if has auto; then
phase "auto batch: mia without --batch-size (mnist-ddpm, shipped split)"
"$BIN" mia --checkpoint models/mnist-ddpm --data fixtures/data/mnist/mnist-10k.u8.gz --split fixtures/splits/mnist.toml \
  --attack secmi,pia --timesteps 100 --device "$DEVICE" --precision "$([ "$DEVICE" = cuda ] && echo tf32 || echo fp32)" --bootstrap 100 --out "$O/mia-auto-tf32" --force 2>&1 | tail -30
fi

if has compare; then
phase "attack comparison vs PyTorch"
( nvidia-smi dmon -s um -d 1 > "$O/dmon.log" 2>&1 & echo $! > "$O/dmon.pid" ) 2>/dev/null
if [ "$DEVICE" = cuda ]; then
  RESERVE=${RESERVE:-15}
  { has dpsgd || has train || has candle; } && [ "$RESERVE" -lt 150 ] && RESERVE=150
  timeout "$(atleast $(( $(left) - RESERVE )) 60)" $PY scripts/compare_attacks_torch.py --device cuda --precisions "${PRECS_CMP:-fp32,tf32,bf16}" \
    --dpaudit "$BIN" --models "${MODELS:-mnist,cifar}" --n-mnist "${N_MNIST:-1024}" --n-cifar "${N_CIFAR:-256}" --batch 256 --rounds "${ROUNDS:-2}" --bootstrap 200 \
    --attacks "${ATTACKS:-loss,secmi,pia}" ${FIXED:+--fixed-cost} --json "$O/compare_cuda.json" > "$O/compare_cuda.md" 2> "$O/compare_cuda.err"
else
  timeout 600 $PY scripts/compare_attacks_torch.py --device cpu --threads 1 --dpaudit "$BIN" \
    --n-mnist 4 --n-cifar 2 --batch 4 --rounds 1 --json "$O/compare_cpu.json" > "$O/compare_cpu.md" 2> "$O/compare_cpu.err"
fi
echo "rc $?"; cat "$O"/compare_*.md; tail -5 "$O"/compare_*.err
kill "$(cat "$O/dmon.pid" 2>/dev/null)" 2>/dev/null
fi

if has timing; then
phase "where the time goes: DPAUDIT_TIMING mia, ${TIMING_ATTACKS:-pia secmi loss} at fp32 and tf32 on models/mnist-ddpm, N_MNIST + N_MNIST images"
# The comparison's speed-only split (the data file's first 2·N_MNIST rows; the model without its
# training record, whose members hash would refuse that split).
NT=${N_MNIST:-1024}
mkdir -p "$O/speed/mnist-ddpm"
cp models/mnist-ddpm/{config.json,diffusion_pytorch_model.safetensors,scheduler_config.json} "$O/speed/mnist-ddpm/"
$PY - "$NT" "$O/speed/split.toml" <<'EOF'
import hashlib, sys, tomllib
n, out = int(sys.argv[1]), sys.argv[2]
s = tomllib.load(open("fixtures/splits/mnist.toml", "rb"))
h = lambda ix: hashlib.sha256(",".join(map(str, ix)).encode()).hexdigest()
m, nm = list(range(n)), list(range(n, 2 * n))
open(out, "w").write(f'schema_version = 1\ndata = "{s["data"]}"\ndata_sha256 = "{s["data_sha256"]}"\nseed = 0\n'
                     f'members_sha256 = "{h(m)}"\nnonmembers_sha256 = "{h(nm)}"\npublic_sha256 = "{h([])}"\n'
                     f'members = {m}\nnonmembers = {nm}\npublic = []\n')
EOF
for p in fp32 tf32; do
  for at in ${TIMING_ATTACKS:-pia secmi loss}; do
    for mode in 1 phases kernels; do
      echo "--- $at $p DPAUDIT_TIMING=$mode"
      DPAUDIT_TIMING=$mode "$BIN" mia --checkpoint "$O/speed/mnist-ddpm" --data fixtures/data/mnist/mnist-10k.u8.gz \
        --split "$O/speed/split.toml" --attack "$at" --timesteps 100 --max-examples "$NT" --batch-size 256 --device "$DEVICE" \
        --precision "$([ "$DEVICE" = cuda ] && echo "$p" || echo fp32)" --bootstrap 200 --quiet \
        --out "$O/timing-$at-$p" --force 2>&1 | grep -E "^timing:" \
        | awk '/UNet forward/ {n++; s += $(NF-1); if (/queued/) q += $(NF-3); if (n <= 3) print; next} {print}
               END {if (n) printf "%d forwards, %.3f s in all, queued by the host in %.3f s\n", n, s, q}'
    done
  done
done
fi

for ab in heuristic find; do
has "$ab" && [ "$DEVICE" = cuda ] || continue
if [ "$ab" = heuristic ]; then PRECS_AB=${PRECS_HEUR:-fp32}; else PRECS_AB=${PRECS_FIND:-tf32}; fi
phase "CIFAR $PRECS_AB with DPAUDIT_CUDNN_ALGO=$ab against PyTorch"
DPAUDIT_CUDNN_ALGO=$ab timeout "$(atleast $(( $(left) - 30 )) 30)" $PY scripts/compare_attacks_torch.py --device cuda --precisions "$PRECS_AB" \
  --dpaudit "$BIN" --models cifar --n-cifar "${N_CIFAR:-256}" --batch 256 --rounds "${ROUNDS:-2}" --bootstrap 200 \
  --attacks secmi,pia ${FIXED:+--fixed-cost} --json "$O/compare_$ab.json" > "$O/compare_$ab.md" 2> "$O/compare_$ab.err"
echo "rc $?"; cat "$O/compare_$ab.md"; tail -5 "$O/compare_$ab.err"
done

if has graph && [ "$DEVICE" = cuda ]; then
phase "MNIST SecMI/PIA with the forward replayed from CUDA graphs (DPAUDIT_CUDA_GRAPH=1) against PyTorch"
DPAUDIT_CUDA_GRAPH=1 timeout "$(atleast $(( $(left) - 30 )) 30)" $PY scripts/compare_attacks_torch.py --device cuda \
  --precisions "${PRECS_CMP:-fp32,tf32}" --dpaudit "$BIN" --models mnist --n-mnist "${N_MNIST:-1024}" --batch 256 \
  --rounds "${ROUNDS:-2}" --bootstrap 200 --attacks secmi,pia ${FIXED:+--fixed-cost} \
  --json "$O/compare_graph.json" > "$O/compare_graph.md" 2> "$O/compare_graph.err"
echo "rc $?"; cat "$O/compare_graph.md"; tail -5 "$O/compare_graph.err"
fi

if has candle && [ "$DEVICE" = cuda ]; then
phase "the same fp32 comparison with candle's kernels (DPAUDIT_UNET_CUDA=candle)"
DPAUDIT_UNET_CUDA=candle timeout "$(atleast $(( $(left) - 60 )) 30)" $PY scripts/compare_attacks_torch.py --device cuda --precisions fp32 \
  --dpaudit "$BIN" --n-mnist 1024 --n-cifar 256 --batch 256 --rounds 2 --bootstrap 50 --attacks secmi,pia \
  --json "$O/compare_candle.json" > "$O/compare_candle.md" 2> "$O/compare_candle.err"
echo "rc $?"; cat "$O/compare_candle.md"; tail -5 "$O/compare_candle.err"
fi

if has dpsgd; then
phase "DP-SGD steps/s: dpaudit train --unet mnist-ddpm --dp vs PyTorch (torch.func per-sample gradients)"
DPARGS=(train --unet mnist-ddpm --device "$DEVICE" --data fixtures/data/mnist/mnist-10k.u8.gz --split fixtures/splits/mnist-dp.toml
  --dp --noise-multiplier 1.0 --clip 1 --sample-rate 0.03 --delta 1e-5 --batch-size 120 --lr 2e-3 --ema 0.999 --seed 1 --force)
S1=1; S2=2
[ "$DEVICE" = cuda ] && { S1=5; S2=25; }
declare -A WALL
for s in $S1 $S2; do
  a=$EPOCHREALTIME
  timeout 120 "$BIN" "${DPARGS[@]}" --steps $s --out "$O/dpsgd-$s" > "$O/dpsgd-$s.out" 2> "$O/dpsgd-$s.err"
  rc=$?
  WALL[$s]=$(awk -v a="$a" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.3f", b-a}')
  echo "dpaudit DP-SGD steps $s rc $rc wall ${WALL[$s]} s" | tee -a "$O/dpsgd.txt"
done
RATE=$(awk -v n=$((S2 - S1)) -v a="${WALL[$S1]}" -v b="${WALL[$S2]}" 'BEGIN{d=b-a; if (d<=0) d=1e-9; printf "%.3f", n/d}')
echo "dpaudit DP-SGD steps/s (from the difference of the two runs): $RATE" | tee -a "$O/dpsgd.txt"
timeout 120 $PY scripts/bench_dpsgd_torch_gpu.py --config models/mnist-ddpm/config.json --batch $([ "$DEVICE" = cuda ] && echo 120 || echo 8) \
  --steps $([ "$DEVICE" = cuda ] && echo 20 || echo 1) --warmup $([ "$DEVICE" = cuda ] && echo 3 || echo 1) \
  --device "$DEVICE" --json "$O/dpsgd_torch.json" 2>&1 | grep -v Warning | tail -3
fi

if has train; then
phase "DP MNIST training (scripts/train_mnist_dp_ddpm.sh from dpdiff2) in the time left: $(left) s"
[ -x /usr/bin/time ] || sed -i 's#/usr/bin/time -v ##' scripts/train_mnist_dp_ddpm.sh
if [ "$DEVICE" = cuda ]; then
  # 2000 steps (the script's cuda default) when they fit at 80 % of the measured rate (the twin
  # trains beside it), else the most hundreds of steps that do (the card records the steps and ε).
  FIT=$(awk -v r="$RATE" -v l="$(left)" 'BEGIN{s=int(r*0.8*(l-40)/100)*100; if (s>2000) s=2000; print s}')
  echo "training steps: $FIT"
  if [ "$FIT" -ge 100 ]; then
    STEPS=$FIT PARALLEL=1 timeout "$(atleast $(( $(left) - 10 )) 10)" bash scripts/train_mnist_dp_ddpm.sh "$BIN" cuda "$O/trained"
  else
    echo "no time left to train"
  fi
else
  STEPS=2 CHUNK=16 PARALLEL=1 timeout 300 bash scripts/train_mnist_dp_ddpm.sh "$BIN" cpu "$O/trained"
fi
echo "train rc $?"
ls -la "$O/trained" 2>/dev/null; tail -3 "$O"/trained/*.log 2>/dev/null
fi
nvidia-smi 2>/dev/null | head -20
phase done
