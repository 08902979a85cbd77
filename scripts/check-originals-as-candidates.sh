#!/usr/bin/env bash
# `astra check NAME --candidate <the original kernel file>` for each probed spec named, graph and cold:
# a probed draft goes through the same judge as a reviewed spec. Usage on the GPU box:
#   ASTRA_HOME=... OUT=... scripts/check-sample.sh NAME...   (logs and verdict JSON in $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/astra-out}; mkdir -p "$OUT"
for name in "$@"; do
  rel=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['source']['kernel_file'])" \
        "$ASTRA_HOME/drafts/$name/kernel.yaml")
  jit="$ASTRA_HOME/sglang/0.5.23/sglang/kernels/jit/csrc"
  case $rel in
    ../*) src=$(realpath -m "$jit/$rel") ;;  # a kernel kept beside its loader (kda_kernels/csrc), relative to jit/csrc
    *) src=$(find "$ASTRA_HOME/sglang/0.5.23/sglang" -path "*/csrc/$rel" | sort | head -1) ;;  # jit/csrc first
  esac
  cp "$src" "/tmp/$name.cuh"
  start=$(date +%s)
  timeout ${CHECK_TIMEOUT:-100} python3 -m astra.cli check "$name" --candidate "/tmp/$name.cuh" --modes graph,cold \
    ${CHECK_ARGS:-} --json "$OUT/check_$name.json" > "$OUT/check_$name.log" 2>&1
  echo "check $name: exit $? in $(( $(date +%s) - start )) s"; grep -E "^(==|verdict|status)|correct|x[0-9.]+ " "$OUT/check_$name.log" | tail -4
done
