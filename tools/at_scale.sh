#!/usr/bin/env bash
# At scale, on paper: simulated training step time of GPT-style models from
# 1B to 70B parameters on one H200-like device, against the lower bound
# max(compute, bytes that must move / bandwidth), raised where room forces
# copies into a stretch of the step, with spillway-sim.
#
#   tools/at_scale.sh [--quick] [--check] [--sim PATH] [--chunksize PATH]
#
# --quick   two rows (1B: fits on the device; 13B: copy-bound) for ctest
# --check   exit 1 unless every row ran, every simulated step is >= its bound,
#           and some row moves data (so the check is not vacuous)
# --sim     the spillway-sim binary (default: build/bin/spillway-sim)
# --chunksize  also run spillway-chunksize (its path) per row and add its
#           best chunk size and that size's simulated step
#
# Prints a Markdown table (docs/at-scale.md is its output, with the
# assumptions). The assumptions live here, as variables:
set -euo pipefail

DEVICE_BYTES=141000000000          # H200: 141 GB of HBM3e
BUDGET_FRACTION=0.9                # the configuration's default device_budget
BUDGET_BYTES=126900000000          # 0.9 x 141 GB
PCIE_GBPS=55                       # PCIe Gen5 x16, achieved, each way
CHUNK=64MB                         # the configuration's default chunk_size
SEQ=1024
BATCH=1
STEPS=4                            # step 1 is the LRU warmup; step 4 is reported
# name layers d_model (12 d^2 parameters per block; embeddings and head left out)
FULL_ROWS=("1B 24 2048" "3B 32 2816" "7B 32 4096" "13B 40 5120" "30B 60 6656" "70B 80 8192")
QUICK_ROWS=("1B 24 2048" "13B 40 5120")

here=$(cd "$(dirname "$0")" && pwd)
sim="$here/../build/bin/spillway-sim"
chunksize=""
quick=0
check=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --check) check=1 ;;
    --sim) sim="$2"; shift ;;
    --chunksize) chunksize="$2"; shift ;;
    *) echo "at_scale.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [[ ! -x "$sim" ]]; then
  echo "at_scale.sh: spillway-sim not found at $sim (build it, or pass --sim)" >&2
  exit 2
fi
rows=("${FULL_ROWS[@]}")
[[ $quick == 1 ]] && rows=("${QUICK_ROWS[@]}")

header="| model | layers x d_model | params | model data (host) | compute ms | must move h2d / d2h GB | bound ms | bound by | simulated ms | sim / bound |"
rule="| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
if [[ -n "$chunksize" ]]; then
  header="$header best chunk: simulated ms (spillway-chunksize) |"
  rule="$rule --- |"
fi
echo "$header"
echo "$rule"

failures=0
moved_rows=0
for row in "${rows[@]}"; do
  read -r name layers d_model <<<"$row"
  params=$((12 * layers * d_model * d_model))
  if ! out=$("$sim" --gpt "$layers,$d_model,$SEQ,$BATCH" --budget "$BUDGET_BYTES"B \
      --chunk-size "$CHUNK" --h2d-gbps "$PCIE_GBPS" --steps "$STEPS" --policy planned 2>&1); then
    echo "| $name | $layers x $d_model | does not run: $(echo "$out" | tail -1) |"
    failures=$((failures + 1))
    continue
  fi
  # bound per step: B ms = max(compute C ms, h2d H MB, d2h D MB at the copy bandwidth)
  read -r compute_ms h2d_mb d2h_mb < <(echo "$out" | sed -n \
    's/^bound per step: .* = max(compute \([0-9.]*\) ms, h2d \([0-9.]*\) MB, d2h \([0-9.]*\) MB.*/\1 \2 \3/p') || true
  # ...: F ms; the copies room forces into stretches of the step: R ms)
  read -r flat_ms room_ms < <(echo "$out" | sed -n \
    's/^bound per step: .* bandwidth: \([0-9.]*\) ms; .* step: \([0-9.]*\) ms)$/\1 \2/p') || true
  bound_ns=$(echo "$out" | awk '$2 == "sim_bound_ns" {print $3}')
  step_ns=$(echo "$out" | awk '$2 == "sim_planned_step_ns" {print $3}')
  if [[ -z "$bound_ns" || -z "$step_ns" || -z "$compute_ms" || -z "$room_ms" ]]; then
    echo "| $name | $layers x $d_model | spillway-sim printed no bound or step |"
    failures=$((failures + 1))
    continue
  fi
  line=$(awk -v n="$name" -v l="$layers" -v d="$d_model" -v p="$params" -v c="$compute_ms" \
      -v h="$h2d_mb" -v w="$d2h_mb" -v b="$bound_ns" -v s="$step_ns" -v bw="$PCIE_GBPS" \
      -v f="$flat_ms" -v r="$room_ms" 'BEGIN {
    copy_ms = (h > w ? h : w) / bw;  # MB at GB/s is ms
    by = r > f ? "room" : (copy_ms > c ? "copy" : "compute");
    printf "| %s | %d x %d | %.2fB | %.0f GB | %.1f | %.1f / %.1f | %.1f | %s | %.1f | %.3f |",
      n, l, d, p / 1e9, p * 16 / 1e9, c, h / 1e3, w / 1e3, b / 1e6, by, s / 1e6, s / b }')
  if [[ -n "$chunksize" ]]; then
    best=$("$chunksize" --gpt "$layers,$d_model,$SEQ,$BATCH" --budget "$BUDGET_BYTES"B \
      --h2d-gbps "$PCIE_GBPS" --steps "$STEPS" 2>&1 |
      sed -n 's/^best: [0-9]* bytes (\([0-9.]*\) MB): step \([0-9.]*\) ms.*/\1 MB: \2 ms/p')
    line="$line ${best:-none} |"
  fi
  echo "$line"
  if awk -v s="$step_ns" -v b="$bound_ns" 'BEGIN { exit !(s < b) }'; then
    echo "at_scale.sh: $name: simulated step $step_ns ns is below its bound $bound_ns ns" >&2
    failures=$((failures + 1))
  fi
  if awk -v h="$h2d_mb" 'BEGIN { exit !(h > 0) }'; then moved_rows=$((moved_rows + 1)); fi
done

echo
echo "Device budget ${BUDGET_BYTES} B (${BUDGET_FRACTION} x ${DEVICE_BYTES} B), PCIe ${PCIE_GBPS} GB/s each way, chunk ${CHUNK}, seq ${SEQ}, batch ${BATCH}, step ${STEPS} of ${STEPS} reported."

if [[ $check == 1 ]]; then
  if [[ $failures -gt 0 ]]; then
    echo "at_scale.sh: $failures row(s) failed" >&2
    exit 1
  fi
  if [[ $moved_rows -eq 0 ]]; then
    echo "at_scale.sh: no row moves data, so no row tests the copy bound" >&2
    exit 1
  fi
  echo "check: ${#rows[@]} rows, every simulated step >= its bound, $moved_rows row(s) copy data"
fi
