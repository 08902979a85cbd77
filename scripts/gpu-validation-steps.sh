#!/usr/bin/env bash
# Validate Astra on a GPU machine, step by step. Each step runs one astra command or one group of GPU tests
# under its own time limit and leaves its log (and its JSON, reports and tarballs of runs, drafts and surveys)
# in the output folder, so that a machine lent for a limited time can be given a few steps per command.
# It needs no network: wheels (apache-tvm-ffi, libclang-ng; mcp and openai for tests/astra) are installed from
# The OS sandbox's seccomp filters need pyseccomp on the GPU machine: add pyseccomp==0.1.2 to the wheels
# (../shared/device/prepare-wheels.sh pyseccomp==0.1.2); without it every verdict is sandbox_unavailable.
# the folders --wheels names, and SGLang trees are read from HOME/sglang/.
#
# Usage (repository root):
#   scripts/gpu-validation-steps.sh --out DIR [options] STEP...
#   --out DIR        logs, JSON and tarballs (created)
#   --home DIR       ASTRA_HOME: SGLang trees, drafts, probe records, runs, surveys (default: $ASTRA_HOME,
#                    else ~/.cache/astra); the tests read their SGLang wheels there too
#   --wheels DIR     a folder of wheels installed into /tmp/site before the steps (repeatable)
#   --sglang VER     the SGLang release every astra command uses (default 0.5.23)
#   --kernels a,b    the kernels of bench, bench-ncu, check, tails, optimize, resume and param-search
#   --args "FLAGS"   the selection and flags of spec-probe and survey (default "--all --reviewed") and extra
#                    flags of eval
#   --tests "PATHS"  the tests of astra-gpu (default: test_mcp.py, test_llm_context.py, test_exec_agent.py)
#   --wall-min N     wall-time budget in minutes of optimize (default 6), param-search (8), eval (10) and resume
#   --run RUN        the optimize run that resume continues
#   --seed N, --sample N  the random sample of probed drafts check-sample draws (default seed 20261123, 10)
#   --timeout S      time limit of every step given (default: each step's own, below)
# Steps (default kernels and time limit in brackets):
#   gpu [480 s]: tests/harness and tests/adversarial in one run; harness [260 s]; adversarial [420 s];
#   astra-gpu [560 s]; patch-check [240 s]: tests/astra/test_patch.py; recheck [300 s]: test_recheck.py
#   timing-probe [120 s]: scripts/probe_graph_tails_and_copy_floor.py
#   bench [480 s]: astra bench with --report (the six reviewed specs)
#   bench-ncu [300 s]: astra bench --ncu (silu_and_mul, fused_add_rmsnorm)
#   check [150 s each]: each original checked against itself, sanitizer on (fused_add_rmsnorm)
#   tails [150 s per setting]: graph-mode upper tails under four timing settings (silu_and_mul)
#   optimize, resume [420 s]: astra optimize --offline --quick-search (silu_and_mul; resume needs --run)
#   param-search [560 s]: astra optimize --offline, the parameter search (rmsnorm)
#   eval [580 s]: astra eval --offline over the survey's top kernels
#   survey [540 s]: astra survey into HOME/surveys/device (resumable)
#   spec-probe [560 s]: astra probe with --report
#   check-sample [420 s each]: a random sample of probed drafts, each original checked against itself
set -uo pipefail
out=
home=${ASTRA_HOME:-$HOME/.cache/astra}
wheels=()
sglang=0.5.23
kernels=
args=
tests="tests/astra/test_mcp.py tests/astra/test_llm_context.py tests/astra/test_exec_agent.py"
wall_min=
run_id=
seed=20261123
sample=10
limit=
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --home) home=$2; shift 2 ;;
    --wheels) wheels+=("$2"); shift 2 ;;
    --sglang) sglang=$2; shift 2 ;;
    --kernels) kernels=${2//,/ }; shift 2 ;;
    --args) args=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --wall-min) wall_min=$2; shift 2 ;;
    --run) run_id=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --sample) sample=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "gpu-validation-steps: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ -n "$out" ] || { echo "gpu-validation-steps: give --out DIR" >&2; exit 2; }
[ $# -gt 0 ] || { echo "gpu-validation-steps: name at least one step" >&2; exit 2; }
mkdir -p "$out"
export ASTRA_HOME=$home PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export ASTRA_TEST_HOME=${ASTRA_TEST_HOME:-$home}  # the tests find their SGLang wheels there (no network)
for folder in "${wheels[@]}"; do
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$folder"/*.whl
done
export PYTHONPATH=/tmp/site:$PWD
astra() { python3 -m astra.cli "$@"; }
bound() { echo "${limit:-$1}"; }        # the step's time limit: --timeout, else its own
names() { echo "${kernels:-$*}"; }      # the step's kernels: --kernels, else its own
pytest_step() {  # name, time limit, paths...
  local name=$1 seconds; seconds=$(bound "$2"); shift 2
  timeout "$seconds" python3 -m pytest -q -rA -m gpu -p no:cacheprovider "$@" > "$out/pytest_$name.log" 2>&1
  echo "pytest $name: exit $?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$out/pytest_$name.log" | tail -30
}
optimize_step() {  # name, time limit, default wall minutes (or ""), astra optimize flags...
  local name=$1 seconds wall=${wall_min:-$3}; seconds=$(bound "$2"); shift 3
  ( time timeout "$seconds" python3 -m astra.cli optimize "$@" --sglang "$sglang" ${wall:+--wall-min "$wall"} ) \
    > "$out/$name.log" 2>&1; echo "$name: exit $?"; tail -30 "$out/$name.log"
  tar czf "$out/runs.tgz" -C "$ASTRA_HOME" runs 2>/dev/null  # every run directory, one file
}
for step in "$@"; do
  case $step in
    # every gpu test but recheck's in one run; on an H100 that is 479 s of tests alone (harness 156.53 s,
    # adversarial 322.49 s), so with builds it does not fit 480 s: run `harness` and `adversarial` apart
    gpu) pytest_step gpu 480 tests/harness tests/adversarial ;;
    harness) pytest_step harness 260 tests/harness ;;
    adversarial) pytest_step adversarial 420 tests/adversarial ;;
    astra-gpu) pytest_step astra-gpu 560 $tests ;;  # needs the mcp and openai wheels
    patch-check) pytest_step patch 240 tests/astra/test_patch.py ;;
    recheck) pytest_step recheck 300 tests/astra/test_recheck.py ;;
    timing-probe) timeout "$(bound 120)" python3 scripts/probe_graph_tails_and_copy_floor.py --json "$out/timing-probe.json" \
                    > "$out/timing-probe.log" 2>&1
                  echo "timing-probe: exit $?"; cat "$out/timing-probe.log" ;;
    bench) ( time timeout "$(bound 480)" python3 -m astra.cli bench $(names silu_and_mul fused_add_rmsnorm rmsnorm qknorm \
               per_token_group_quant store_cache) --sglang "$sglang" --budget-ms 40 --json "$out/bench.json" \
               --report "$out/bench-report" ) > "$out/bench.log" 2>&1
           echo "bench: exit $?"; grep -E "^==|suspect|bench failed|wrote|real" "$out/bench.log" ;;
    bench-ncu) ( time timeout "$(bound 300)" python3 -m astra.cli bench $(names silu_and_mul fused_add_rmsnorm) --ncu \
                   --sglang "$sglang" --budget-ms 40 --json "$out/bench-ncu.json" ) > "$out/bench-ncu.log" 2>&1
               echo "bench-ncu: exit $?"; grep -E "^==|within|bench failed|real" "$out/bench-ncu.log" ;;
    check) bash scripts/check-originals-as-candidates.sh --home "$home" --sglang "$sglang" --out "$out" \
             --timeout "$(bound 150)" $(names fused_add_rmsnorm) ;;  # compute-sanitizer on
    tails) for cfg in legacy:0:0 gc-paused:0:1 spin-only:auto:0 new:auto:1; do  # label:keep-busy-us:pause-gc
             IFS=: read -r label busy gc <<< "$cfg"; [ "$busy" = auto ] && busy=""
             ASTRA_TIMING_KEEP_BUSY_US=$busy ASTRA_TIMING_PAUSE_GC=$gc timeout "$(bound 150)" python3 -m astra.cli bench \
               $(names silu_and_mul) --sglang "$sglang" --modes graph --budget-ms 40 --json "$out/tails_$label.json" \
               > "$out/tails_$label.log" 2>&1
             echo "tails $label: exit $?"
           done
           python3 scripts/tails_summary.py "$out"/tails_*.json ;;
    optimize) for name in $(names silu_and_mul); do
                optimize_step "optimize-$name" 420 6 "$name" --offline --rounds 2 --quick-search
              done ;;
    resume) [ -n "$run_id" ] || { echo "resume: give --run RUN"; continue; }
            optimize_step resume 420 "" $(names silu_and_mul) --offline --quick-search --resume "$run_id" ;;
    param-search) for name in $(names rmsnorm); do
                    optimize_step "param-search-$name" 560 8 "$name" --offline
                  done ;;
    eval) ( time timeout "$(bound 580)" python3 -m astra.cli eval --offline --sglang "$sglang" \
              --wall-min "${wall_min:-10}" $args --json "$out/eval.json" ) > "$out/eval.log" 2>&1
          echo "eval: exit $?"; tail -40 "$out/eval.log"
          tar czf "$out/runs.tgz" -C "$ASTRA_HOME" runs 2>/dev/null ;;
    survey) ( time timeout "$(bound 540)" python3 -m astra.cli survey ${args:---all --reviewed} --sglang "$sglang" \
                --budget-ms 10 --out "$ASTRA_HOME/surveys/device" --report "$out/survey-report" \
                --json "$out/survey.json" ) > "$out/survey.log" 2>&1
            echo "survey: exit $?"; tail -30 "$out/survey.log"
            tar czf "$out/surveys.tgz" -C "$ASTRA_HOME" surveys ;;
    spec-probe) ( time timeout "$(bound 560)" python3 -m astra.cli probe ${args:---all --reviewed} --sglang "$sglang" \
                    --report "$out/probe-report.md" --json "$out/probe-report.json" ) > "$out/spec-probe.log" 2>&1
                echo "spec-probe: exit $?"; tail -40 "$out/spec-probe.log"
                tar czf "$out/drafts.tgz" -C "$ASTRA_HOME" drafts probes 2>/dev/null ;;  # probed drafts and evidence
    check-sample) drawn=$(python3 - "$ASTRA_HOME" "$seed" "$sample" <<'PY'
import json, pathlib, random, sys
home = pathlib.Path(sys.argv[1])  # a draft's record sits beside it (drafts/NAME/probe.json)
records = [json.loads(p.read_text()) for p in sorted(home.glob("drafts/*/probe.json"))]
probed = sorted(r["name"] for r in records if r.get("status") == "probed" and r.get("kind") == "draft"
                and not pathlib.Path("extracted_kernels", r["name"]).exists())  # `astra check NAME` takes a reviewed spec first
print(" ".join(random.Random(int(sys.argv[2])).sample(probed, min(int(sys.argv[3]), len(probed)))))
PY
)
                  echo "check-sample (seed $seed): $drawn"
                  bash scripts/check-originals-as-candidates.sh --home "$home" --sglang "$sglang" --out "$out" \
                    --timeout "$(bound 420)" $drawn ;;
    *) echo "gpu-validation-steps: unknown step $step" ;;
  esac
done
