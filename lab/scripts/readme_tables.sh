#!/usr/bin/env bash
# The runs behind the README's tables, each ONE `python -m lab bench` run (configurations
# interleaved problem by problem, caches reset before every request, ratios from the same run).
# concurrency, soak, grammar and tool are the benchmarks of serving many requests, reliability,
# constrained decoding and tool use (one run each too).
#   lab/scripts/readme_tables.sh [headroom|tuning|main|safe|kv|remote|departures|concurrency|soak|grammar|tool|rag|speed|serve|real|all]
#   (CPU; ~2.5 h for all on 2 cores; run on a quiet machine: the numbers are times)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
CLI=${CLI:-$PY -m lab}
BENCH=${BENCH:-$CLI bench}
OUT=${OUT:-lab/results}
MODELS=core/testbed/models

headroom() {  # the default against the ceiling: every member alone, every method at its default
  # and best options on every pair, the three, and the three with the weak member, each as
  # Ensemble(members, method) gives it; SAFE, SpecEM and rerank also calibrated (label-free
  # trust on 12 training problems of seed 2)
  $BENCH --headroom --n 200 --seed 1 --calibrate 12 --warmup-seed 2 --threads 1 \
    --max-new-tokens 128 --out "$OUT/headroom" \
    --config "bpe + spm + word: safe (token decisions)=safe:members=0+1+2,decide=token" \
    --config "bpe + spm + word: safe (GaC)=safe:members=0+1+2,aggregator=gac"
  # rerank counting each answer as its least likely token, on every set (the rows marked ²)
  local min=rerank:score=min
  $BENCH --headroom --n 200 --seed 1 --threads 1 --max-new-tokens 128 --methods single \
    --config "bpe + spm: rerank=$min,members=0+1" --config "bpe + word: rerank=$min,members=0+2" \
    --config "spm + word: rerank=$min,members=1+2" \
    --config "bpe + spm + word: rerank=$min,members=0+1+2" \
    --config "bpe + spm + word + early: rerank=$min,members=0+1+2+3" \
    --out "$OUT/headroom-rerank-min"
  # SpecEM with self_preference="builtin" (rerank's default) on the three and with the weak
  # member (the rows marked ⁴), and rerank without it on every set
  local own=self_preference=builtin label="(self-preference, built-in prompts)"
  local off=rerank:self_preference=off
  $BENCH --headroom --n 200 --seed 1 --threads 1 --max-new-tokens 128 --methods single \
    --config "bpe + spm + word: specem $label=specem:members=0+1+2,$own" \
    --config "bpe + spm + word + early: specem $label=specem:members=0+1+2+3,$own" \
    --config "bpe + spm: rerank (self_preference off)=$off,members=0+1" \
    --config "bpe + word: rerank (self_preference off)=$off,members=0+2" \
    --config "spm + word: rerank (self_preference off)=$off,members=1+2" \
    --config "bpe + spm + word: rerank (self_preference off)=$off,members=0+1+2" \
    --config "bpe + spm + word + early: rerank (self_preference off)=$off,members=0+1+2+3" \
    --out "$OUT/headroom-builtin"
}

tuning() {  # how the defaults and each method's best options were chosen: held-out problems of
  # seed 2, never the README's seed 1; members equally weighted
  $BENCH --n 200 --seed 2 --threads 1 --max-new-tokens 128 --out "$OUT/tuning" --methods single \
    --config "safe (paper preset)=safe:preset=paper" \
    --config "safe heal geometric=safe:preset=paper,heal=true,sharpen=geometric" \
    --config "safe, the default (heal, geometric, drafts grow to 20, words)=safe" \
    --config "safe, token decisions=safe:decide=token" \
    --config "token=token" --config "token, first sub-token=token:subtoken=first" \
    --config "specem=specem" --config "specem no feedback=specem:feedback=false" \
    --config "rerank=rerank"
  # SAFE's word decisions (decide="word") against its token decisions on tool use and
  # retrieval, seed 2 too
  $BENCH --form tool --n 100 --seed 2 --threads 1 --max-new-tokens 160 --methods single,safe \
    --config "safe, token decisions=safe:decide=token" --out "$OUT/tuning-tool"
  $PY examples/llamaindex_rag.py --eval 200 --seed 2 --threads 1 --out "$OUT/tuning-rag"
}

main() {  # the default, then every method on the three shipped models; every label names its
  # options (members equally weighted: no trust learned)
  $BENCH --n 200 --threads 1 --max-new-tokens 128 --out "$OUT/main" --methods single \
    --config "safe, the default (heal, geometric, drafts grow to 20, words)=safe" \
    --config "safe, token decisions=safe:decide=token" \
    --config "token unite (published: non-blank sub-token)=token:aggregator=unite" \
    --config "token unite, first sub-token=token:aggregator=unite,subtoken=first" \
    --config "token gac (published: gated at 0.5)=token:aggregator=gac" \
    --config "token gac, every token=token:aggregator=gac,gate=none" \
    --config "safe unite (paper preset)=safe:preset=paper" \
    --config "safe gac (paper preset)=safe:aggregator=gac,preset=paper" \
    --config "safe unite, authors' rules=safe:preset=authors" \
    --config "safe unite heal=safe:preset=paper,heal=true" \
    --config "safe unite geometric heal=safe:preset=paper,heal=true,sharpen=geometric" \
    --config "safe unite, drafts grow to 20=safe:preset=paper,max_lookahead=20" \
    --config "specem=specem" \
    --config "specem paper preset (sampled drafts)=specem:preset=paper" \
    --config "specem no feedback=specem:feedback=false"
}

safe() {  # SAFE in both drafter orders: bpe (coarser digits) and spm (finer digits) drafting
  local configs=() order name agg sharpen heal suffix
  for order in "bpe:0+1" "spm:1+0"; do
    name=${order%%:*}
    for agg in unite gac; do
      for sharpen in heuristic geometric none; do
        for heal in false true; do
          suffix=""; [ "$heal" = true ] && suffix=" heal"
          configs+=(--config "safe[$name] $agg $sharpen$suffix=safe:members=${order#*:},preset=paper,aggregator=$agg,sharpen=$sharpen,heal=$heal")
        done
      done
      configs+=(--config "safe[$name] $agg heuristic heal-oov=safe:members=${order#*:},preset=paper,aggregator=$agg,heal=oov")
      [ "$agg" = unite ] && for heal in false true; do  # drafts that grow while they stand
        suffix=""; [ "$heal" = true ] && suffix=" heal"
        configs+=(--config "safe[$name] $agg heuristic$suffix, grow to 20=safe:members=${order#*:},preset=paper,aggregator=$agg,heal=$heal,max_lookahead=20")
      done
    done
  done
  $BENCH --n 200 --threads 1 --max-new-tokens 128 --out "$OUT/safe" \
    --model "$MODELS/tb-gpt2-bpe" --model "$MODELS/tb-qwen2-spm" \
    --methods single --aggregator unite,gac \
    --config "token unite (published: non-blank sub-token)=token:aggregator=unite" \
    --config "token unite, first sub-token=token:aggregator=unite,subtoken=first" \
    --config "token gac (published: gated at 0.5)=token:aggregator=gac" \
    --config "token gac, every token=token:aggregator=gac,gate=none" \
    "${configs[@]}"
}

kv() {  # SpecEM's KV reuse against recomputing every cache every round, 512 output tokens
  $BENCH --shape testbed --ignore-stop --temperature 1 --n 3 --threads 1 \
    --max-new-tokens 512 --out "$OUT/kv" --methods "" \
    --config "specem (reuse caches)=specem" \
    --config "specem (recompute every round)=specem:reuse_cache=false"
}

remote() {  # members on vLLM servers against in-process, with and without prefix caching
  local flags out log
  for flags in "" "--no-enable-prefix-caching"; do
    out=$OUT/remote; [ -n "$flags" ] && out=$OUT/remote-no-prefix-cache
    log=$(mktemp)
    VLLM_EXTRA_ARGS=$flags bash .ci/remote.sh serve >"$log" 2>&1 &
    local serve=$!
    until grep -q "^export LLM_ENSEMBLING_SERVERS=" "$log"; do
      kill -0 "$serve" 2>/dev/null || { cat "$log"; return 1; }
      sleep 2
    done
    local servers; servers=$(sed -n 's/^export LLM_ENSEMBLING_SERVERS=//p' "$log")
    local urls=(); mapfile -t urls < <(.venv/bin/python -c \
      'import json,sys; [print(s["base_url"]) for s in json.load(open(sys.argv[1]))]' "$servers")
    $BENCH --n 20 --threads 1 --max-new-tokens 128 --out "$out" \
      --model "$MODELS/tb-gpt2-bpe" --remote "${urls[0]}" \
      --model "$MODELS/tb-qwen2-spm" --remote "${urls[1]}" \
      --methods single,token,specem --aggregator unite \
      --config "safe unite=safe:aggregator=unite,preset=paper" || true
    kill -TERM "$serve"; wait "$serve" || true; rm -f "$log"
  done
}

departures2() {  # docs/departures.md: SAFE's three rules one by one and together (the authors'
  # released code: preset=authors), the token baselines as published against the variants run
  # before; two members, both drafter orders
  local configs=() order name m
  for order in "bpe:0+1" "spm:1+0"; do
    name=${order%%:*}; m=members=${order#*:}
    configs+=(--config "safe[$name] library rules=safe:$m,preset=paper")
    configs+=(--config "safe[$name] authors rules=safe:$m,preset=authors")
    configs+=(--config "safe[$name] stop read as text=safe:$m,preset=paper,stop_check=text")
    configs+=(--config "safe[$name] remap as aligned=safe:$m,preset=paper,remap=as-aligned")
    configs+=(--config "safe[$name] nonblank sub-token=safe:$m,preset=paper,subtoken=nonblank")
    configs+=(--config "safe[$name] gac library rules=safe:$m,preset=paper,aggregator=gac")
    configs+=(--config "safe[$name] gac authors rules=safe:$m,aggregator=gac,preset=authors")
    configs+=(--config "token[$name] unite=token:$m")
    configs+=(--config "token[$name] unite first sub-token=token:$m,subtoken=first")
    configs+=(--config "token[$name] gac=token:$m,aggregator=gac")
    configs+=(--config "token[$name] gac every token=token:$m,aggregator=gac,gate=none")
  done
  $BENCH --n 200 --threads 1 --max-new-tokens 128 --out "$OUT/departures" \
    --model "$MODELS/tb-gpt2-bpe" --model "$MODELS/tb-qwen2-spm" --methods single \
    "${configs[@]}"
}

departures3() {  # docs/departures.md: the token baselines and SpecEM's choices, three members
  $BENCH --n 200 --threads 1 --max-new-tokens 128 --out "$OUT/departures-3" --methods single \
    --config "token unite=token" --config "token unite first sub-token=token:subtoken=first" \
    --config "token gac=token:aggregator=gac" \
    --config "token gac every token=token:aggregator=gac,gate=none" \
    --config "specem=specem" --config "specem paper preset=specem:preset=paper" \
    --config "specem paper drafts=specem:draft_temperature=0.6,draft_top_p=0.9" \
    --config "specem t counts rounds=specem:schedule=rounds" \
    --config "specem logit score=specem:score=logit" \
    --config "specem prob score=specem:score=prob" \
    --config "specem no feedback=specem:feedback=false"
}

concurrency() {  # every method at its defaults at 1, 8 and 16 concurrent requests, against the
  # same requests one at a time and against the bare models' own batching of them (the bound);
  # short chain-of-thought prompts, then RAG-length ones; levels interleaved chunk by chunk
  local methods=single,token,safe,specem,rerank
  $BENCH --concurrency 1,8,16 --n 64 --threads 1 --max-new-tokens 32 --ignore-stop \
    --methods "$methods" --out "$OUT/concurrency"
  $BENCH --concurrency 1,8,16 --form rag --prompt-tokens 720 --n 32 --threads 1 \
    --max-new-tokens 40 --ignore-stop --methods "$methods" --out "$OUT/concurrency-rag"
}

soak() {  # 1,000 requests: methods, threads and asyncio tasks, abandoned and cancelled streams,
  # injected member failures under both policies; every answer checked against a fresh ensemble
  $CLI soak --requests 1000 --threads 1 --out "$OUT/soak"
}

grammar() {  # time per output token with a grammar that allows any text, against none
  $BENCH --grammar-cost --n 100 --threads 1 --max-new-tokens 128 \
    --methods single,token,specem --config "safe=safe:preset=paper" --out "$OUT/grammar"
}

rag() {  # retrieval through LlamaIndex's query engine: every member alone and every method at its
  # defaults on 400 problems (rows 5 points apart differ by more than their noise)
  $PY examples/llamaindex_rag.py --eval 400 --seed 1 --threads 1 --out "$OUT/rag"
  # SpecEM built with self_preference="builtin" (rerank's default), and rerank without it
  $PY examples/llamaindex_rag.py --eval 400 --seed 1 --threads 1 --methods single,specem \
    --self-preference builtin --out "$OUT/rag-builtin"
  $PY examples/llamaindex_rag.py --eval 400 --seed 1 --threads 1 --methods single,rerank \
    --self-preference off --out "$OUT/rag-rerank-off"
  # the same problems with LlamaIndex's LongContextReorder (the best passage next to the question)
  $PY examples/llamaindex_rag.py --eval 400 --seed 1 --threads 1 --order reorder \
    --out "$OUT/rag-reorder"
}

tool() {  # tool use: each single model and method, with the grammar and with the prompt only
  $BENCH --form tool --n 200 --threads 1 --max-new-tokens 160 \
    --methods single,token,safe,specem,rerank \
    --config "safe (paper preset)=safe:preset=paper" --out "$OUT/tool"
  # rerank counting each answer as its least likely token
  $BENCH --form tool --n 200 --threads 1 --max-new-tokens 160 --methods single \
    --config "rerank=rerank:score=min" --out "$OUT/tool-rerank-min"
  # SpecEM built with self_preference="builtin" (rerank's default), and rerank without it
  $BENCH --form tool --n 200 --threads 1 --max-new-tokens 160 --methods single \
    --config "specem (self-preference, built-in prompts)=specem:self_preference=builtin" \
    --config "rerank (self_preference off)=rerank:self_preference=off" \
    --out "$OUT/tool-builtin"
  # LangChain's standard integration suite, unmarked: each member alone and every method
  $PY -m lab.bench.langchain_suite --model "$MODELS/tb-gpt2-bpe" --model "$MODELS/tb-qwen2-spm" \
    --model "$MODELS/tb-llama-word" --max-tokens 64 --config "bpe alone=single:member=0" \
    --config "spm alone=single:member=1" --config "word alone=single:member=2" \
    --config "safe, the default=safe" --config "token=token" --config "specem=specem" \
    --config "rerank=rerank" --out "$OUT/langchain-suite-shipped"
}

speed() {  # time per output token against the drafter alone, side by side in one run, and where
  # a SAFE token goes; the shipped three, then the real pair (the `real` extra)
  $PY -m lab.bench.speed --n 60 --seed 7 --rounds 3 --out "$OUT/speed-shipped" \
    --config "drafter alone=single:member=0" --config "safe (default)=safe" \
    --config "safe (token decisions)=safe:decide=token" \
    --config "safe (paper preset)=safe:preset=paper" --config "specem (default)=specem" \
    --config "rerank (default)=rerank"
  $PY -m lab.bench.speed --real --prompts questions --n 30 --max-new-tokens 24 --rounds 2 \
    --config "drafter alone=single:member=0" --config "safe (default)=safe" \
    --config "safe (token decisions)=safe:decide=token" \
    --config "safe (paper preset)=safe:preset=paper" --config "specem (default)=specem" \
    --config "rerank (default)=rerank" --out "$OUT/speed-real-pair"
  # linear against the few-row kernel (core/few_rows.py): output heads, the real pair's passes
  mkdir -p "$OUT/few-row-kernels"
  for threads in 2 1; do  # the speed runs use 1 torch thread
    $PY -m lab.scripts.few_row_kernels --threads "$threads"
  done | tee "$OUT/few-row-kernels/results.txt"
  # the real pair in float32, then in bfloat16, back to back (the members' dtype on a CPU)
  for dtype in float32 bfloat16; do
    $PY -m lab.bench.speed --real --dtype "$dtype" --prompts questions --n 30 \
      --max-new-tokens 24 --rounds 2 --config "drafter alone=single:member=0" \
      --config "safe (default)=safe" --config "safe (token decisions)=safe:decide=token" \
      --config "safe (paper preset)=safe:preset=paper" --config "specem (default)=specem" \
      --config "rerank (default)=rerank" --out "$OUT/speed-real-pair-$dtype"
  done
}

serve() {  # every method served over HTTP against the same requests in process; then the soak
  # over HTTP (malformed, abandoned and faulted requests; every answer checked)
  $BENCH --serve 1,8,32 --n 32 --threads 1 --max-new-tokens 32 --stream-intervals 1,8 \
    --out "$OUT/serve/load"
  $CLI soak --serve --requests 1000 --threads 1 --tasks 8 --out "$OUT/serve/soak"
}

real() {  # the real pair (SmolLM2-135M-Instruct drafting, Gemma-3-270M base; the real extra)
  # on the real task's reporting seed 1: the headroom table on its qa and rag forms (each member
  # alone, every method at its defaults and best options, SAFE with next-token decisions and as
  # published; also SAFE, SpecEM and rerank after Ensemble.calibrate on the prompts of 12
  # problems of the form of seed 2: weights and, for SpecEM and rerank, self-preference), then
  # tool use, retrieval through LlamaIndex and LangChain's standard suite.
  # Problems per form: 60 qa, 60 rag, 40 tool, 200 through LlamaIndex (REAL_QA_N, REAL_RAG_N,
  # REAL_TOOL_N, REAL_LLAMAINDEX_N choose others). Not part of `all`: it needs the real extra.
  local form n calibrate
  for form in qa rag; do
    n=${REAL_QA_N:-60}; calibrate=12
    [ "$form" = rag ] && n=${REAL_RAG_N:-60}
    $BENCH --headroom --task real --form "$form" --n "$n" --seed 1 --threads 1 \
      --max-new-tokens 48 --methods safe,specem,rerank --calibrate "$calibrate" \
      --config "safe (token decisions)=safe:decide=token" \
      --config "safe (paper preset)=safe:preset=paper" --out "$OUT/real-headroom-$form"
    # rerank counting each answer as its least likely token (the rows marked ²)
    $BENCH --headroom --task real --form "$form" --n "$n" --seed 1 --threads 1 \
      --max-new-tokens 48 --methods single --config "smollm2 + gemma: rerank=rerank:score=min" \
      --out "$OUT/real-headroom-$form-rerank"
    # SpecEM with self_preference="builtin" (rerank's default; the rows marked ⁴), and rerank
    # without it
    $BENCH --headroom --task real --form "$form" --n "$n" --seed 1 --threads 1 \
      --max-new-tokens 48 --methods single \
      --config "specem (self-preference, built-in prompts)=specem:self_preference=builtin" \
      --config "rerank (self_preference off)=rerank:self_preference=off,finished_first=false" \
      --config "rerank (finished_first off)=rerank:finished_first=false" \
      --out "$OUT/real-headroom-$form-builtin"
  done
  for form in qa rag; do  # each method at its defaults with both members in bfloat16
    $BENCH --headroom --task real --form "$form" --n 60 --seed 1 --threads 1 --dtype bfloat16 \
      --max-new-tokens 48 --methods safe,specem,rerank --out "$OUT/real-headroom-$form-bfloat16"
  done
  $BENCH --task real --form tool --n "${REAL_TOOL_N:-40}" --seed 1 --threads 1 \
    --max-new-tokens 160 --methods single,safe,specem,rerank \
    --config "safe (paper preset)=safe:preset=paper" --out "$OUT/real-tool"
  # the default against each member alone on 100 tool problems (the first 40 are the above)
  $BENCH --task real --form tool --n 100 --seed 1 --threads 1 --max-new-tokens 160 \
    --methods single,safe --out "$OUT/real-tool-100"
  # retrieval through LlamaIndex's query engine on the real task's rag form: every member alone
  # and every method at its defaults (REAL_LLAMAINDEX_N problems, 200 by default)
  $PY examples/llamaindex_rag.py --real --eval "${REAL_LLAMAINDEX_N:-200}" --seed 1 --threads 1 \
    --out "$OUT/real-rag"
  # the same, SpecEM and rerank calibrated first (weights and self-preference) on 12 of seed 2
  $PY examples/llamaindex_rag.py --real --eval "${REAL_LLAMAINDEX_N:-200}" --seed 1 --threads 1 \
    --methods single,specem,rerank --calibrate 12 --out "$OUT/real-rag-calibrated"
  # the same, SpecEM built with self_preference="builtin" (rerank's default), rerank without it
  $PY examples/llamaindex_rag.py --real --eval "${REAL_LLAMAINDEX_N:-200}" --seed 1 --threads 1 \
    --methods single,specem --self-preference builtin --out "$OUT/real-rag-builtin"
  $PY examples/llamaindex_rag.py --real --eval "${REAL_LLAMAINDEX_N:-200}" --seed 1 --threads 1 \
    --methods single,rerank --self-preference off --out "$OUT/real-rag-rerank-off"
  # the same problems with LlamaIndex's LongContextReorder (the best passage next to the question)
  $PY examples/llamaindex_rag.py --real --eval "${REAL_LLAMAINDEX_N:-200}" --seed 1 --threads 1 \
    --methods single,safe,specem,rerank --order reorder --out "$OUT/real-rag-reorder"
  # LangChain's standard integration suite, unmarked: each member alone and every method
  $PY -m lab.bench.langchain_suite --real --max-tokens 64 \
    --config "smollm2 alone=single:member=0" --config "gemma alone=single:member=1" \
    --config "safe, the default=safe" --config "specem=specem" --config "rerank=rerank" \
    --out "$OUT/langchain-suite-real"
  $PY -m lab.bench.langchain_suite --real --max-tokens 64 \
    --config "safe, gemma drafting=safe:drafter=1" --out "$OUT/langchain-suite-real/safe-gemma-drafting"
  # every method served over HTTP against the same requests in process, and concurrent
  # requests against one at a time and the bare models' batching, on the real pair
  $BENCH --serve 1,8,32 --task real --n 32 --threads 1 --max-new-tokens 24 \
    --out "$OUT/serve/real-pair"
  $BENCH --concurrency 1,8 --task real --n 16 --threads 1 --max-new-tokens 24 --ignore-stop \
    --methods single,token,safe,specem,rerank --out "$OUT/concurrency-real-pair"
}

case "${1:-all}" in
  headroom) headroom ;;
  tuning) tuning ;;
  main) main ;;
  safe) safe ;;
  kv) kv ;;
  remote) remote ;;
  departures) departures2; departures3 ;;
  concurrency) concurrency ;;
  soak) soak ;;
  grammar) grammar ;;
  tool) tool ;;
  rag) rag ;;
  speed) speed ;;
  serve) serve ;;
  real) real ;;
  all) headroom; tuning; main; safe; kv; remote; departures2; departures3; concurrency; soak; grammar; tool; rag; speed; serve ;;
  *) echo "usage: $0 [headroom|tuning|main|safe|kv|remote|departures|concurrency|soak|grammar|tool|rag|speed|serve|real|all]" >&2
     exit 2 ;;
esac
