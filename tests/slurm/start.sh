#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for tests/test_slurm.py: installs Debian's slurm-wlm,
# slurmdbd, munge and mariadb if missing, writes a minimal config (this machine's cores and memory; no GPU
# GRES), starts munged, mariadb, slurmdbd, slurmctld and slurmd, and waits until `sinfo` shows the node
# idle. Needs root. Idempotent: a second run finds the daemons up and returns.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "start.sh needs root (it installs and starts system daemons)" >&2; exit 2; }

# Up means the node is idle and accounting answers (a cluster whose database died looks idle, but
# Snakemake's SLURM executor then never learns that its jobs ended).
if sinfo -h -o %T 2>/dev/null | grep -qx idle && sacct -n -X >/dev/null 2>&1; then echo "slurm: already up"; exit 0; fi

if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server >/dev/null
fi

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /run/mysqld
chown munge:munge /run/munge 2>/dev/null || true
chown mysql:mysql /run/mysqld 2>/dev/null || true

cat > /etc/slurm/slurm.conf <<CONF
ClusterName=lab
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$host
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MinJobAge=3600
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=$host
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
CONF
chmod 600 /etc/slurm/slurmdbd.conf

[ -s /etc/munge/munge.key ] || mungekey --create
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- munged

if ! pgrep -x mariadbd >/dev/null; then
  (mariadbd --user=mysql >/var/log/slurm/mariadb.log 2>&1 &)
  for _ in $(seq 60); do mariadb -e "select 1" >/dev/null 2>&1 && break; sleep 1; done
fi
mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

pgrep -x slurmdbd >/dev/null || slurmdbd
for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 1; done
sacctmgr -i add cluster lab >/dev/null 2>&1 || true
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 90); do
  if sinfo -h -o %T 2>/dev/null | grep -qx idle; then sinfo; exit 0; fi
  sleep 1
done
echo "slurm did not come up; logs:" >&2
tail -n 20 /var/log/slurm/*.log >&2
exit 1
