#!/usr/bin/env bash
# Issue 12's scale-out measurement on a multi-GPU device machine: the same survey subset with 1 worker,
# with one worker per GPU, and as Ray tasks, each into its own store; then case-by-case comparisons.
# Usage (repository root, on the device, carrying .astra-device .whl-min .ray):
#   OUT=$OUT bash scripts/scaleout-survey.sh local     # 1 worker, then every GPU
#   OUT=$OUT bash scripts/scaleout-survey.sh ray       # --ray auto (a local Ray instance over every GPU)
#   (RESUME_W1=1 first finishes a 1-worker survey that its timeout cut off: the survey resumes its store.
#   The ray step compares with the w1 store, so on a fresh machine unpack the local step's stores.tgz
#   into .astra-device/surveys first.) Each step starts each survey with an empty store (a resume keeps
#   it); the w1 survey builds the modules, so later runs find them cached: compare their bench walls.
# Names: SURVEY_NAMES (default below: 15 kernels that survey in 7 to 30 s each on an H100).
set -u
step=${1:?local or ray}
out=${OUT:?set OUT}
mkdir -p .astra-devbuilds && ln -sfn "$PWD/.astra-devbuilds" .astra-device/builds
export ASTRA_HOME=$PWD/.astra-device PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl-min/*.whl
if [ "$step" = ray ]; then
  tar xJf .ray/ray-min.tar.xz -C /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .ray/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
names=${SURVEY_NAMES:-"channel_rmsnorm_finish_silu diffusion_minimax_h3_vae_output fused_add_rmsnorm fused_rope
  inkling_gate_topk_renorm inkling_rel_proj lplb_lp_prep mhc_post_combine_norm_prefill moe_lora_align_block_size
  per_token_group_quant qknorm qsa_indexer rmsnorm silu_and_mul store_cache"}
stores=$ASTRA_HOME/surveys/scaleout
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
nvidia-smi -L | tee "$out/gpus.txt"

run() {  # label (the store's name), extra flags...; LOG_TAG names a resumed run's log apart
  local label=$1; shift
  local tag=$label${LOG_TAG:-}
  [ -n "${LOG_TAG:-}" ] || rm -rf "${stores:?}/$label"  # a fresh measurement, not a store's old records
  local t0=$(date +%s.%N)
  timeout -k 30 "${SURVEY_TIMEOUT:-270}" python3 -m astra.cli survey $names --out "$stores/$label" "$@" \
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
  if [ -n "${RESUME_W1:-}" ]; then LOG_TAG=-resumed run w1 --workers 1; fi  # a w1 cut off by its timeout
  run ray --ray auto
  python3 scripts/compare_surveys.py "$stores/w1" "$stores/ray" | tee "$out/compare-w1-ray.txt"
  python3 scripts/compare_surveys.py "$stores/w1" "$stores/w$gpus" | tee "$out/compare-w1-w$gpus.txt"
fi
grep -h -E 'built in|GPU worker|: (timed|suspect|failed|error)' "$out"/survey-*.log | tail -60
cat "$out/walls.txt"
tar czf "$out/stores.tgz" -C "$ASTRA_HOME/surveys" scaleout
