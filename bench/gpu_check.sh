#!/usr/bin/env bash
# Speed of every method with random-weight models of real 1B-class shapes (GPT-2 large,
# Qwen2.5-1.5B, Llama-3.2-1B layouts on the testbed tokenizers) on one GPU, in < 5 minutes.
# Random weights: accuracy is meaningless and E/T is higher than with trained models, so the
# ratios bound the machinery's cost from above. Then the same shapes under 1, 4 and 16 concurrent
# requests (batched forward passes; ~5 more minutes).   bench/gpu_check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-out/gpu}
.venv/bin/llm-ensembling bench --device cuda --dtype bfloat16 --shape 1b --ignore-stop \
  --methods single,token,safe,specem --aggregator unite --n 6 --max-new-tokens 256 --out "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
.venv/bin/llm-ensembling bench --device cuda --dtype bfloat16 --shape 1b --ignore-stop \
  --methods single,token,safe,specem --concurrency 1,4,16 --n 16 --max-new-tokens 64 \
  --out "$OUT/concurrency"
