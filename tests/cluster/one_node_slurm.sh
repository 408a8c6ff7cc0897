#!/usr/bin/env bash
# A one-node Slurm cluster in a folder of its own, for the tests:
#   one_node_slurm.sh start DIR   writes DIR/slurm.conf, starts munged, slurmctld
#                                 and slurmd there, waits until the node is idle
#   one_node_slurm.sh stop DIR    stops them by the PIDs they wrote in DIR
# Clients use the cluster with SLURM_CONF=DIR/slurm.conf. Nothing outside DIR is
# written, and no system service is touched. Exit 77: the daemons cannot start here.
set -euo pipefail
cmd="${1:?start|stop}"
dir="$(cd "${2:?DIR}" && pwd)"

stop() {
  for name in slurmd slurmctld munged; do
    [ -f "$dir/$name.pid" ] || continue
    pid="$(cat "$dir/$name.pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/$name.pid"
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi

for bin in munged slurmctld slurmd sbatch sinfo; do
  command -v "$bin" >/dev/null || { echo "skip: $bin is not installed (scripts/setup.sh installs Slurm and munge)" >&2; exit 77; }
done

# Two free TCP ports next to each other, above the usual ones.
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
ctld_port="$(free_port)"
slurmd_port="$(free_port)"
host="$(hostname -s)"
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"

# munge: its own key, socket and files; --force because the folder is not root's usual one.
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munge.seed" ||
  { echo "skip: munged does not start here (see $dir/munge/munged.log)" >&2; exit 77; }

cat >"$dir/slurm.conf" <<CONF
ClusterName=sdtest
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF" || { stop; echo "skip: slurmctld does not start here (see $dir/slurmctld.log)" >&2; exit 77; }
slurmd -f "$SLURM_CONF" || { stop; echo "skip: slurmd does not start here (see $dir/slurmd.log)" >&2; exit 77; }
for _ in $(seq 100); do
  state="$(sinfo -h -o %t 2>/dev/null || true)"
  case "$state" in idle*|mix*) exit 0 ;; esac
  sleep 0.2
done
stop
echo "skip: the node never became idle (sinfo said '${state:-nothing}'; see $dir/slurmctld.log)" >&2
exit 77
