#!/usr/bin/env bash
# A claim run as a Slurm job array: each array task runs one shard (pytest claims/ --shard K/N),
# and a job that depends on the whole array merges the shards (python -m report merge).
#
#   cd kpca-claims                      # a checkout with the environment installed
#   export KPCA_RUN_DIR=$PWD/runs/paper KPCA_CACHE=/shared/kpca-cache
#   bash scripts/slurm-shards.sh submit 8 --models paper -n 4
#
# which is the same as
#
#   jid=$(sbatch --parsable --array=1-8 scripts/slurm-shards.sh shard --models paper -n 4)
#   sbatch --dependency=afterany:$jid --export=ALL,KPCA_SHARDS=8 scripts/slurm-shards.sh merge
#
# Modes:
#   submit N [PYTEST ARGS]  submit the array of N shards and the dependent merge job
#   shard [PYTEST ARGS]     one array task: shard $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT
#                           (or $KPCA_SHARDS) into $KPCA_RUN_DIR/shard-K
#   merge                   merge $KPCA_RUN_DIR/shard-*/results.json into $KPCA_RUN_DIR/merged
#                           (shards that left no results.json are named as missing: partial merge)
# Environment: KPCA_RUN_DIR (default runs/slurm), KPCA_PYTHON (default python), KPCA_CACHE (a
# cache folder every node can reach, so the models are downloaded once).
# Give every shard the same PYTEST ARGS: the assignment of models to shards depends on them.
#
#SBATCH --job-name=kpca-claims
#SBATCH --cpus-per-task=8
#SBATCH --mem=32G
#SBATCH --time=04:00:00
#SBATCH --output=kpca-%A_%a.out
# For GPU nodes add:  #SBATCH --gres=gpu:1   and pass --device cuda in PYTEST ARGS.

set -euo pipefail

mode="${1:-}"
[ $# -gt 0 ] && shift
# Inside a job Slurm runs a copy of this script: work from the folder sbatch was called in.
cd "${SLURM_SUBMIT_DIR:-.}"
run_dir="${KPCA_RUN_DIR:-runs/slurm}"
python="${KPCA_PYTHON:-python}"

case "$mode" in
  submit)
    n="${1:?submit needs the number of shards, e.g. submit 8 --models paper}"
    shift
    script="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
    jid="$(sbatch --parsable --array="1-$n" --export="ALL,KPCA_RUN_DIR=$run_dir,KPCA_SHARDS=$n" \
           "$script" shard "$@")"
    jid="${jid%%;*}"  # --parsable prints "jobid" or "jobid;cluster"
    sbatch --dependency="afterany:$jid" --job-name=kpca-claims-merge \
           --export="ALL,KPCA_RUN_DIR=$run_dir,KPCA_SHARDS=$n" "$script" merge
    echo "submitted array job $jid ($n shards) and its merge into $run_dir/merged"
    ;;
  shard)
    k="${SLURM_ARRAY_TASK_ID:?shard runs as a task of a job array (sbatch --array=1-N)}"
    n="${SLURM_ARRAY_TASK_COUNT:-${KPCA_SHARDS:?set KPCA_SHARDS to the array size}}"
    exec "$python" -m pytest claims/ --shard "$k/$n" --out "$run_dir/shard-$k" "$@"
    ;;
  merge)
    n="${KPCA_SHARDS:?set KPCA_SHARDS to the number of shards}"
    inputs=()
    for k in $(seq 1 "$n"); do
      if [ -f "$run_dir/shard-$k/results.json" ]; then
        inputs+=("$run_dir/shard-$k/results.json")
      else
        echo "shard $k/$n left no results.json: the merge will be partial" >&2
      fi
    done
    [ ${#inputs[@]} -gt 0 ] || { echo "no shard left a results.json in $run_dir" >&2; exit 4; }
    exec "$python" -m report merge "${inputs[@]}" -o "$run_dir/merged"
    ;;
  *)
    echo "usage: slurm-shards.sh submit N [PYTEST ARGS] | shard [PYTEST ARGS] | merge" >&2
    exit 4
    ;;
esac
