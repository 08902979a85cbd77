#!/usr/bin/env bash
# Issue 13's `astra eval --offline` on a device machine, one call at a time (a call is at most 10 minutes;
# eval continues a cut-off run on the next call when the runs come back with the carry).
# Usage (repository root, on the device, carrying .astra-slim and .whl; see docs/NOTES.md):
#   KERNELS=a,b WALL=4 [PROBE="x y"] [FRESH=1] OUT=$OUT bash scripts/device-eval.sh
# PROBE: drafts to probe first (re-extracted ones). Writes probe.log, eval.log, eval.json and runs.tgz
# (the runs and drafts, to unpack into the local $ASTRA_HOME) under $OUT.
set -u -o pipefail
out=${OUT:?set OUT}
home=$PWD/${ASTRA_DIR:-.astra-slim}
mkdir -p .astra-devbuilds "$home" && ln -sfn "$PWD/.astra-devbuilds" "$home/builds"
export ASTRA_HOME=$home PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
  || { echo "device-eval: the wheels in .whl did not install (carry .whl)"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
nvidia-smi -L | tee "$out/gpu.txt"
if [ -n "${PROBE:-}" ]; then
  timeout -k 20 "${PROBE_TIMEOUT:-240}" python3 -m astra.cli probe $PROBE 2>&1 | tee "$out/probe.log"
fi
if [ -n "${KERNELS:-}" ]; then
  timeout -k 20 "${EVAL_TIMEOUT:-480}" python3 -m astra.cli eval --offline --kernels "$KERNELS" \
    --wall-min "${WALL:-4}" ${FRESH:+--fresh} --json "$out/eval.json" 2>&1 | tee "$out/eval.log"
  status=${PIPESTATUS[0]}
  echo "eval: exit $status"
fi
tar czf "$out/runs.tgz" -C "$ASTRA_HOME" runs drafts
exit "${status:-0}"
