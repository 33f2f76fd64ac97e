#!/usr/bin/env bash
# Build dpaudit with the `cuda` cargo feature on a machine without a system CUDA toolkit and
# without a GPU: nvcc and the CUDA libraries come from NVIDIA's PyPI wheels (CUDA 13.0).
#
#   scripts/cuda-build.sh                 # venv in ~/.cache/dpaudit/cuda-13.0, sm_90 (H100/H200)
#   CUDA_COMPUTE_CAP=80 scripts/cuda-build.sh
#   DPAUDIT_CUDA_VENV=/opt/cu13 scripts/cuda-build.sh --bin dpaudit
#   DPAUDIT_CUDA_FEATURES=cudnn scripts/cuda-build.sh           # cuDNN convolutions as well
#   DPAUDIT_CUDA_TESTS=1 CARGO_TARGET_DIR=target-cuda scripts/cuda-build.sh
#
# Extra arguments are passed to `cargo build`. Prints the environment to use the binary with.
# DPAUDIT_CUDA_TESTS=1 builds the integration-test binary instead (`cargo test --no-run`); that
# build also (re)builds the dpaudit binary with the dev-dependencies' feature unification, so
# it is the binary to use with that test binary.
#
# Why these steps (measured facts in ../shared/STACK.md, reproduced in docs/models.md):
# - CUDA 13.0 exactly: the cu12 wheels ship no nvcc/cicc, and nvcc 13.4 emits PTX 9.4, which the
#   580 driver of the GPU machines rejects when candle JIT-loads its kernels.
# - The wheels have no lib64/ and only versioned sonames: add `lib64 -> lib` and unversioned links.
# - cuDNN (feature `cudnn`): `nvidia-cudnn-cu13` from PyPI; cudarc links libcudnn.so (soname
#   libcudnn.so.9) dynamically, so its libraries are linked into the toolkit's lib/. At run time
#   any cuDNN 9 for CUDA 13 works (e.g. the one in torch's site-packages, nvidia/cudnn/lib).
# - No wheel ships libcuda (it comes with the driver), but cudarc links it dynamically: build a
#   stub `libcuda.so` (soname libcuda.so.1) exporting every cu* symbol cudarc declares. At run time
#   the driver's real libcuda.so.1 is loaded; on a GPU-less machine the stub lets the binary start
#   and `--device cuda` fails cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA_WHEEL_VERSION="13.0.3.0"
VENV="${DPAUDIT_CUDA_VENV:-$HOME/.cache/dpaudit/cuda-13.0}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
PYTHON="${PYTHON:-python3}"
FEATURES="${DPAUDIT_CUDA_FEATURES:-cuda}"
CUDNN_WHEEL_VERSION="${DPAUDIT_CUDNN_VERSION:-9.*}"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"

step() { printf '\n== %s\n' "$*" >&2; }
start=$(date +%s)

step "CUDA ${CUDA_WHEEL_VERSION} toolkit wheels into ${VENV}"
if [ ! -x "${VENV}/bin/python" ]; then
  "${PYTHON}" -m venv "${VENV}"
fi
"${VENV}/bin/pip" install -q --disable-pip-version-check \
  "cuda-toolkit[nvcc,cudart,cublas,curand,nvrtc,cccl]==${CUDA_WHEEL_VERSION}"
CU="$("${VENV}/bin/python" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
print(os.path.join(list(spec.submodule_search_locations)[0], "cu13"))
EOF
)"
[ -x "${CU}/bin/nvcc" ] || { echo "error: no nvcc under ${CU}/bin (wheel layout changed?)" >&2; exit 2; }

step "Layout fixes in ${CU}"
ln -sfn lib "${CU}/lib64"
for lib in cublas cublasLt cudart nvrtc; do
  [ -e "${CU}/lib/lib${lib}.so.13" ] && ln -sfn "lib${lib}.so.13" "${CU}/lib/lib${lib}.so"
done
[ -e "${CU}/lib/libcurand.so.10" ] && ln -sfn libcurand.so.10 "${CU}/lib/libcurand.so"

if [[ "${FEATURES}" == *cudnn* ]]; then
  step "cuDNN ${CUDNN_WHEEL_VERSION} for CUDA 13 (nvidia-cudnn-cu13)"
  "${VENV}/bin/pip" install -q --disable-pip-version-check "nvidia-cudnn-cu13==${CUDNN_WHEEL_VERSION}"
  CUDNN_DIR="$("${VENV}/bin/python" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for root in spec.submodule_search_locations:
    for sub in ("cudnn", os.path.join("cu13", "cudnn")):
        if os.path.isdir(os.path.join(root, sub, "lib")):
            print(os.path.join(root, sub))
            raise SystemExit
EOF
)"
  [ -e "${CUDNN_DIR}/lib/libcudnn.so.9" ] || { echo "error: no libcudnn.so.9 under ${CUDNN_DIR}/lib" >&2; exit 2; }
  for f in "${CUDNN_DIR}"/lib/libcudnn*.so.9; do ln -sfn "${f}" "${CU}/lib/$(basename "${f}")"; done
  ln -sfn libcudnn.so.9 "${CU}/lib/libcudnn.so"
  echo "cuDNN $("${VENV}/bin/pip" show nvidia-cudnn-cu13 | sed -n 's/^Version: //p') from ${CUDNN_DIR}" >&2
fi

step "libcuda link stub (soname libcuda.so.1)"
CUDARC_SYS="$(cargo metadata --format-version 1 --features cuda 2>/dev/null \
  | "${VENV}/bin/python" -c '
import json, os, sys
meta = json.load(sys.stdin)
for p in meta["packages"]:
    if p["name"] == "cudarc":
        print(os.path.join(os.path.dirname(p["manifest_path"]), "src", "driver", "sys", "mod.rs"))
        break
')"
[ -f "${CUDARC_SYS}" ] || { echo "error: cudarc's driver bindings not found (run cargo fetch)" >&2; exit 2; }
mkdir -p "${CU}/lib/stubs"
stub_c="$(mktemp --suffix=.c)"
{
  echo "/* Link stub for libcuda: every entry point returns CUDA_ERROR_STUB_LIBRARY (34). */"
  grep -oE 'pub unsafe fn cu[A-Za-z0-9_]+\(' "${CUDARC_SYS}" | sed -E 's/pub unsafe fn (cu[A-Za-z0-9_]+)\(/\1/' \
    | sort -u | while read -r sym; do echo "int ${sym}(void) { return 34; }"; done
} > "${stub_c}"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "${CU}/lib/stubs/libcuda.so" "${stub_c}"
rm -f "${stub_c}"
ln -sfn libcuda.so "${CU}/lib/stubs/libcuda.so.1"
echo "stub exports $(nm -D --defined-only "${CU}/lib/stubs/libcuda.so" | grep -c ' T cu') symbols" >&2

export CUDA_HOME="${CU}" CUDA_PATH="${CU}" CUDA_ROOT="${CU}"
export PATH="${CU}/bin:${CU}/nvvm/bin:${PATH}"
export LD_LIBRARY_PATH="${CU}/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"

# candle-kernels does not notice a changed toolkit: rebuild it when the toolkit path changes.
stamp="${TARGET_DIR}/release/.dpaudit-cuda-home"
if [ -f "${stamp}" ] && [ "$(cat "${stamp}")" != "${CU}:${CUDA_COMPUTE_CAP}" ]; then
  step "toolkit or compute capability changed: cleaning candle-kernels"
  cargo clean --release -p candle-kernels
fi

if [ -n "${DPAUDIT_CUDA_TESTS:-}" ]; then
  step "cargo test --release --features ${FEATURES} --test integration --no-run (compute capability ${CUDA_COMPUTE_CAP}); nvcc: $(nvcc --version | tail -1)"
  cargo test --release --features "${FEATURES}" --test integration --no-run "$@"
else
  step "cargo build --release --features ${FEATURES} (compute capability ${CUDA_COMPUTE_CAP}); nvcc: $(nvcc --version | tail -1)"
  cargo build --release --features "${FEATURES}" "$@"
fi
mkdir -p "${TARGET_DIR}/release" && echo "${CU}:${CUDA_COMPUTE_CAP}" > "${stamp}"

end=$(date +%s)
step "built in $((end - start)) s. To run it:"
cat <<EOF
export LD_LIBRARY_PATH="${CU}/lib:\${LD_LIBRARY_PATH}"   # the driver's libcuda.so.1 is found first on a GPU machine
${TARGET_DIR}/release/dpaudit mia --device cuda ...
# GPU-less machine: to start the binary add the stub:  LD_LIBRARY_PATH="${CU}/lib/stubs:${CU}/lib"
EOF
