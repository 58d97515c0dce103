#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: sync this repo to every worker, install it, and run
#   python -m jaxcap.launch --config=configs/caprl.py:paper ...
# on all workers at once (gcloud compute tpus tpu-vm ssh --worker=all).
#
# Usage (from the repo root):
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a launch/tpu_pod.sh [--config.overrides ...]
#
# Environment:
#   TPU_NAME     (required) the TPU VM / pod slice name
#   ZONE         (required) its zone
#   PROJECT      GCP project (default: gcloud's configured project)
#   CONFIG       config file and variant (default: configs/caprl.py:paper)
#   REMOTE_DIR   where the repo lives on each worker (default: jaxcap, i.e. ~/jaxcap)
#   SETUP=1      pip install the repo and jax[tpu] on every worker first (needed once per slice)
#   SYNC=0       skip copying the repo (default 1: copy the tracked + untracked-not-ignored files)
#   RUN=0        only sync / set up, do not train
#   DETACH=1     run under nohup with one log per worker in REMOTE_DIR/logs/ and return at once
#   PYTHON       interpreter on the workers (default: python3)
#   DRY_RUN=1    print the gcloud commands instead of running them
#
# Multi-host: every worker runs the same command. jax.distributed needs a coordinator; the script looks up
# worker 0's internal IP and exports JAX_COORDINATOR_ADDRESS=<ip>:8476 on all workers, so
# `jaxcap.launch.init_distributed` calls jax.distributed.initialize(), which reads the process count and id
# from the TPU metadata server. Checkpoints, metrics and exports go to --config.workdir on each worker;
# point it at a shared bucket or filesystem (e.g. --config.workdir=gs://bucket/runs/caprl) for multi-host.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME to the pod slice name}"
: "${ZONE:?set ZONE to the pod slice zone}"
CONFIG="${CONFIG:-configs/caprl.py:paper}"
REMOTE_DIR="${REMOTE_DIR:-jaxcap}"
PYTHON="${PYTHON:-python3}"
SETUP="${SETUP:-0}"
SYNC="${SYNC:-1}"
DETACH="${DETACH:-0}"
RUN="${RUN:-1}"
DRY_RUN="${DRY_RUN:-0}"
COORDINATOR_PORT="${COORDINATOR_PORT:-8476}"

cd "$(dirname "${BASH_SOURCE[0]}")/.."

GCLOUD=(gcloud compute tpus tpu-vm)
SCOPE=(--zone "$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  SCOPE+=(--project "$PROJECT")
fi

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

on_all_workers() {  # on_all_workers "remote shell command"
  run "${GCLOUD[@]}" ssh "$TPU_NAME" "${SCOPE[@]}" --worker=all --command "$1"
}

# 1. Sync the repo (tracked files and untracked files git does not ignore).
if [[ "$SYNC" == 1 ]]; then
  archive="$(mktemp -t jaxcap-XXXXXX.tar.gz)"
  trap 'rm -f "$archive"' EXIT
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "git ls-files -z --cached --others --exclude-standard | tar -czf $archive --null -T -"
  else
    git ls-files -z --cached --others --exclude-standard | tar -czf "$archive" --null -T -
  fi
  run "${GCLOUD[@]}" scp "$archive" "$TPU_NAME:/tmp/jaxcap.tar.gz" "${SCOPE[@]}" --worker=all
  on_all_workers "mkdir -p $REMOTE_DIR && tar -xzf /tmp/jaxcap.tar.gz -C $REMOTE_DIR && rm /tmp/jaxcap.tar.gz"
fi

# 2. Install (once per slice).
if [[ "$SETUP" == 1 ]]; then
  on_all_workers "cd $REMOTE_DIR && $PYTHON -m pip install -U pip && $PYTHON -m pip install -e . 'jax[tpu]'"
fi

if [[ "$RUN" != 1 ]]; then
  exit 0
fi

# 3. Coordinator: worker 0's internal IP.
if [[ "$DRY_RUN" == 1 ]]; then
  coordinator_ip="WORKER0_IP"
  run "${GCLOUD[@]}" describe "$TPU_NAME" "${SCOPE[@]}" --format='value(networkEndpoints[0].ipAddress)'
else
  coordinator_ip="$("${GCLOUD[@]}" describe "$TPU_NAME" "${SCOPE[@]}" \
    --format='value(networkEndpoints[0].ipAddress)')"
fi

# 4. Train: the same command on every worker.
overrides=""
if (($#)); then
  overrides="$(printf '%q ' "$@")"
fi
train="cd $REMOTE_DIR && JAX_COORDINATOR_ADDRESS=$coordinator_ip:$COORDINATOR_PORT \
$PYTHON -m jaxcap.launch --config=$CONFIG $overrides"
if [[ "$DETACH" == 1 ]]; then
  train="mkdir -p $REMOTE_DIR/logs && nohup bash -c $(printf '%q' "$train") \
> $REMOTE_DIR/logs/\$(hostname).log 2>&1 < /dev/null &"
fi
on_all_workers "$train"
if [[ "$DETACH" == 1 ]]; then
  echo "started on every worker of $TPU_NAME; follow worker 0 with:"
  echo "  ${GCLOUD[*]} ssh $TPU_NAME ${SCOPE[*]} --worker=0 --command 'tail -f $REMOTE_DIR/logs/*.log'"
fi
