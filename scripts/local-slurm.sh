#!/usr/bin/env bash
# A real single-node Slurm on this machine, for trying the cluster path (docs/cluster.md) and for
# tests/test_slurm_real.py. Debian's Slurm 22.05 and munge, no cgroups, no accounting database
# (`sacct -c` reads the job completion file). Needs root.
#
#   bash scripts/local-slurm.sh install   # apt-get install slurm-wlm munge (about a minute)
#   bash scripts/local-slurm.sh start     # write slurm.conf for this node, start munged, slurmctld, slurmd
#   bash scripts/local-slurm.sh status    # the daemons' PIDs and `sinfo`
#   bash scripts/local-slurm.sh stop      # stop the daemons this script started, by their PIDs
#
# The node offers this machine's CPUs (`slurmd -C`) and a little less memory than it has, in one
# partition `debug` without a time limit. `start` writes /etc/slurm/slurm.conf only when it does
# not exist or was written by this script.

set -euo pipefail

conf=/etc/slurm/slurm.conf
marker="# written by kpca-claims scripts/local-slurm.sh"
pid_dir=/run/slurm
munge_pid=/run/munge/munged.pid

need_root() {
  [ "$(id -u)" -eq 0 ] || { echo "local-slurm.sh $1: needs root (it starts system daemons)" >&2; exit 4; }
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  local host cpus mem line
  host="$(hostname -s)"
  line="$(slurmd -C | head -n 1)"
  cpus="$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$line")"
  mem="$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$line")"
  mem=$(( mem * 9 / 10 ))  # a little under what slurmd sees, or the node is drained
  if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
    echo "local-slurm.sh: $conf exists and was not written by this script: using it as it is" >&2
    return
  fi
  mkdir -p /etc/slurm
  cat >"$conf" <<EOF
$marker
ClusterName=kpcatest
SlurmctldHost=$host
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$pid_dir/slurmctld.pid
SlurmdPidFile=$pid_dir/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
MinJobAge=3600
KillWait=30
InactiveLimit=0
Waittime=0
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

case "${1:-}" in
  install)
    need_root install
    if command -v slurmctld >/dev/null && command -v munged >/dev/null; then
      echo "local-slurm.sh: Slurm and munge are installed"; exit 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    echo "local-slurm.sh: installed $(slurmctld -V)"
    ;;
  start)
    need_root start
    command -v slurmctld >/dev/null || { echo "local-slurm.sh: Slurm is not installed: run" \
      "\`bash scripts/local-slurm.sh install\` first" >&2; exit 4; }
    write_conf
    mkdir -p /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$pid_dir"
    chown munge:munge /run/munge && chmod 0755 /run/munge
    chown slurm:slurm /var/spool/slurmctld /var/log/slurm "$pid_dir"
    alive "$munge_pid" || su -s /bin/sh munge -c "/usr/sbin/munged --pid-file=$munge_pid"
    alive "$pid_dir/slurmctld.pid" || slurmctld 2>/dev/null
    alive "$pid_dir/slurmd.pid" || slurmd 2>/dev/null
    for _ in $(seq 1 60); do  # until the node takes jobs
      if sinfo -h -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; then
        echo "local-slurm.sh: Slurm is up: $(sinfo -h -o '%P %D node(s) %c CPUs %m MB %t')"
        exit 0
      fi
      sleep 1
    done
    echo "local-slurm.sh: Slurm did not come up in 60 s; see /var/log/slurm/*.log" >&2
    exit 1
    ;;
  status)
    for f in "$munge_pid" "$pid_dir/slurmctld.pid" "$pid_dir/slurmd.pid"; do
      if alive "$f"; then echo "$(basename "$f" .pid): running, PID $(cat "$f")"
      else echo "$(basename "$f" .pid): not running"; fi
    done
    sinfo 2>/dev/null || true
    ;;
  stop)
    need_root stop
    for f in "$pid_dir/slurmd.pid" "$pid_dir/slurmctld.pid" "$munge_pid"; do
      if alive "$f"; then
        pid="$(cat "$f")"
        kill "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        echo "local-slurm.sh: stopped $(basename "$f" .pid) (PID $pid)"
      fi
    done
    ;;
  *)
    echo "usage: local-slurm.sh install | start | status | stop" >&2
    exit 4
    ;;
esac
