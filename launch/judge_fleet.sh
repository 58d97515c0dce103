#!/usr/bin/env bash
# Start a judge fleet on this node: NUM_SERVERS OpenAI-compatible servers (vLLM or SGLang), each on TP GPUs and
# its own port, wait until they answer, then print the endpoints string for --config.judge.endpoints.
#
# Usage:
#   launch/judge_fleet.sh                                   # vLLM, Qwen2.5-3B-Instruct, 1 GPU per server, all GPUs
#   ENGINE=sglang MODEL=7b TP=2 launch/judge_fleet.sh       # SGLang, Qwen2.5-7B-Instruct, 2 GPUs per server
#   MODEL=vl7b NUM_SERVERS=2 TP=2 launch/judge_fleet.sh     # a VLM judge (Qwen2.5-VL-7B-Instruct) for images
#
# Environment:
#   ENGINE        vllm (default) or sglang
#   MODEL         3b | 7b | vl3b | vl7b | any HF id or local path (default: 3b = Qwen/Qwen2.5-3B-Instruct)
#   SERVED_NAME   model name the servers answer to = --config.judge.model (default: judge)
#   TP            GPUs per server (tensor parallel, default 1)
#   GPUS          comma-separated GPU ids to use (default: all that nvidia-smi lists)
#   NUM_SERVERS   servers to start (default: as many as fit: number of GPUs / TP)
#   BASE_PORT     first port (default 8000); server i listens on BASE_PORT + i
#   HOST          address the servers bind to (default 127.0.0.1: this node only; HOST=0.0.0.0 serves other nodes)
#   PUBLIC_HOST   host name the trainers use to reach this node (default: 127.0.0.1 when HOST is loopback, else
#                 hostname -f)
#   API_KEY_ENV   variable holding the API key the servers require (default JUDGE_API_KEY, the trainer's default
#                 --config.judge.api_key_env); the servers get it as --api-key, the trainers send it as a bearer token
#   NO_API_KEY=1  start the servers without an API key (then pass --config.judge.api_key_env='')
#   MAX_MODEL_LEN context length (default 8192: caption + questions fit)
#   MEM_FRACTION  share of each GPU's memory for weights + KV cache (default 0.90)
#   LOG_DIR       server logs (default: judge-logs)
#   WAIT_S        seconds to wait for every server to answer /v1/models (default 900)
#   EXTRA_ARGS    extra arguments appended to every server command
#   DRY_RUN=1     print the server commands and the endpoints string, start nothing
#
# The servers keep running after the script returns (nohup); stop them with: kill $(cat LOG_DIR/pids)
# Several nodes: run this on each judge node and join the printed endpoints strings with commas.
set -euo pipefail

ENGINE="${ENGINE:-vllm}"
MODEL="${MODEL:-3b}"
SERVED_NAME="${SERVED_NAME:-judge}"
TP="${TP:-1}"
BASE_PORT="${BASE_PORT:-8000}"
HOST="${HOST:-127.0.0.1}"
API_KEY_ENV="${API_KEY_ENV:-JUDGE_API_KEY}"
NO_API_KEY="${NO_API_KEY:-0}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-8192}"
MEM_FRACTION="${MEM_FRACTION:-0.90}"
LOG_DIR="${LOG_DIR:-judge-logs}"
WAIT_S="${WAIT_S:-900}"
DRY_RUN="${DRY_RUN:-0}"
read -r -a extra <<< "${EXTRA_ARGS:-}"

# The key comes from the same variable the trainer reads (judge.api_key_env), so both sides agree on it.
api_key=""
if [[ "$NO_API_KEY" != 1 ]]; then
  if [[ ! "$API_KEY_ENV" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
    echo "API_KEY_ENV=$API_KEY_ENV is not a variable name" >&2
    exit 1
  fi
  api_key="${!API_KEY_ENV:-}"
  if [[ "$DRY_RUN" == 1 ]]; then
    api_key="\$$API_KEY_ENV"  # a dry run shows the variable, never the key
  elif [[ -z "$api_key" ]]; then
    echo "$API_KEY_ENV is not set: the judge servers require an API key and the trainer sends the one in" \
      "\$$API_KEY_ENV (--config.judge.api_key_env). Fix: export $API_KEY_ENV=\$(openssl rand -hex 16) here and" \
      "on the trainer hosts, or NO_API_KEY=1 to serve without one (then --config.judge.api_key_env='')." >&2
    exit 1
  fi
fi
loopback=0
case "$HOST" in
  127.*|localhost|::1) loopback=1 ;;
esac

vlm=0
case "$MODEL" in
  3b) MODEL=Qwen/Qwen2.5-3B-Instruct ;;
  7b) MODEL=Qwen/Qwen2.5-7B-Instruct ;;
  vl3b) MODEL=Qwen/Qwen2.5-VL-3B-Instruct; vlm=1 ;;
  vl7b) MODEL=Qwen/Qwen2.5-VL-7B-Instruct; vlm=1 ;;
  *VL*|*vl*) vlm=1 ;;
esac

if [[ -n "${GPUS:-}" ]]; then
  IFS=, read -r -a gpus <<< "$GPUS"
elif [[ "$DRY_RUN" == 1 ]] && ! command -v nvidia-smi > /dev/null; then
  gpus=(0 1 2 3 4 5 6 7)
else
  mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader)
fi
if ((${#gpus[@]} < TP)); then
  echo "need TP=$TP GPUs per server, have ${#gpus[@]} (${gpus[*]:-none})" >&2
  exit 1
fi
NUM_SERVERS="${NUM_SERVERS:-$((${#gpus[@]} / TP))}"
if ((NUM_SERVERS * TP > ${#gpus[@]})); then
  echo "NUM_SERVERS=$NUM_SERVERS x TP=$TP needs $((NUM_SERVERS * TP)) GPUs, have ${#gpus[@]}" >&2
  exit 1
fi
if [[ "$loopback" == 1 ]]; then
  PUBLIC_HOST="${PUBLIC_HOST:-127.0.0.1}"
  if [[ "$PUBLIC_HOST" != 127.* && "$PUBLIC_HOST" != localhost ]]; then
    echo "note: the servers bind to $HOST; trainers on other nodes reach $PUBLIC_HOST only with HOST=0.0.0.0" >&2
  fi
else
  PUBLIC_HOST="${PUBLIC_HOST:-$(hostname -f 2>/dev/null || hostname)}"
  if [[ -z "$api_key" ]]; then
    echo "warning: serving on $HOST without an API key (NO_API_KEY=1): anyone on the network can use the judges" >&2
  fi
fi
ready_host="$HOST"
if [[ "$loopback" != 1 ]]; then
  ready_host=127.0.0.1
fi

server_cmd() {  # server_cmd PORT -> the command line of one server, in the array `cmd`
  local port="$1"
  if [[ "$ENGINE" == vllm ]]; then
    cmd=(vllm serve "$MODEL" --host "$HOST" --port "$port" --served-model-name "$SERVED_NAME"
         --tensor-parallel-size "$TP" --max-model-len "$MAX_MODEL_LEN"
         --gpu-memory-utilization "$MEM_FRACTION")
    if [[ "$vlm" == 1 ]]; then
      cmd+=(--limit-mm-per-prompt '{"image": 1}')
    fi
  elif [[ "$ENGINE" == sglang ]]; then
    cmd=(python -m sglang.launch_server --model-path "$MODEL" --host "$HOST" --port "$port"
         --served-model-name "$SERVED_NAME" --tp "$TP" --context-length "$MAX_MODEL_LEN"
         --mem-fraction-static "$MEM_FRACTION")
  else
    echo "ENGINE=$ENGINE: use vllm or sglang" >&2
    exit 1
  fi
  if [[ -n "$api_key" ]]; then
    cmd+=(--api-key "$api_key")
  fi
  cmd+=("${extra[@]}")
}

if [[ "$DRY_RUN" != 1 ]]; then
  mkdir -p "$LOG_DIR"
  : > "$LOG_DIR/pids"
fi
endpoints=()
for ((i = 0; i < NUM_SERVERS; i++)); do
  port=$((BASE_PORT + i))
  devices="$(IFS=,; echo "${gpus[*]:i*TP:TP}")"
  server_cmd "$port"
  endpoints+=("http://$PUBLIC_HOST:$port/v1")
  if [[ "$DRY_RUN" == 1 ]]; then
    printf 'CUDA_VISIBLE_DEVICES=%s ' "$devices"
    printf '%q ' "${cmd[@]}"
    printf '\n'
    continue
  fi
  CUDA_VISIBLE_DEVICES="$devices" nohup "${cmd[@]}" > "$LOG_DIR/$ENGINE-$port.log" 2>&1 < /dev/null &
  echo $! >> "$LOG_DIR/pids"
  echo "started $ENGINE $MODEL on GPUs $devices port $port (log $LOG_DIR/$ENGINE-$port.log, pid $!)"
done

if [[ "$DRY_RUN" != 1 ]]; then
  deadline=$((SECONDS + WAIT_S))
  for ((i = 0; i < NUM_SERVERS; i++)); do
    port=$((BASE_PORT + i))
    # The key goes to curl on stdin, not on its command line (ps would show it).
    url="http://$ready_host:$port/v1/models"
    until printf 'Authorization: Bearer %s\n' "$api_key" | curl -sf -H @- "$url" > /dev/null; do
      if ((SECONDS > deadline)); then
        echo "server on port $port did not answer within ${WAIT_S}s; see $LOG_DIR/$ENGINE-$port.log" >&2
        exit 1
      fi
      sleep 5
    done
    echo "port $port ready"
  done
fi

joined="$(IFS=,; echo "${endpoints[*]}")"
echo "JUDGE_ENDPOINTS=$joined"
images=""
if [[ "$vlm" == 1 ]]; then
  images="  (a VLM judge: give it the images where the reward supports it)"
fi
echo "pass to the trainer:$images"
key_flag="--config.judge.api_key_env=$API_KEY_ENV"
if [[ -z "$api_key" ]]; then
  key_flag="--config.judge.api_key_env=''"
fi
echo "  --config.judge.kind=http --config.judge.endpoints=$joined --config.judge.model=$SERVED_NAME $key_flag"
if [[ -n "$api_key" ]]; then
  echo "  (with $API_KEY_ENV exported on the trainer hosts: the same key)"
fi
