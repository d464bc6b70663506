#!/usr/bin/env bash
# A claim run as a Slurm job array: each array task runs one shard (pytest claims/ --shard K/N),
# and a job that depends on the whole array merges the shards (python -m report merge).
# docs/cluster.md is the user guide; in short, from any folder:
#
#   export KPCA_RUN_DIR=$PWD/runs/paper KPCA_CACHE=/shared/kpca-cache
#   bash CHECKOUT/scripts/slurm-shards.sh submit --sbatch '--time=04:00:00 --cpus-per-task=8 --mem=32G' \
#       8 --models paper -n 4
#
# Modes:
#   submit [--sbatch 'OPTS'] [--merge-sbatch 'OPTS'] [--replace] N [PYTEST ARGS]
#           submit an array of N shards and the merge job that waits for it (afterany). OPTS are
#           sbatch options: --sbatch for each shard (--time, --partition, --account,
#           --cpus-per-task, --mem, --gres, ...), --merge-sbatch for the merge, which asks for
#           1 CPU, 2G and 15 minutes unless told otherwise. --replace clears an earlier run from
#           KPCA_RUN_DIR (refused otherwise).
#   rerun K[,K...]
#           resubmit shards K of the run in KPCA_RUN_DIR (same options, same run id) and a merge
#           that waits for them.
#   shard [K/N] [PYTEST ARGS]
#           one array task: shard K/N (default: $SLURM_ARRAY_TASK_ID of $KPCA_SHARDS, else of
#           $SLURM_ARRAY_TASK_COUNT) into $KPCA_RUN_DIR/shard-K. Exit 0 when the run finished,
#           whatever the verdicts (exit 1 of pytest, "some claim not supported", is a finding:
#           the verdicts are in results.json); any other pytest exit status is the job's.
#   merge   merge $KPCA_RUN_DIR/shard-*/results.json of this run (run id $KPCA_RUN_ID) into
#           $KPCA_RUN_DIR/merged; shards that left no results.json, or one of another run, are
#           named and left out (a partial merge: exit 2).
#
# Environment: KPCA_RUN_DIR (default runs/slurm, under the folder you submit from), KPCA_PYTHON
# (default: the checkout's .venv/bin/python), KPCA_CACHE (a cache folder every node can reach,
# so the models are downloaded once). Jobs run in the checkout (--chdir): give PYTEST ARGS paths
# as absolute paths. Logs: $KPCA_RUN_DIR/logs/shard-K.JOBID.out and merge.JOBID.out.
#
#SBATCH --job-name=kpca-claims

set -euo pipefail

mode="${1:-}"
[ $# -gt 0 ] && shift

die() { echo "slurm-shards.sh: $*" >&2; exit 4; }

# The checkout: this script's folder's parent when run by hand; inside a job Slurm runs a copy of
# the script from its spool folder, and `submit` passes the checkout as KPCA_ROOT (and --chdir).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -n "${KPCA_ROOT:-}" ]; then root="$KPCA_ROOT"
elif [ -f "$here/../claims/__init__.py" ]; then root="$(cd "$here/.." && pwd)"
else root="$PWD"; fi
script="$root/scripts/slurm-shards.sh"

absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

python_of() {
  if [ -n "${KPCA_PYTHON:-}" ]; then echo "$KPCA_PYTHON"
  elif [ -x "$root/.venv/bin/python" ]; then echo "$root/.venv/bin/python"
  else echo python3; fi
}

run_dir="$(absolute "${KPCA_RUN_DIR:-runs/slurm}")"

# sbatch --parsable prints "jobid" or "jobid;cluster": the job id alone
job_id() { local out; out="$(cat)"; echo "${out%%;*}"; }

submit_merge() {  # $1: the dependency list (afterany:JOB[_K]...), then extra sbatch options
  local dep="$1"; shift
  # shellcheck disable=SC2086
  sbatch --parsable --dependency="$dep" --job-name=kpca-claims-merge --chdir="$root" \
         --output="$run_dir/logs/merge.%j.out" --ntasks=1 --cpus-per-task=1 --mem=2G \
         --time=00:15:00 "$@" "$script" merge | job_id
}

case "$mode" in
  submit)
    shard_opts="" merge_opts="" replace=0
    while [ $# -gt 0 ]; do
      case "$1" in
        --sbatch) shard_opts="${2:?--sbatch needs the sbatch options in quotes}"; shift 2 ;;
        --sbatch=*) shard_opts="${1#--sbatch=}"; shift ;;
        --merge-sbatch) merge_opts="${2:?--merge-sbatch needs the sbatch options in quotes}"; shift 2 ;;
        --merge-sbatch=*) merge_opts="${1#--merge-sbatch=}"; shift ;;
        --replace) replace=1; shift ;;
        *) break ;;
      esac
    done
    n="${1:-}"
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "submit needs the number of shards, e.g. submit 8 --models paper (got '${n}')"
    shift
    [ -f "$root/claims/__init__.py" ] || die "$root is not a kpca-claims checkout (no claims/__init__.py)"
    python="$(python_of)"
    "$python" -c "import torch, pytest" 2>/dev/null || die "$python cannot import torch and pytest:" \
      "install the checkout (bash scripts/setup.sh) or set KPCA_PYTHON to the Python that has them"
    if [ -e "$run_dir/run.env" ] || compgen -G "$run_dir/shard-*" >/dev/null || [ -e "$run_dir/merged" ]; then
      earlier="$(sed -n 's/^KPCA_RUN_ID=//p' "$run_dir/run.env" 2>/dev/null || true)"
      if [ "$replace" -ne 1 ]; then
        die "$run_dir holds an earlier run${earlier:+ ($earlier)}: give another KPCA_RUN_DIR, or add --replace to clear it"
      fi
      rm -rf "$run_dir"/shard-* "$run_dir/merged" "$run_dir/logs" "$run_dir/run.env"
      echo "cleared the earlier run${earlier:+ $earlier} from $run_dir (--replace)"
    fi
    mkdir -p "$run_dir/logs"
    run_id="$(date -u +%Y%m%dT%H%M%SZ)-$$"
    export KPCA_ROOT="$root" KPCA_RUN_DIR="$run_dir" KPCA_SHARDS="$n" KPCA_RUN_ID="$run_id" \
           KPCA_PYTHON="$python"
    [ -n "${KPCA_CACHE:-}" ] && export KPCA_CACHE="$(absolute "$KPCA_CACHE")"
    {  # what `rerun` needs, shell-quoted
      printf 'KPCA_RUN_ID=%s\nKPCA_SHARDS=%s\n' "$run_id" "$n"
      printf 'KPCA_PYTHON=%q\nKPCA_ROOT=%q\n' "$python" "$root"
      [ -n "${KPCA_CACHE:-}" ] && printf 'KPCA_CACHE=%q\n' "$KPCA_CACHE"
      printf 'shard_opts=%q\nmerge_opts=%q\n' "$shard_opts" "$merge_opts"
      printf 'pytest_args=(' ; [ $# -gt 0 ] && printf '%q ' "$@"; printf ')\n'
    } >"$run_dir/run.env"
    # shellcheck disable=SC2086
    jid="$(sbatch --parsable --array="1-$n" --job-name=kpca-claims --chdir="$root" \
           --output="$run_dir/logs/shard-%a.%A.out" --export=ALL $shard_opts \
           "$script" shard "$@" | job_id)"
    # shellcheck disable=SC2086
    mid="$(submit_merge "afterany:$jid" --export=ALL $merge_opts)"
    echo "submitted run $run_id: array job $jid ($n shards) and merge job $mid into $run_dir/merged"
    echo "logs: $run_dir/logs/   state: squeue -j $jid,$mid"
    ;;
  rerun)
    ks="${1:?rerun needs the shard numbers, e.g. rerun 2 or rerun 2,5}"
    [[ "$ks" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "rerun $ks: give shard numbers like 2 or 2,5"
    [ -f "$run_dir/run.env" ] || die "$run_dir holds no submitted run (no run.env): set KPCA_RUN_DIR to the run's folder"
    pytest_args=()
    # shellcheck disable=SC1091
    . "$run_dir/run.env"
    for k in ${ks//,/ }; do
      [ "$k" -le "$KPCA_SHARDS" ] || die "rerun $k: the run in $run_dir has $KPCA_SHARDS shards"
    done
    export KPCA_ROOT KPCA_RUN_DIR="$run_dir" KPCA_SHARDS KPCA_RUN_ID KPCA_PYTHON
    [ -n "${KPCA_CACHE:-}" ] && export KPCA_CACHE
    # shellcheck disable=SC2086,SC2154
    jid="$(sbatch --parsable --array="$ks" --job-name=kpca-claims --chdir="$KPCA_ROOT" \
           --output="$run_dir/logs/shard-%a.%A.out" --export=ALL $shard_opts \
           "$script" shard "${pytest_args[@]}" | job_id)"
    # shellcheck disable=SC2086
    mid="$(submit_merge "afterany:$jid" --export=ALL $merge_opts)"
    echo "resubmitted shard(s) $ks/$KPCA_SHARDS of run $KPCA_RUN_ID as job $jid, merge job $mid into $run_dir/merged"
    ;;
  shard)
    cd "$root"
    [ -f claims/__init__.py ] || die "$root is not a kpca-claims checkout: submit with" \
      "\`bash CHECKOUT/scripts/slurm-shards.sh submit ...\` (or sbatch --chdir=CHECKOUT)"
    if [[ "${1:-}" =~ ^[0-9]+/[0-9]+$ ]]; then  # an explicit K/N wins
      k="${1%/*}" n="${1#*/}"; shift
    else
      k="${SLURM_ARRAY_TASK_ID:?shard runs as a task of a job array (sbatch --array=1-N), or give K/N}"
      # KPCA_SHARDS wins: a rerun of one task (sbatch --array=2) has SLURM_ARRAY_TASK_COUNT 1
      n="${KPCA_SHARDS:-${SLURM_ARRAY_TASK_COUNT:?set KPCA_SHARDS to the number of shards}}"
    fi
    python="$(python_of)"
    mkdir -p "$run_dir/shard-$k"
    rm -f "$run_dir/shard-$k/results.json"  # an earlier attempt's results never stand for this one
    # Slurm's SIGTERM (scancel, --time) reaches pytest, which writes what finished and exits 2;
    # the trap makes this shell wait for that instead of dying first (its job would then end and
    # take pytest down before the write).
    trap 'echo "shard $k/$n: SIGTERM received; pytest is writing what finished" >&2' TERM
    set +e
    "$python" -m pytest claims/ --shard "$k/$n" --out "$run_dir/shard-$k" "$@" &
    child=$!
    while :; do
      wait "$child"; rc=$?
      kill -0 "$child" 2>/dev/null || break  # wait returns early when the trap runs
    done
    set -e
    case "$rc" in
      0) echo "shard $k/$n: finished, every claim supported (results.json)" ;;
      1) echo "shard $k/$n: finished; some claims are not supported (a finding, not a failure:" \
              "the verdicts are in $run_dir/shard-$k/results.json); job exit 0"; rc=0 ;;
      *) echo "shard $k/$n: failed with pytest exit status $rc (2 interrupted, 3 internal error," \
              "4 usage error, 5 no tests, 6 gate regression, 7 machine fault)" >&2 ;;
    esac
    exit "$rc"
    ;;
  merge)
    cd "$root"
    n="${KPCA_SHARDS:?set KPCA_SHARDS to the number of shards}"
    python="$(python_of)"
    if [ -e "$run_dir/merged" ]; then  # an earlier merge never stays looking current
      rm -rf "$run_dir/merged"
      echo "removed the earlier merge $run_dir/merged"
    fi
    inputs=()
    for k in $(seq 1 "$n"); do
      f="$run_dir/shard-$k/results.json"
      if [ ! -f "$f" ]; then
        echo "shard $k/$n left no results.json (its job failed, was cancelled or has not run):" \
             "the merge will be partial" >&2
        continue
      fi
      if [ -n "${KPCA_RUN_ID:-}" ]; then
        theirs="$("$python" -c 'import json, sys
try:
    print(json.load(open(sys.argv[1]))["provenance"].get("run_id") or "none")
except Exception:
    print("unreadable")' "$f")"
        if [ "$theirs" != "$KPCA_RUN_ID" ]; then
          echo "shard $k/$n: $f is from run $theirs, not this run $KPCA_RUN_ID (a stale folder):" \
               "left out, the merge will be partial" >&2
          continue
        fi
      fi
      inputs+=("$f")
    done
    [ ${#inputs[@]} -gt 0 ] || { echo "no shard of this run left a results.json in $run_dir: nothing to merge" >&2; exit 4; }
    set +e
    "$python" -m report merge "${inputs[@]}" -o "$run_dir/merged"
    rc=$?
    set -e
    [ "$rc" -eq 0 ] || { echo "merge refused or failed (exit $rc): nothing written to $run_dir/merged" >&2; exit "$rc"; }
    # a partial merge (its log line above says why) is exit 2, as an interrupted run is
    if "$python" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["complete"] else 2)' \
         "$run_dir/merged/results.json"; then
      echo "merged run complete: $run_dir/merged/report.html"
    else
      echo "merged run partial (complete: false): $run_dir/merged/report.html; rerun the" \
           "missing or cut-short shards with: bash $script rerun K (KPCA_RUN_DIR=$run_dir)" >&2
      exit 2
    fi
    ;;
  *)
    echo "usage: slurm-shards.sh submit [--sbatch 'OPTS'] [--merge-sbatch 'OPTS'] [--replace] N [PYTEST ARGS]" \
         "| rerun K[,K...] | shard [K/N] [PYTEST ARGS] | merge" >&2
    exit 4
    ;;
esac
