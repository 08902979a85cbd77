#!/usr/bin/env bash
# One device call that validates the harness on a GPU and produces the baseline report.
# Usage on the GPU box, from the repo root (wheels from ../shared/device/prepare-wheels.sh in .whl/,
# SGLang trees unpacked under $ASTRA_HOME/sglang/):
#   ASTRA_HOME=$PWD/.astra-device OUT=/some/dir scripts/device-validate.sh [pytest|bench|check]...
set -uo pipefail
OUT=${OUT:-/tmp/astra-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
astra() { python3 -m astra.cli "$@"; }
steps=${*:-pytest bench check}
for step in $steps; do
  case $step in
    pytest)
      timeout 250 python3 -m pytest -q -rA -m gpu tests/harness tests/adversarial -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | grep -E "passed|failed|PASSED|FAILED|Error|: (correct|incorrect|crashed|timeout|sanitizer|signature_mismatch|build_failed|missing_export|suspect):" ;;
    bench)
      ( time timeout 200 python3 -m astra.cli bench silu_and_mul fused_add_rmsnorm rmsnorm qknorm per_token_group_quant store_cache \
          --budget-ms 40 --json "$OUT/bench.json" --report "$OUT/baseline" ) > "$OUT/bench.log" 2>&1
      grep -E "^==|self-ratio|GPU:|bench failed|wrote|real" "$OUT/bench.log" ;;
    check)
      cp "$ASTRA_HOME/sglang/0.5.23/sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh" /tmp/cand.cuh
      ( time timeout 125 python3 -m astra.cli check fused_add_rmsnorm --candidate /tmp/cand.cuh --json "$OUT/check.json" ) > "$OUT/check.log" 2>&1
      tail -8 "$OUT/check.log" ;;
  esac
done
