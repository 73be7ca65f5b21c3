#!/usr/bin/env bash
# The whole GPU run, on the device machine: the CUDA tests, then the GPU record's figures
# (minispec/tools/measured/gpu.json).
# Prepared and timed on the CPU first (DEVICE=cpu below); on a GPU it must end within 8 minutes.
#
# From the developer's machine, after `bash benchmarks/gpu_prepare.sh`, three device calls in a
# row (each within the machine's 30 s idle window; carried files stay on the warm machine):
#   1. carry [".gpu/smol.gguf.xz.part-aa"]                   command: ls -l .gpu
#   2. carry [".gpu/smol.gguf.xz.part-ab"]                   command: ls -l .gpu
#   3. carry [".gpu/smol.gguf.xz.part-ac", ".gpu/gguf-0.19.0-py3-none-any.whl"]
#      command: COMMIT=<the commit measured> bash benchmarks/gpu_session.sh      (timeout 540)
# It writes $OUT/gpu.json (copy it to minispec/tools/measured/gpu.json), $OUT/cuda-tests.log and
# $OUT/gpu.log.
#
# DEVICE=cpu MODEL=shakespeare-target bash benchmarks/gpu_session.sh   # the dry run on a CPU
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/out/gpu}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-smollm2-135m-instruct}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MINISPEC_HOME=${MINISPEC_HOME:-/tmp/minispec-home}
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }

stamp "1. the gguf package and the model"
ls .gpu/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .gpu/*.whl
if [ "$MODEL" = smollm2-135m-instruct ] && ls .gpu/smol.gguf.xz.part-* >/dev/null 2>&1; then
    cat .gpu/smol.gguf.xz.part-* | xz -d -T0 > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 - <<'PY'
from pathlib import Path
from minispec.zoo import smollm2
gguf = Path("/tmp/SmolLM2-135M-Instruct.Q4_1.gguf")
smollm2.check_sha256(gguf, smollm2.GGUF_SHA256, False)      # the pinned file, or stop here
if not smollm2.is_cached():
    smollm2.convert(gguf, smollm2.cache_dir(), False)
print("converted:", smollm2.cache_dir())
PY
fi

stamp "2. the CUDA tests (skipped without a GPU)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/cuda-tests.log" | tail -15

stamp "3. the GPU record"
timeout "${BENCH_SECONDS:-300}" python3 benchmarks/gpu.py --device "$DEVICE" --model "$MODEL" \
    --record "$OUT/gpu.json" --commit "${COMMIT:-unknown}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu.log"
stamp "done"
