#!/usr/bin/env bash
# pipeweave on a SLURM cluster: one torchrun agent per node, c10d rendezvous on the first
# node, one rank per GPU. Submit with:  sbatch examples/slurm_train.sh
#
# tests/checkpoint/test_multinode.py runs the same torchrun command for two "nodes" on one
# machine (loopback), with a rank killed once and --max-restarts resuming from the last
# complete checkpoint. On a cluster the checkpoint folder must be on a filesystem every node
# sees (each rank writes its own shard there).
#SBATCH --job-name=pipeweave
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=04:00:00
set -euo pipefail

NODES=${SLURM_JOB_NUM_NODES:-2}
GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-4}
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
PORT=${PIPEWEAVE_RDZV_PORT:-29500}
SHARED=${PIPEWEAVE_SHARED:-$PWD/runs/slurm-$SLURM_JOB_ID}   # on a shared filesystem
mkdir -p "$SHARED"
# A fresh rendezvous store per restart: torchrun's shared store keeps a dead rank's address
# across restarts on several nodes (pytorch/pytorch issue 135712); pipeweave refuses
# multi-node --max-restarts without this.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1

# 8 ranks: one pipeline of 8 stages here; for depth x width, e.g. --stages 4 --width 2.
srun --kill-on-bad-exit=1 .venv/bin/torchrun \
  --nnodes "$NODES" --nproc-per-node "$GPUS_PER_NODE" \
  --rdzv-backend c10d --rdzv-endpoint "$HEAD:$PORT" --rdzv-id "$SLURM_JOB_ID" \
  --max-restarts 2 \
  -m pipeweave train --device cuda --model gpt-small --schedule 1f1b \
    --stages $((NODES * GPUS_PER_NODE)) --microbatches 16 --steps 1000 \
    --checkpoint-every 100 --checkpoint-dir "$SHARED/checkpoints" --resume auto \
    --output-dir "$SHARED/out"
