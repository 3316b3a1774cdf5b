#!/usr/bin/env bash
# One task of a parameter-server job, as srun (or mpirun) starts it on every task: task 0 is the
# chief, tasks 1..M the parameter servers, the others workers. The chief listens on the first
# node of the allocation; servers and workers find it there and register.
#   srun scripts/slurm/ps_task.sh [--set k=v ...]           (see parameter_server.sbatch)
#   mpirun -np 4 scripts/slurm/ps_task.sh [--set k=v ...]   (one node, or set CTRAIN_CHIEF_HOST)
# Environment: JOB (default examples/fashion_mnist_mlp.yaml), CTRAIN_NUM_PS (1),
# CTRAIN_CHIEF_HOST (default: the first host of SLURM_JOB_NODELIST, else localhost),
# CTRAIN_CHIEF_PORT (7450), CTRAIN_BIND_HOST (where servers listen; default * = every interface),
# CTRAIN_BUILD (where the binaries are; default build), CTRAIN_KEYS (a `ctrain keygen` dir).
set -euo pipefail
rank="${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-}}}"
ntasks="${SLURM_NTASKS:-${OMPI_COMM_WORLD_SIZE:-}}"
if [[ -z "$rank" || -z "$ntasks" ]]; then
    echo "ps_task.sh: no task rank and count (SLURM_PROCID/SLURM_NTASKS or OMPI_COMM_WORLD_RANK/SIZE): start me with srun or mpirun" >&2
    exit 2
fi
nps="${CTRAIN_NUM_PS:-1}"
nworkers=$((ntasks - 1 - nps))
if ((nworkers < 1)); then
    echo "ps_task.sh: $ntasks tasks leave no worker after the chief and $nps servers (CTRAIN_NUM_PS)" >&2
    exit 2
fi
host="${CTRAIN_CHIEF_HOST:-}"
if [[ -z "$host" && -n "${SLURM_JOB_NODELIST:-}" ]] && command -v scontrol >/dev/null; then
    host="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
fi
host="${host:-localhost}"
chief="$host:${CTRAIN_CHIEF_PORT:-7450}"
bin="${CTRAIN_BUILD:-build}"
bind="${CTRAIN_BIND_HOST:-*}"
args=(--job "${JOB:-examples/fashion_mnist_mlp.yaml}" --set strategy.type=parameter_server)
[[ -n "${CTRAIN_KEYS:-}" ]] && args+=(--keys "$CTRAIN_KEYS")
if ((rank == 0)); then
    exec "$bin/coordinator/ctrain-chief" "${args[@]}" --bind "$bind:${CTRAIN_CHIEF_PORT:-7450}" \
        --num-ps "$nps" --num-workers "$nworkers" "$@"
elif ((rank <= nps)); then
    exec "$bin/ps/ctrain-ps" "${args[@]}" --chief "$chief" --task "ps:$((rank - 1))" \
        --bind "$bind:0" "$@"
else
    exec "$bin/worker/ctrain-worker" "${args[@]}" --chief "$chief" \
        --task "worker:$((rank - 1 - nps))" "$@"
fi
