#!/usr/bin/env bash
# `astra eval --offline` over the kernels named, on a GPU machine without network, bounded in time, then the
# runs and drafts packed into one tarball to unpack into another $ASTRA_HOME. Run it again with the tarball
# unpacked into HOME and eval continues where it stopped: finished runs are reused, a cut-off one resumed.
#
# Usage (repository root):
#   scripts/eval-offline-and-pack-runs.sh --out DIR --kernels a,b [--wall-min N] [--probe "x y"] [--fresh]
#                                         [--home DIR] [--builds DIR] [--wheels DIR] [--timeout S]
#   --out DIR       gpu.txt, probe.log, eval.log, eval.json and runs.tgz (HOME's runs and drafts) go there
#   --kernels a,b   the kernels to evaluate (`astra eval --kernels`)
#   --wall-min N    each kernel's wall-time budget in minutes (default 4)
#   --probe "x y"   drafts to probe first (re-extracted ones)
#   --fresh         start every kernel over (`astra eval --fresh`)
#   --home DIR      ASTRA_HOME (default: $ASTRA_HOME, else ~/.cache/astra)
#   --builds DIR    keep HOME/builds there (a link), out of what gets packed
#   --wheels DIR    wheels (apache-tvm-ffi, libclang-ng) installed into /tmp/site first
#   --timeout S     time limit of the eval (default 480; the probe's is 240)
# Exits with eval's status (3 when the wheels do not install).
set -u -o pipefail
out=
kernels=
wall=4
probe=
fresh=
home=${ASTRA_HOME:-$HOME/.cache/astra}
builds=
wheels=
limit=480
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --kernels) kernels=$2; shift 2 ;;
    --wall-min) wall=$2; shift 2 ;;
    --probe) probe=$2; shift 2 ;;
    --fresh) fresh=1; shift ;;
    --home) home=$2; shift 2 ;;
    --builds) builds=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    *) echo "eval-offline-and-pack-runs: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "eval-offline-and-pack-runs: give --out DIR" >&2; exit 2; }
mkdir -p "$out" "$home"
if [ -n "$builds" ]; then
  mkdir -p "$builds" && ln -sfn "$(realpath "$builds")" "$home/builds"
fi
export ASTRA_HOME=$home PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ -n "$wheels" ]; then
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$wheels"/*.whl \
    || { echo "eval-offline-and-pack-runs: the wheels in $wheels did not install"; exit 3; }
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
nvidia-smi -L | tee "$out/gpu.txt"
if [ -n "$probe" ]; then
  timeout -k 20 240 python3 -m astra.cli probe $probe 2>&1 | tee "$out/probe.log"
fi
if [ -n "$kernels" ]; then
  timeout -k 20 "$limit" python3 -m astra.cli eval --offline --kernels "$kernels" \
    --wall-min "$wall" ${fresh:+--fresh} --json "$out/eval.json" 2>&1 | tee "$out/eval.log"
  status=${PIPESTATUS[0]}
  echo "eval: exit $status"
fi
tar czf "$out/runs.tgz" -C "$ASTRA_HOME" runs drafts
exit "${status:-0}"
