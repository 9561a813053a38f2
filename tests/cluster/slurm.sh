#!/usr/bin/env bash
# A real two-node SLURM cluster on this one machine, for `ditbench run --executor slurm` and the
# tests marked `cluster`: munge, MariaDB + slurmdbd (sacct), slurmctld, and two slurmd (node1,
# node2) on their own ports. Debian/Ubuntu, as root, no systemd needed.
#
#   sudo tests/cluster/slurm.sh up   [DIR]   # install the packages if missing, start, wait until idle
#   sudo tests/cluster/slurm.sh down [DIR]   # cancel every job, stop each daemon `up` started (by PID)
#   source DIR/env.sh                        # SLURM_CONF and DITBENCH_SLURM for sbatch/sinfo/pytest
#
# DIR (default /tmp/ditbench-slurm) holds the configuration, state, logs, MariaDB's data and the
# PIDs. `up` on a running cluster only checks it. Ports: slurmctld 6817, slurmdbd 6819, MariaDB 6818
# (127.0.0.1 only), slurmd 6821 and 6822. DITBENCH_SLURMD_NICE=N runs the nodes (and so every job)
# at that nice level, for a machine others share. Exit 0: up; 1: it could not start (the reason on stderr).
set -euo pipefail

PKGS=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
NODES=(node1 node2)

log() { echo "[slurm.sh $(date -u +%T)] $*" >&2; }
die() { log "$*"; exit 1; }

# until SECONDS WHAT CMD...: run CMD every half second until it succeeds
until_ok() {
  local limit=$1 what=$2 end
  shift 2
  end=$(( $(date +%s) + limit ))
  while ! "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || { log "$what: not ready after ${limit}s; see $DIR/log/"; return 1; }
    sleep 0.5
  done
}

alive() {  # alive PIDFILE: the process runs (a zombie under an init that does not reap is dead)
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]
}

install_packages() {
  local missing=() p
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "the packages ${missing[*]} are missing and there is no apt-get"
  log "installing ${missing[*]}"
  # Without an init system the packages' postinst scripts must not start the daemons (policy-rc.d 101).
  local ours=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && ours=1
  fi
  local rc=0
  { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq update \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq install -y \
       --no-install-recommends "${missing[@]}"; } >"$DIR/log/apt.log" 2>&1 || rc=$?
  [ "$ours" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || die "apt-get failed (exit $rc); see $DIR/log/apt.log"
}

write_config() {
  local host hw i
  host=$(hostname -s)
  # this machine's CPUs and memory as slurmd sees them; both logical nodes claim all of it
  hw=$(slurmd -C | head -n1 | cut -d' ' -f2-)
  cat > "$DIR/slurm.conf" <<EOF
ClusterName=ditbench
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=6817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job starts again after cred_expire + 1 s (the default is 120 s)
AuthInfo=cred_expire=15
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=5
Waittime=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
EOF
  i=0
  for node in "${NODES[@]}"; do
    i=$((i + 1))
    echo "NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$((6820 + i)) $hw State=UNKNOWN" >> "$DIR/slurm.conf"
    mkdir -p "$DIR/spool/$node"  # each slurmd needs its own spool
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$DIR/slurm.conf"
  # Two stand-in GPUs per node: character devices with NVIDIA's major number and no driver behind
  # them (SLURM wants device files; it only hands out their indices), so that --gpus-per-node jobs
  # are scheduled and their tasks get CUDA_VISIBLE_DEVICES as on a GPU node. Without mknod: no GPUs.
  mkdir -p "$DIR/dev"
  if [ -c "$DIR/dev/gpu1" ] || { mknod "$DIR/dev/gpu0" c 195 0 && mknod "$DIR/dev/gpu1" c 195 1; } 2>/dev/null; then
    echo "GresTypes=gpu" >> "$DIR/slurm.conf"
    sed -i "s/^\(NodeName=node[0-9]* .*\) State=UNKNOWN$/\1 Gres=gpu:2 State=UNKNOWN/" "$DIR/slurm.conf"
    printf 'AutoDetect=off\nName=gpu File=%s/dev/gpu[0-1]\n' "$DIR" > "$DIR/gres.conf"
  else
    log "no stand-in GPUs (mknod failed): the nodes have no gres"
    rm -f "$DIR/gres.conf"
  fi
  # slurmdbd reads slurmdbd.conf next to SLURM_CONF; it refuses one others can read
  cat > "$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=6818
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$DIR/slurmdbd.conf"
  printf 'export SLURM_CONF=%q\nexport DITBENCH_SLURM=%q\n' "$DIR/slurm.conf" "$DIR" > "$DIR/env.sh"
}

# spawn NAME CMD...: start a daemon in the foreground mode, detached, and keep its PID in DIR/pids
spawn() {
  local name=$1
  shift
  nohup "$@" </dev/null >"$DIR/log/$name.out" 2>&1 &
  echo $! > "$DIR/pids/$name"
}

start_munge() {
  if (munge -n | unmunge) >/dev/null 2>&1; then return 0; fi  # a munged already runs: use it
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge  # /run is empty after a reboot or in a container
  runuser -u munge -- /usr/sbin/munged </dev/null >"$DIR/log/munged.out" 2>&1  # it daemonizes
  cp /run/munge/munged.pid "$DIR/pids/munged"
  until_ok 20 munge bash -c 'munge -n | unmunge'
}

start_mariadb() {
  # A database of our own under DIR, on 127.0.0.1:6818: a MariaDB the user already runs is left alone.
  mkdir -p "$DIR/mysql"
  chown mysql:mysql "$DIR/mysql"
  if [ ! -d "$DIR/mysql/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$DIR/mysql" --auth-root-authentication-method=socket \
      >"$DIR/log/mariadb-install.out" 2>&1 || die "mariadb-install-db failed; see $DIR/log/mariadb-install.out"
  fi
  spawn mariadb mariadbd --user=mysql --datadir="$DIR/mysql" --socket="$DIR/mysql/mysqld.sock" \
    --pid-file="$DIR/mysql/mariadb.pid" --bind-address=127.0.0.1 --port=6818 \
    --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --skip-name-resolve
  until_ok 60 mariadb mariadb-admin --socket="$DIR/mysql/mysqld.sock" ping
  mariadb --socket="$DIR/mysql/mysqld.sock" -e "
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

nodes_idle() {
  local states
  states=$(sinfo -h -N -o %t) && [ -n "$states" ] && ! grep -vxq idle <<<"$states"
}

up() {
  [ "$(id -u)" = 0 ] || die "needs root (it installs packages and starts daemons as root); run it with sudo"
  local t0
  t0=$(date +%s)
  mkdir -p "$DIR"/{state,spool,log,pids,run}
  chmod 755 "$DIR"
  export SLURM_CONF=$DIR/slurm.conf
  if alive "$DIR/pids/slurmctld" && scontrol ping 2>/dev/null | grep -q UP && nodes_idle; then
    log "already up ($DIR)"
    echo "$DIR"
    return 0
  fi
  install_packages
  log "packages ready after $(( $(date +%s) - t0 ))s"
  write_config
  # node names resolve to this machine (submitit and torch use them as MASTER_ADDR)
  for node in "${NODES[@]}"; do
    getent hosts "$node" >/dev/null || echo "127.0.0.1 $node" >> /etc/hosts
  done
  start_munge
  alive "$DIR/pids/mariadb" || start_mariadb
  alive "$DIR/pids/slurmdbd" || spawn slurmdbd slurmdbd -D
  until_ok 60 slurmdbd timeout 5 sacctmgr -n -P show cluster
  alive "$DIR/pids/slurmctld" || spawn slurmctld slurmctld -D -i -f "$SLURM_CONF"
  until_ok 60 slurmctld bash -c 'scontrol ping | grep -q UP'
  for node in "${NODES[@]}"; do
    alive "$DIR/pids/slurmd-$node" || spawn "slurmd-$node" nice -n "${DITBENCH_SLURMD_NICE:-0}" slurmd -D -N "$node" -f "$SLURM_CONF"
  done
  until_ok 60 "nodes idle" nodes_idle
  until_ok 30 "cluster in slurmdbd" bash -c 'sacctmgr -n -P list cluster format=cluster | grep -qx ditbench'
  log "up after $(( $(date +%s) - t0 ))s: $(sinfo -h -o '%D nodes %t in partition %P')"
  echo "$DIR"
}

down() {
  export SLURM_CONF=$DIR/slurm.conf
  [ -d "$DIR/pids" ] || { log "nothing to stop in $DIR"; return 0; }
  if alive "$DIR/pids/slurmctld"; then
    scancel --full --user="$(id -un)" >/dev/null 2>&1 || true
  fi
  local name pid stopped=()
  # the nodes first, the database last: each daemon can still report to the next one as it stops
  for name in $(cd "$DIR/pids" && ls -d slurmd-* 2>/dev/null) slurmctld slurmdbd mariadb munged; do
    [ -s "$DIR/pids/$name" ] || continue
    pid=$(cat "$DIR/pids/$name")
    if alive "$DIR/pids/$name"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 60); do alive "$DIR/pids/$name" || break; sleep 0.5; done
      if alive "$DIR/pids/$name"; then kill -9 "$pid" 2>/dev/null || true; fi
      stopped+=("$name=$pid")
    fi
    rm -f "$DIR/pids/$name"
  done
  log "stopped: ${stopped[*]:-nothing was running}"
}

DIR=${2:-${DITBENCH_SLURM:-/tmp/ditbench-slurm}}
case "${1:-}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down [DIR]   (DIR defaults to /tmp/ditbench-slurm)" >&2; exit 2 ;;
esac
