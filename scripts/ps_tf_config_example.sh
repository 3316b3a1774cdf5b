#!/usr/bin/env bash
# A parameter-server job started the way TensorFlow's launchers start one: every process gets
# TF_CONFIG naming the cluster and its own task. Here all four run on this machine; on a
# cluster each line runs on its own host with that host's TF_CONFIG.
#   scripts/ps_tf_config_example.sh [--set k=v ...]      (CTRAIN_BASE_PORT: the chief's port)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CTRAIN_BUILD:-build}"
job="${JOB:-examples/fashion_mnist_mlp.yaml}"
port="${CTRAIN_BASE_PORT:-7450}"
cluster="{\"chief\": [\"127.0.0.1:$port\"], \"ps\": [\"127.0.0.1:$((port + 1))\"],
          \"worker\": [\"127.0.0.1:0\", \"127.0.0.1:0\"]}"
tf_config() { echo "{\"cluster\": $cluster, \"task\": {\"type\": \"$1\", \"index\": $2}}"; }
args=(--job "$job" --set strategy.type=parameter_server "$@")
TF_CONFIG="$(tf_config ps 0)" "$bin/ps/ctrain-ps" "${args[@]}" &
TF_CONFIG="$(tf_config worker 0)" "$bin/worker/ctrain-worker" "${args[@]}" &
TF_CONFIG="$(tf_config worker 1)" "$bin/worker/ctrain-worker" "${args[@]}" &
TF_CONFIG="$(tf_config chief 0)" "$bin/coordinator/ctrain-chief" "${args[@]}"
wait
