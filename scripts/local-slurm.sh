#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for testing `srun dlopt-run`
# (docs/launch.md): munged, slurmctld and slurmd with a configuration in
# DIR (nothing under /etc is changed), every CPU of the machine, tasks
# allowed to overcommit them, PMIx as the MPI plugin (Debian's OpenMPI).
# Needs root and Debian's slurm-wlm and munge packages.
#
#   scripts/local-slurm.sh start DIR   start it; prints the SLURM_CONF to export
#   scripts/local-slurm.sh stop DIR    stop it
set -euo pipefail
cmd=${1:?usage: local-slurm.sh start|stop DIR}
dir=$(mkdir -p "${2:?usage: local-slurm.sh start|stop DIR}" && cd "$2" && pwd)
conf=$dir/slurm.conf
export SLURM_CONF=$conf

stop() {
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munged.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: local-slurm.sh start|stop DIR" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "local-slurm.sh: needs root" >&2; exit 1; }
for tool in munged slurmctld slurmd sinfo srun; do
  command -v "$tool" > /dev/null || { echo "local-slurm.sh: $tool not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
done
stop
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
# Two free TCP ports for slurmctld and slurmd, so that a second local
# cluster (another checkout's test run, a site's own Slurm) does not take
# them ("Address already in use", and the node never becomes idle).
ports=$(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' 2>/dev/null || echo "16817 16818")
read -r ctldPort slurmdPort <<< "$ports"
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
rm -rf "${dir:?}/state/"*
chown munge:munge "$dir/munge"
# munged: its own socket, pid and log under DIR; the package's key.
sudo_munge() { if command -v runuser > /dev/null; then runuser -u munge -- "$@"; else su -s /bin/sh munge -c "$*"; fi; }
sudo_munge munged --force --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed"
cp "$dir/munge/munged.pid" "$dir/munged.pid"
cat > "$conf" <<EOF
ClusterName=dloptlocal
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctldPort
SlurmdPort=$slurmdPort
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
NodeName=$host CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:16
EOF
slurmctld
slurmd
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -q idle; then
    echo "SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.5
done
echo "local-slurm.sh: the node never became idle; logs in $dir" >&2
tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
