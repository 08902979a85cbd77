#!/usr/bin/env bash
# Check each named spec's ORIGINAL kernel file as a candidate against itself:
#   astra check NAME --candidate <the original kernel file> --modes graph,cold
# A probed draft goes through the same judge as a reviewed spec this way; an original that is not
# "correct" against itself, or that is `suspect` under its floor, points at a fault of the spec (inputs
# that race, bytes that overcount) rather than of a candidate.
#
# Usage (repository root, on a GPU machine):
#   scripts/check-originals-as-candidates.sh [--home DIR] [--sglang VERSION] [--out DIR] [--timeout SECONDS]
#                                            [--check-args "FLAGS"] NAME...
#   --home        ASTRA_HOME, holding the drafts and the SGLang tree (default: $ASTRA_HOME, else ~/.cache/astra)
#   --sglang      the SGLang version whose tree under HOME/sglang/ holds the original files (default 0.5.23)
#   --out         where check_NAME.log and check_NAME.json go (default: a new temporary folder)
#   --timeout     seconds each check may take (default 100)
#   --check-args  further flags for `astra check`, e.g. "--no-sanitizer"
# NAME is a reviewed spec (extracted_kernels/NAME) or a probed draft (HOME/drafts/NAME). Prints one line per
# check (exit status and seconds) and the verdict's last lines.
set -uo pipefail
home=${ASTRA_HOME:-$HOME/.cache/astra}
sglang=0.5.23
out=
limit=100
check_args=
while [ $# -gt 0 ]; do
  case $1 in
    --home) home=$2; shift 2 ;;
    --sglang) sglang=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --check-args) check_args=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "check-originals-as-candidates: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "check-originals-as-candidates: name at least one spec" >&2; exit 2; }
out=${out:-$(mktemp -d)}
mkdir -p "$out"
originals=$(mktemp -d)
tree="$home/sglang/$sglang/sglang"
export ASTRA_HOME=$home
for name in "$@"; do
  spec="extracted_kernels/$name/kernel.yaml"  # `astra check NAME` takes a reviewed spec first
  [ -f "$spec" ] || spec="$home/drafts/$name/kernel.yaml"
  rel=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['source']['kernel_file'])" "$spec")
  jit="$tree/kernels/jit/csrc"
  case $rel in
    ../*) src=$(realpath -m "$jit/$rel") ;;  # a kernel kept beside its loader (kda_kernels/csrc), relative to jit/csrc
    *) src=$(find "$tree" -path "*/csrc/$rel" | sort | head -1) ;;  # jit/csrc first
  esac
  cp "$src" "$originals/$name.cuh"
  start=$(date +%s)
  timeout "$limit" python3 -m astra.cli check "$name" --candidate "$originals/$name.cuh" --sglang "$sglang" \
    --modes graph,cold $check_args --json "$out/check_$name.json" > "$out/check_$name.log" 2>&1
  echo "check $name: exit $? in $(( $(date +%s) - start )) s"; grep -E "^(==|verdict|status)|correct|x[0-9.]+ " "$out/check_$name.log" | tail -4
done
echo "logs and verdicts: $out"
