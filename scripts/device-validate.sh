#!/usr/bin/env bash
# Device calls that validate Astra on a GPU, step by step, each bounded so one 10-minute call holds
# the steps given. Usage on the GPU box, from the repo root, with the wheels of
# ../shared/device/prepare-wheels.sh in .whl/ and SGLang trees under $ASTRA_HOME/sglang/:
#   ASTRA_HOME=$PWD/.astra-device OUT=/some/dir scripts/device-validate.sh STEP...
# Steps: spec-probe probe gpu harness astra-gpu adversarial check bench bench-rest bench-ncu patch-check tails optimize resume recheck
#        bench6 survey param-search eval check-sample   (logs and JSON land in $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/astra-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export ASTRA_TEST_HOME=${ASTRA_TEST_HOME:-${ASTRA_HOME:-$PWD/.astra-device}}  # tests find the carried wheels (no network there)
# .whl: tvm-ffi and libclang-ng (the probe's repairs and the offline search read C++ with it); .whl-tests: mcp,
# openai and their dependencies (tests/astra). Carry what the step needs: one call carries 64 MiB at most.
for wheels in .whl .whl-tests; do
  [ -d $wheels ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels/*.whl
done
export PYTHONPATH=/tmp/site:$PWD
astra() { python3 -m astra.cli "$@"; }
pytest_step() {  # name, timeout, paths...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -rA -m gpu -p no:cacheprovider "$@" > "$OUT/pytest_$name.log" 2>&1
  echo "pytest $name: exit $?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/pytest_$name.log" | tail -30
}
for step in "$@"; do
  case $step in
    probe) timeout 120 python3 scripts/timing_probe.py --json "$OUT/probe.json" > "$OUT/probe.log" 2>&1
           echo "probe: exit $?"; cat "$OUT/probe.log" ;;
    # every gpu test but recheck's, one run: on the H100 in session 11 that is 479 s of tests alone (harness
    # 156.53 s, adversarial 322.49 s), over one call's bound with builds; run `harness` and `adversarial` apart
    gpu) pytest_step gpu ${GPU_TIMEOUT:-480} tests/harness tests/adversarial ;;
    harness) pytest_step harness 260 tests/harness ;;
    astra-gpu) pytest_step astra-gpu ${ASTRA_GPU_TIMEOUT:-560} ${ASTRA_GPU_TESTS:-tests/astra/mcp_server/test_mcp.py tests/astra/optimize/test_llm_context.py tests/astra/optimize/test_exec_agent.py} ;;  # needs .whl with mcp, openai
    adversarial) pytest_step adversarial 420 tests/adversarial ;;
    bench) ( time timeout 300 python3 -m astra.cli bench silu_and_mul fused_add_rmsnorm rmsnorm --ncu \
               --budget-ms 40 --json "$OUT/bench.json" --report "$OUT/baseline" ) \
             > "$OUT/bench.log" 2>&1; grep -E "^==|bench failed|wrote|real" "$OUT/bench.log" ;;
    bench-rest) ( time timeout 200 python3 -m astra.cli bench qknorm per_token_group_quant store_cache --ncu \
               --budget-ms 40 --json "$OUT/bench_rest.json" --report "$OUT/baseline_rest" ) \
             > "$OUT/bench_rest.log" 2>&1; grep -E "^==|bench failed|wrote|real" "$OUT/bench_rest.log" ;;
    check) cp "$ASTRA_HOME/sglang/0.5.23/sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh" /tmp/cand.cuh
           ( time timeout 150 python3 -m astra.cli check fused_add_rmsnorm --candidate /tmp/cand.cuh \
               --json "$OUT/check.json" ) > "$OUT/check.log" 2>&1; tail -8 "$OUT/check.log" ;;
    optimize) ( time timeout ${OPT_TIMEOUT:-420} python3 -m astra.cli optimize ${OPT_KERNEL:-silu_and_mul} --offline \
               --rounds 2 --quick-search --wall-min ${OPT_WALL_MIN:-6} ) > "$OUT/optimize.log" 2>&1; tail -25 "$OUT/optimize.log"
              tar czf "$OUT/runs.tgz" -C "$ASTRA_HOME" runs 2>/dev/null ;;  # every run directory, one file
    resume) ( time timeout ${OPT_TIMEOUT:-420} python3 -m astra.cli optimize ${OPT_KERNEL:-silu_and_mul} --offline \
               --quick-search --resume "$OPT_RUN" ) > "$OUT/resume.log" 2>&1; tail -25 "$OUT/resume.log"
              tar czf "$OUT/runs.tgz" -C "$ASTRA_HOME" runs 2>/dev/null ;;
    patch-check) pytest_step patch 240 tests/astra/patches/test_patch.py ;;
    tails) for cfg in legacy:0:0 gc-paused:0:1 spin-only:auto:0 new:auto:1; do  # label:keep-busy-us:pause-gc
             IFS=: read -r label busy gc <<< "$cfg"; [ "$busy" = auto ] && busy=""
             ASTRA_TIMING_KEEP_BUSY_US=$busy ASTRA_TIMING_PAUSE_GC=$gc timeout 150 python3 -m astra.cli bench \
               silu_and_mul --modes graph --budget-ms 40 --json "$OUT/tails_$label.json" > "$OUT/tails_$label.log" 2>&1
             echo "tails $label: exit $?"
           done
           python3 scripts/tails_summary.py "$OUT"/tails_*.json ;;
    bench-ncu) ( time timeout 170 python3 -m astra.cli bench silu_and_mul fused_add_rmsnorm --ncu \
               --budget-ms 40 --json "$OUT/bench_ncu.json" ) > "$OUT/bench_ncu.log" 2>&1
               grep -E "^==|within|bench failed|real" "$OUT/bench_ncu.log" ;;
    recheck) pytest_step recheck 300 tests/astra/patches/test_recheck.py ;;
    bench6) ( time timeout ${BENCH_TIMEOUT:-480} python3 -m astra.cli bench silu_and_mul fused_add_rmsnorm rmsnorm qknorm \
               per_token_group_quant store_cache --budget-ms 40 --json "$OUT/bench6.json" --report /tmp/bench6 ) \
             > "$OUT/bench6.log" 2>&1; echo "bench6: exit $?"; tar czf "$OUT/bench6-report.tgz" -C /tmp bench6
             grep -E "suspect|bench failed|wrote|real" "$OUT/bench6.log" ;;
    survey) ( time timeout ${SURVEY_TIMEOUT:-540} python3 -m astra.cli survey ${SURVEY_ARGS:---all --reviewed} \
               --budget-ms ${SURVEY_BUDGET_MS:-10} --out "$ASTRA_HOME/surveys/device" --report /tmp/survey-report \
               --json "$OUT/survey.json" ) > "$OUT/survey.log" 2>&1; echo "survey: exit $?"; tail -${SURVEY_TAIL:-30} "$OUT/survey.log"
            tar czf "$OUT/surveys.tgz" -C "$ASTRA_HOME" surveys; tar czf "$OUT/survey-report.tgz" -C /tmp survey-report ;;
    param-search) ( time timeout ${OPT_TIMEOUT:-560} python3 -m astra.cli optimize ${OPT_KERNEL:-rmsnorm} --offline \
               --wall-min ${OPT_WALL_MIN:-8} ) > "$OUT/param-search.log" 2>&1; echo "param-search: exit $?"
              tail -30 "$OUT/param-search.log"; tar czf "$OUT/runs.tgz" -C "$ASTRA_HOME" runs 2>/dev/null ;;
    eval) ( time timeout ${EVAL_TIMEOUT:-580} python3 -m astra.cli eval --offline --wall-min ${EVAL_WALL_MIN:-10} \
               ${EVAL_ARGS:-} --json "$OUT/eval.json" ) > "$OUT/eval.log" 2>&1; echo "eval: exit $?"; tail -40 "$OUT/eval.log"
          tar czf "$OUT/runs.tgz" -C "$ASTRA_HOME" runs 2>/dev/null ;;
    check-sample) names=$(python3 - "$ASTRA_HOME" ${SAMPLE_SEED:-20261123} ${SAMPLE_N:-10} <<'PY'
import json, pathlib, random, sys
home = pathlib.Path(sys.argv[1])  # a draft's record sits beside it (drafts/NAME/probe.json)
records = [json.loads(p.read_text()) for p in sorted(home.glob("drafts/*/probe.json"))]
probed = sorted(r["name"] for r in records if r.get("status") == "probed" and r.get("kind") == "draft"
                and not pathlib.Path("extracted_kernels", r["name"]).exists())  # `astra check NAME` takes a reviewed spec first
print(" ".join(random.Random(int(sys.argv[2])).sample(probed, min(int(sys.argv[3]), len(probed)))))
PY
)
                  echo "check-sample (seed ${SAMPLE_SEED:-20261123}): $names"
                  CHECK_TIMEOUT=${CHECK_TIMEOUT:-420} bash scripts/check-sample.sh $names ;;  # probed drafts only
    spec-probe) ( time timeout ${PROBE_TIMEOUT:-560} python3 -m astra.cli probe ${PROBE_ARGS:---all --reviewed} \
               --report "$OUT/probe-report.md" --json "$OUT/probe-report.json" ) > "$OUT/spec-probe.log" 2>&1
               echo "spec-probe: exit $?"; tail -${PROBE_TAIL:-40} "$OUT/spec-probe.log"
               tar czf "$OUT/drafts.tgz" -C "$ASTRA_HOME" drafts probes 2>/dev/null ;;  # probed drafts and evidence
  esac
done
