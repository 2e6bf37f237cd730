#!/usr/bin/env bash
# Speed of every method with random-weight models of real 1B-class shapes (GPT-2 large,
# Qwen2.5-1.5B, Llama-3.2-1B layouts on the testbed tokenizers) on one GPU, in < 5 minutes.
# Random weights: accuracy is meaningless and E/T is higher than with trained models, so the
# ratios bound the machinery's cost from above. Then the concurrency sweep (1, 8 and 16 requests
# at once against the bare models' own batching, measured in the same run): short and RAG-length
# prompts, on the shipped models and on the 1B shapes (~8 more minutes).
#   lab/scripts/gpu_check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-bench-out/gpu}
BENCH=".venv/bin/python -m lab bench --device cuda --ignore-stop"
$BENCH --dtype bfloat16 --shape 1b --methods single,token,safe,specem --aggregator unite --n 6 \
  --max-new-tokens 256 --out "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
SWEEP="--methods single,token,safe,specem --concurrency 1,8,16 --n 16"
$BENCH $SWEEP --max-new-tokens 32 --out "$OUT/concurrency-short"
$BENCH $SWEEP --max-new-tokens 40 --form rag --prompt-tokens 720 --out "$OUT/concurrency-rag"
$BENCH $SWEEP --dtype bfloat16 --shape 1b --max-new-tokens 32 --out "$OUT/concurrency-1b-short"
$BENCH $SWEEP --dtype bfloat16 --shape 1b --max-new-tokens 40 --form rag --prompt-tokens 720 \
  --out "$OUT/concurrency-1b-rag"
