#!/usr/bin/env bash
# A parameter-server job started the way TensorFlow's launchers start one: every process gets
# TF_CONFIG naming the cluster and its own task. Here all four run on this machine; on a
# cluster each line runs on its own host with that host's TF_CONFIG.
#   scripts/ps_tf_config_example.sh [--set k=v ...]
#   CTRAIN_BASE_PORT: the chief's port (7450); CTRAIN_PS_PORT: the server's (the chief's + 1)
# When one process fails, the others are stopped and its exit status is the script's.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CTRAIN_BUILD:-build}"
job="${JOB:-examples/fashion_mnist_mlp.yaml}"
port="${CTRAIN_BASE_PORT:-7450}"
ps_port="${CTRAIN_PS_PORT:-$((port + 1))}"
cluster="{\"chief\": [\"127.0.0.1:$port\"], \"ps\": [\"127.0.0.1:$ps_port\"],
          \"worker\": [\"127.0.0.1:0\", \"127.0.0.1:0\"]}"
tf_config() { echo "{\"cluster\": $cluster, \"task\": {\"type\": \"$1\", \"index\": $2}}"; }
args=(--job "$job" --set strategy.type=parameter_server "$@")
TF_CONFIG="$(tf_config ps 0)" "$bin/ps/ctrain-ps" "${args[@]}" &
TF_CONFIG="$(tf_config worker 0)" "$bin/worker/ctrain-worker" "${args[@]}" &
TF_CONFIG="$(tf_config worker 1)" "$bin/worker/ctrain-worker" "${args[@]}" &
TF_CONFIG="$(tf_config chief 0)" "$bin/coordinator/ctrain-chief" "${args[@]}" &
for _ in 1 2 3 4; do
    rc=0
    wait -n || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "ps_tf_config_example: a process exited with status $rc; stopping the others" >&2
        kill $(jobs -p) 2>/dev/null || true
        wait || true
        exit "$rc"
    fi
done
