#!/usr/bin/env bash
# Scale-out of `astra survey` on a multi-GPU machine: the same kernels surveyed with 1 worker, with one worker
# per GPU, and as Ray tasks, each into its own store; then the stores compared case by case
# (scripts/compare_surveys.py) and every survey's wall time written to walls.txt.
#
# Usage (repository root):
#   scripts/survey-scaleout-compare.sh local|ray --out DIR [options] NAME...
#   local            1 worker, then one worker per GPU
#   ray              `--ray auto` (a local Ray instance over every GPU), compared with the local step's stores
#   --out DIR        logs, walls.txt, compare-*.txt, gpus.txt and stores.tgz (the stores) go there
#   --home DIR       ASTRA_HOME, holding the SGLang tree and the specs (default: $ASTRA_HOME, else ~/.cache/astra);
#                    the stores are HOME/surveys/scaleout/{w1,wN,ray}
#   --builds DIR     keep HOME/builds there (a link), out of HOME
#   --wheels DIR     wheels installed into /tmp/site first (no network needed)
#   --ray-bundle DIR for `ray`: a folder with ray-min.tar.xz (unpacked into /tmp/site) and Ray's wheels
#   --timeout S      time limit of each survey (default 270)
#   --resume-w1      with `ray`: first finish a 1-worker survey its time limit cut off (the survey resumes its
#                    store; on a fresh machine unpack the local step's stores.tgz into HOME/surveys first)
# Each survey starts with an empty store (a resume keeps it); the 1-worker survey builds the modules, so later
# surveys find them cached: compare their bench walls.
set -u
step=
out=
home=${ASTRA_HOME:-$HOME/.cache/astra}
builds=
wheels=
ray_bundle=
limit=270
resume_w1=
names=()
while [ $# -gt 0 ]; do
  case $1 in
    local|ray) step=$1; shift ;;
    --out) out=$2; shift 2 ;;
    --home) home=$2; shift 2 ;;
    --builds) builds=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --ray-bundle) ray_bundle=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --resume-w1) resume_w1=1; shift ;;
    -*) echo "survey-scaleout-compare: unknown option $1" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
[ -n "$step" ] || { echo "survey-scaleout-compare: give local or ray" >&2; exit 2; }
[ -n "$out" ] || { echo "survey-scaleout-compare: give --out DIR" >&2; exit 2; }
[ ${#names[@]} -gt 0 ] || { echo "survey-scaleout-compare: name the kernels to survey" >&2; exit 2; }
mkdir -p "$out" "$home"
if [ -n "$builds" ]; then
  mkdir -p "$builds" && ln -sfn "$(realpath "$builds")" "$home/builds"
fi
export ASTRA_HOME=$home PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p /tmp/site
[ -z "$wheels" ] || python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$wheels"/*.whl
if [ "$step" = ray ] && [ -n "$ray_bundle" ]; then
  tar xJf "$ray_bundle/ray-min.tar.xz" -C /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ray_bundle"/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
stores=$ASTRA_HOME/surveys/scaleout
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
nvidia-smi -L | tee "$out/gpus.txt"

run() {  # label (the store's name), extra flags...; LOG_TAG names a resumed run's log apart
  local label=$1; shift
  local tag=$label${LOG_TAG:-}
  [ -n "${LOG_TAG:-}" ] || rm -rf "${stores:?}/$label"  # a fresh measurement, not a store's old records
  local t0=$(date +%s.%N)
  timeout -k 30 "$limit" python3 -m astra.cli survey "${names[@]}" --out "$stores/$label" "$@" \
    > "$out/survey-$tag.log" 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  python3 -c "import sys; print(f\"{sys.argv[1]}: exit {sys.argv[2]}, wall {float(sys.argv[4]) - float(sys.argv[3]):.1f} s\")" "$tag" "$rc" "$t0" "$t1" | tee -a "$out/walls.txt"
}

if [ "$step" = local ]; then
  run w1 --workers 1
  run "w$gpus" --workers "$gpus"
  python3 scripts/compare_surveys.py "$stores/w1" "$stores/w$gpus" | tee "$out/compare-w1-w$gpus.txt"
else
  if [ -n "$resume_w1" ]; then LOG_TAG=-resumed run w1 --workers 1; fi  # a w1 cut off by its time limit
  run ray --ray auto
  python3 scripts/compare_surveys.py "$stores/w1" "$stores/ray" | tee "$out/compare-w1-ray.txt"
  python3 scripts/compare_surveys.py "$stores/w1" "$stores/w$gpus" | tee "$out/compare-w1-w$gpus.txt"
fi
grep -h -E 'built in|GPU worker|: (timed|suspect|failed|error)' "$out"/survey-*.log | tail -60
cat "$out/walls.txt"
tar czf "$out/stores.tgz" -C "$ASTRA_HOME/surveys" scaleout
