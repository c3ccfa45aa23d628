#!/usr/bin/env bash
# simslurm.sh - a simulated N-node Slurm cluster on one machine, for stagefs tests.
#
# One slurmctld plus one slurmd per simulated node n1..nN. Each slurmd runs in its own
# mount + UTS namespace, so every job step on node nX sees:
#   hostname  nX
#   /tmp      private  (bind of $SIMSLURM_ROOT/nodes/nX/tmp)
#   /nvme     private  (bind of $SIMSLURM_ROOT/nodes/nX/nvme)   - the "node-local disk"
#   /stage    private  (bind of $SIMSLURM_ROOT/nodes/nX/stage)  - FUSE mount point; mounts
#                      made there by a job stay inside that node's namespace
#   /dev/shm  private  (fresh tmpfs)
#   /etc/hosts         host's file plus "127.0.0.1 n1 ... nN"
#   /dev/fuse          private  (a device node of the node's own, mode 0600 until the
#                      prolog sets it: the prolog's chmod never reaches the machine's)
# Everything else (/, /usr, /var/tmp, /work, ...) is shared, so programs and input data
# that every node must see belong OUTSIDE /tmp, /nvme and /stage, e.g. /work/main/build or
# $SIMSLURM_ROOT/shared (created by `up`, world-writable, visible on all nodes).
#
# The cluster runs stagefs's admin kit as a site would (packaging/admin/): slurmd's Prolog
# and Epilog are its slurm-prolog and slurm-epilog, reading $SIMSLURM_ROOT/etc/stagefs.conf
# (STAGEFS_CONF, exported by `env`): each job gets /stage/JOBID and each user
# /nvme/stagefs/USER on every node, the user's alone; /dev/fuse is made 0666; the epilog
# unmounts what a job left and removes /stage/JOBID. The purge by fullness is off (the
# nodes' /nvme share this machine's disk, whatever else fills it).
# Jobs run as ordinary users, as on a real cluster: `up` creates the users of
# SIMSLURM_USERS (default "stagefs-u1 stagefs-u2") where missing (`down` removes those it
# created), each with a home in $SIMSLURM_ROOT/home/USER; `as USER -- CMD` runs CMD (sbatch,
# srun, scancel...) as that user. Slurm's daemons stay root.
#
# Usage (root; Debian 12 packages slurm-wlm munge libpmix-dev, see `deps`):
#   simslurm.sh up [N]            start (or keep, if already healthy with N nodes); default N=4
#   simslurm.sh down              stop everything this harness started; always safe to call
#   simslurm.sh status            print state; exit 0 = up and healthy, 1 = degraded, 3 = down
#   simslurm.sh env               print `export ...` lines for srun/sinfo + MPI (use with eval)
#   simslurm.sh deps              apt-get install what is missing of: slurm-wlm munge
#                                 libpmix-dev iproute2 util-linux squashfs-tools
#   simslurm.sh run N -- CMD...   up N, run CMD with that env, always down; exits with CMD's code
#   simslurm.sh as USER -- CMD... CMD as USER (one of SIMSLURM_USERS): uid, gid and groups
#                                 the user's, HOME, USER and LOGNAME set, the rest of the
#                                 environment kept (sbatch hands it on to the job)
#
# Environment:
#   SIMSLURM_ROOT           state root (default /var/tmp/stagefs-simslurm). Config, logs,
#                           pid files, spool and per-node dirs all live here; nothing in /run
#                           or /var/spool. /etc/slurm/slurm.conf is only touched if it is
#                           absent (then a symlink to our config is made, removed on down).
#   SIMSLURM_PORT_BASE      slurmctld listens on BASE, slurmd of nX on BASE+X (default 17810)
#   SIMSLURM_READY_TIMEOUT  seconds to wait for all nodes idle (default 60)
#   SIMSLURM_STOP_TIMEOUT   seconds to wait for daemons to exit after SIGTERM (default 20)
#   SIMSLURM_KEEP_MUNGE=1   do not stop munged on down even if this harness started it
#   SIMSLURM_USERS          the users jobs run as (default "stagefs-u1 stagefs-u2")
#
# Note: libpmix-dev is required, not just libpmix2: Slurm's mpi/pmix plugin dlopen()s the
# unversioned libpmix.so that only the -dev package provides.
#
# MPI (verified on Debian 12: Slurm 22.05.8, Open MPI 4.1.4, libpmix2 4.2.2):
#   srun -N4 --ntasks-per-node=1 --mpi=pmix ./prog   (pmix is a symlink to Slurm's pmix_v4
#   plugin; --mpi=pmix_v4 is the same) gives 4 ranks on hosts n1..n4, each with
#   MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) size 1; bcast/allreduce traffic works.
#   No PMIX_MCA_* setting is needed. Environment exported by `env` / `run` (srun forwards
#   the caller's environment to the tasks):
#     OMPI_MCA_btl_tcp_if_include=lo   REQUIRED where the machine has no non-loopback
#                      interface: Open MPI's tcp btl excludes 127.0.0.0/8 by default, and
#                      every simulated node is this host, so without it MPI_Init-time
#                      wire-up fails (MPI_ERR_INTERN in the first collective). It also
#                      keeps all MPI traffic on loopback.
#     OMPI_MCA_pml=ob1, OMPI_MCA_btl=self,vader,tcp   what Debian's
#                      /etc/openmpi/openmpi-mca-params.conf already selects (pml ^ucx);
#                      made explicit so a different site config cannot pick UCX shm
#                      between namespaces (vader correctly declines: 1 rank per node).
#     OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   only mpirun checks these
#                      (direct srun launch as root works without); set for mpirun users.
#   Exit codes: srun exits with the highest task exit code (one rank exiting 9 -> srun 9),
#   MPI_Abort / MPI errors on any rank also give a non-zero srun exit.
set -euo pipefail

PROG=simslurm
ROOT=${SIMSLURM_ROOT:-/var/tmp/stagefs-simslurm}
PORT_BASE=${SIMSLURM_PORT_BASE:-17810}
READY_TIMEOUT=${SIMSLURM_READY_TIMEOUT:-60}
STOP_TIMEOUT=${SIMSLURM_STOP_TIMEOUT:-20}
CONF=$ROOT/etc/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf
MAX_NODES=64
read -r -a USERS <<<"${SIMSLURM_USERS:-stagefs-u1 stagefs-u2}"
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../packaging/admin" && pwd)

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------------------------------
# small helpers

# wait_until TIMEOUT_S DESCRIPTION CMD... : poll CMD with backoff (0.1s doubling to 1s)
# until it succeeds; return 1 after TIMEOUT_S seconds.
wait_until() {
  local timeout=$1 desc=$2; shift 2
  local deadline=$((SECONDS + timeout)) delay=0.1
  while :; do
    if "$@"; then return 0; fi
    if ((SECONDS >= deadline)); then
      log "timed out after ${timeout}s waiting for: $desc"
      return 1
    fi
    sleep "$delay"
    case $delay in 0.1) delay=0.2 ;; 0.2) delay=0.5 ;; *) delay=1 ;; esac
  done
}

# pid_is PID COMM : true if PID is alive and its command name is COMM
pid_is() {
  local pid=$1 comm=$2 c
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  c=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $c == "$comm" ]]
}

read_pid() { if [[ -f $1 ]]; then tr -dc '0-9' <"$1"; fi; }

# stop_pids TIMEOUT PID... : SIGTERM, wait up to TIMEOUT s for exit, then SIGKILL (+2s)
stop_pids() {
  local timeout=$1; shift
  local pids=() p
  for p in "$@"; do [[ -n $p ]] && kill -0 "$p" 2>/dev/null && pids+=("$p"); done
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  if ! wait_until "$timeout" "pids ${pids[*]} to exit" all_dead "${pids[@]}"; then
    log "sending SIGKILL to ${pids[*]}"
    kill -KILL "${pids[@]}" 2>/dev/null || true
    wait_until 2 "pids ${pids[*]} to exit after SIGKILL" all_dead "${pids[@]}" || return 1
  fi
}

all_dead() {
  local p
  for p in "$@"; do
    # a zombie still answers kill -0; treat state Z as dead
    if kill -0 "$p" 2>/dev/null; then
      [[ $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) == Z ]] || return 1
    fi
  done
}

# pids_in_ns NS NVMEDIR: live processes whose mount namespace is NS (e.g.
# "mnt:[4026532176]") and whose mount table shows NVMEDIR bound on /nvme
pids_in_ns() {
  local ns=$1 src=$2 d p
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [[ $p == "$$" || $p == "$BASHPID" ]] && continue
    [[ $(readlink "$d/ns/mnt" 2>/dev/null) == "$ns" ]] || continue
    all_dead "$p" && continue
    grep -qF " $src /nvme " "$d/mountinfo" 2>/dev/null && echo "$p"
  done
  return 0
}

slurm() { SLURM_CONF=$CONF timeout 15 "$@"; }

port_in_use() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# ---------------------------------------------------------------------------------------
# lock: serialize up/down/status of the same root

take_lock() {
  mkdir -p "$ROOT"
  exec 9>"$ROOT/lock"
  flock -w 120 9 || die "another $PROG operation holds $ROOT/lock for >120s"
}
release_lock() { exec 9>&-; }

# ---------------------------------------------------------------------------------------
# prerequisites

check_prereqs() {
  [[ $(id -u) == 0 ]] || die "must run as root (slurmd per namespace needs mount/UTS unshare)"
  local missing=() b
  for b in slurmctld slurmd srun sinfo scontrol munged munge unmunge unshare flock ss timeout setsid; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  ((${#missing[@]} == 0)) ||
    die "missing commands: ${missing[*]} (run: $0 deps)"
  pmix_ok || log "warning: libpmix.so not found: srun --mpi=pmix will fail (run: $0 deps, or apt-get install libpmix-dev)"
}

# Slurm's pmix plugin dlopen()s the unversioned "libpmix.so", which only libpmix-dev ships:
# without it `srun --mpi=pmix` fails although slurm-wlm is installed.
pmix_ok() { [[ -e /usr/lib/x86_64-linux-gnu/libpmix.so ]] || ldconfig -p 2>/dev/null | grep -q 'libpmix\.so '; }

DEPS=(slurm-wlm munge libpmix-dev iproute2 util-linux squashfs-tools)

# install missing Debian packages (idempotent; no-op when all are present)
do_deps() {
  [[ $(id -u) == 0 ]] || die "must run as root"
  local missing=() p
  for p in "${DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then log "deps: all present (${DEPS[*]})"; return 0; fi
  log "deps: installing ${missing[*]}"
  # keep the packages' maintainer scripts from starting system slurmd/slurmctld/munge
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } || rc=$?
  ((made_policy)) && rm -f "$policy"
  ((rc == 0)) || die "apt-get install ${missing[*]} failed"
}

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

ensure_munge() {
  if munge_ok; then return 0; fi
  log "munged not answering; starting it"
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    if command -v mungekey >/dev/null 2>&1; then
      mungekey --create --keyfile=/etc/munge/munge.key
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
  fi
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge/munge.key
  chmod 0755 /run/munge
  chmod 0700 /var/log/munge /var/lib/munge
  chmod 0400 /etc/munge/munge.key
  # a stale socket/pid from a killed munged makes munged refuse to start
  local old
  old=$(read_pid /run/munge/munged.pid)
  if [[ -n $old ]] && ! pid_is "$old" munged; then rm -f /run/munge/munged.pid /run/munge/munge.socket.2*; fi
  runuser -u munge -- /usr/sbin/munged 9>&- ||
    die "munged failed to start (see /var/log/munge/munged.log)"
  wait_until 10 "munged to answer" munge_ok || die "munged started but does not answer"
  read_pid /run/munge/munged.pid >"$ROOT/munged.pid"
}

# ---------------------------------------------------------------------------------------
# configuration

write_conf() {
  local n=$1 host i
  host=$(hostname -s)
  mkdir -p "$ROOT/etc"
  {
    echo "# generated by $PROG for $n nodes; do not edit"
    echo "ClusterName=stagefs-sim"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$PORT_BASE"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$ROOT/ctld/state"
    echo "SlurmctldPidFile=$ROOT/ctld/slurmctld.pid"
    echo "SlurmctldLogFile=$ROOT/ctld/slurmctld.log"
    echo "SlurmdSpoolDir=$ROOT/nodes/%n/spool"
    echo "SlurmdPidFile=$ROOT/nodes/%n/slurmd.pid"
    echo "SlurmdLogFile=$ROOT/nodes/%n/slurmd.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SchedulerType=sched/builtin"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=120"
    echo "InactiveLimit=0"
    echo "KillWait=5"
    echo "MessageTimeout=20"
    echo "TmpFS=/tmp"
    echo "Prolog=$ROOT/etc/prolog"
    echo "Epilog=$ROOT/etc/epilog"
    echo "EpilogSlurmctld=$ROOT/etc/job_ended.sh"
    for ((i = 1; i <= n; i++)); do
      echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT_BASE + i)) CPUs=$(nproc) RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=sim Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } >"$CONF.new"
  mv "$CONF.new" "$CONF"

  # mpi.conf (read from beside slurm.conf): Slurm's pmix plugin runs Open MPI's two start-up
  # fences, the modex (with data) and the closing barrier (without), as a ring and a tree
  # collective by default ("mixed"). With the default, 9 sruns in 200 on a loaded 2-core
  # machine had a rank leave MPI_Init and send to a rank that had not yet registered its PML
  # handlers: that rank died of SIGSEGV inside MPI_Init (core: a NULL tag-0x41 callback called
  # from mca_btl_tcp; "Open MPI failed to TCP connect ... Operation now in progress" on the
  # sender). With both fences as trees: 0 in 320 sruns (Slurm 22.05.8, Open MPI 4.1.4).
  echo "PMIxCollFence=tree" >"$ROOT/etc/mpi.conf.new"
  mv "$ROOT/etc/mpi.conf.new" "$ROOT/etc/mpi.conf"

  # EpilogSlurmctld: the controller runs it when a job has ended. It writes one line, the
  # job's exit code ("exit:signal"), to $ROOT/ended/JOBID: into the FIFO a waiting test blocks
  # on (tests/slurm/checks.sh wait_job), or as a plain file when nobody waits yet. A FIFO
  # whose reader is gone is given up after 10 s, so the job's completion is never held longer.
  rm -rf "$ROOT/ended" # job ids start at 1 again with a new controller state
  mkdir -p "$ROOT/ended"
  cat >"$ROOT/etc/job_ended.sh" <<EOF_EPILOG
#!/bin/sh
timeout 10 sh -c 'echo "\$1" > "\$2"' sh "\${SLURM_JOB_EXIT_CODE2:-unknown}" "$ROOT/ended/\$SLURM_JOB_ID" 2>/dev/null
exit 0
EOF_EPILOG
  chmod 0755 "$ROOT/etc/job_ended.sh"

  # No SPANK plugin (pyxis...): an empty plugstack.conf where Slurm looks for it, beside
  # slurm.conf, so that a plugin configured by hand in an earlier run cannot stay loaded.
  : >"$ROOT/etc/plugstack.conf"

  # stagefs's admin kit, as the site installs it: the settings, and Prolog/Epilog that run
  # the kit's scripts with them (slurmd gives a prolog an environment of its own)
  cat >"$ROOT/etc/stagefs.conf" <<EOF_SITE
# the simulated site (tests/harness/simslurm.sh); see packaging/admin/stagefs.conf
STAGEFS_MOUNT=/stage/%j
STAGEFS_CACHE=/nvme/stagefs/%u
STAGEFS_CACHE_SIZE=50%
STAGEFS_SPARE_CACHES=4
STAGEFS_FUSE_MODE=0666
STAGEFS_PURGE_AFTER_DAYS=30
STAGEFS_PURGE_ABOVE=0
EOF_SITE
  local script
  for script in prolog epilog; do
    printf '#!/bin/sh\nSTAGEFS_CONF=%s exec %s\n' "$ROOT/etc/stagefs.conf" "$KIT/slurm-$script" >"$ROOT/etc/$script"
    chmod 0755 "$ROOT/etc/$script"
  done

  # /etc/hosts seen inside the node namespaces: the host's plus n1..nN
  { cat /etc/hosts; echo "# $PROG nodes"; for ((i = 1; i <= n; i++)); do echo "127.0.0.1 n$i"; done; } >"$ROOT/etc/hosts"

  # make plain `srun` work without SLURM_CONF, but never clobber a real config
  # (absent, or a dangling symlink / one already pointing at us)
  if [[ ! -e $ETC_CONF ]] || [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
    mkdir -p /etc/slurm
    ln -sfn "$CONF" "$ETC_CONF"
    echo "$ETC_CONF" >"$ROOT/etc/linked"
  fi
}

# ---------------------------------------------------------------------------------------
# users: the jobs' owners

ensure_users() {
  local u
  mkdir -p "$ROOT/home"
  chmod 0755 "$ROOT/home"
  for u in "${USERS[@]}"; do
    if ! id -u "$u" >/dev/null 2>&1; then
      useradd -M -U -s /bin/bash -d "$ROOT/home/$u" "$u" || die "useradd $u failed"
      echo "$u" >>"$ROOT/users-created"
    fi
    mkdir -p "$ROOT/home/$u"
    chown "$u:" "$ROOT/home/$u"
    chmod 0700 "$ROOT/home/$u"
  done
}

remove_users() {
  local u
  [[ -f $ROOT/users-created ]] || return 0
  while read -r u; do
    [[ -n $u ]] && userdel "$u" 2>/dev/null
  done <"$ROOT/users-created"
  rm -f "$ROOT/users-created"
}

do_as() {
  local user=$1
  shift
  [[ ${1:-} == -- ]] && shift
  (($#)) || die "as: no command given (usage: as USER -- CMD...)"
  id -u "$user" >/dev/null 2>&1 || die "as: no user $user (up creates ${USERS[*]})"
  export HOME=$ROOT/home/$user USER=$user LOGNAME=$user
  cd "$HOME" 2>/dev/null || cd /
  exec setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups -- "$@"
}

# ---------------------------------------------------------------------------------------
# state inspection

cluster_n() { read_pid "$ROOT/cluster.n"; }

ctld_pid() { read_pid "$ROOT/ctld/pid"; }
node_pid() { read_pid "$ROOT/nodes/$1/pid"; }

daemons_alive() {
  local n=$1 i
  pid_is "$(ctld_pid)" slurmctld || return 1
  for ((i = 1; i <= n; i++)); do pid_is "$(node_pid "n$i")" slurmd || return 1; done
}

# all N nodes registered and idle (or mixed/allocated, i.e. usable)
nodes_ready() {
  local n=$1 out ready
  out=$(slurm sinfo -h -N -p sim -o '%N %T' 2>/dev/null) || return 1
  ready=$(awk '$2 ~ /^(idle|mixed|allocated|completing)$/ {c++} END {print c+0}' <<<"$out")
  [[ $ready -eq $n ]]
}

# starting_or_alive PID COMM: PID is COMM, or still on its way there. A node's recorded pid
# goes setsid -> unshare -> sh -> slurmd by exec; on a loaded machine the first check can
# come before the last exec, and a node caught as "sh" must not count as dead.
starting_or_alive() {
  local c
  [[ $1 =~ ^[0-9]+$ ]] || return 1
  c=$(cat "/proc/$1/comm" 2>/dev/null) || return 1
  [[ $c == "$2" || $c == setsid || $c == unshare || $c == sh ]]
}

# used while waiting: fail fast if a daemon died
ready_or_dead() {
  local n=$1 i
  pid_is "$(ctld_pid)" slurmctld || { DAEMON_DIED=1; return 0; }
  for ((i = 1; i <= n; i++)); do
    starting_or_alive "$(node_pid "n$i")" slurmd || { DAEMON_DIED=1; return 0; }
  done
  nodes_ready "$n"
}

# report which daemons are not running, with the tail of their logs
dump_logs() {
  local n i f pid
  n=$(cluster_n)
  pid=$(ctld_pid)
  if ! pid_is "$pid" slurmctld; then log "slurmctld (pid ${pid:-?}) is not running"; fi
  for ((i = 1; i <= ${n:-0}; i++)); do
    pid=$(node_pid "n$i")
    if ! pid_is "$pid" slurmd; then log "slurmd n$i (pid ${pid:-?}) is not running"; fi
  done
  for f in "$ROOT/ctld/slurmctld.log" "$ROOT/ctld/stdout.log"; do
    [[ -s $f ]] && { echo "----- tail $f" >&2; tail -n 8 "$f" >&2; break; }
  done
  for ((i = 1; i <= ${n:-0}; i++)); do
    for f in "$ROOT/nodes/n$i/slurmd.log" "$ROOT/nodes/n$i/stdout.log"; do
      [[ -s $f ]] && { echo "----- tail $f" >&2; tail -n 8 "$f" >&2; break; }
    done
  done
  return 0  # (a last missing log must not end the caller under set -e before its message)
}

# ---------------------------------------------------------------------------------------
# up / down

start_node() {
  local node=$1 dir=$ROOT/nodes/$1
  rm -rf "$dir"
  mkdir -p "$dir"/{tmp,nvme,stage,spool}
  chmod 1777 "$dir/tmp"
  chmod 0755 "$dir/nvme" "$dir/stage"
  mknod -m 0600 "$dir/fuse" c 10 229
  # unshare execs sh which execs slurmd: $! is slurmd's pid. setsid detaches it from the
  # caller's terminal/process group so ^C in a test cannot leave it half-dead.
  # shellcheck disable=SC2016  # expanded by the inner sh
  setsid unshare --mount --uts --propagation private -- /bin/sh -ec '
    node=$1 dir=$2 conf=$3 hosts=$4
    hostname "$node"
    mount --bind "$dir/tmp" /tmp
    mount --bind "$dir/nvme" /nvme
    mount --bind "$dir/stage" /stage
    mount -t tmpfs -o mode=1777,size=1g tmpfs /dev/shm
    mount --bind "$hosts" /etc/hosts
    if [ -c /dev/fuse ]; then mount --bind "$dir/fuse" /dev/fuse; fi
    exec slurmd -D -N "$node" -f "$conf"
  ' sh "$node" "$dir" "$CONF" "$ROOT/etc/hosts" 9>&- </dev/null >>"$dir/stdout.log" 2>&1 &
  echo $! >"$dir/pid"
}

# (not called in a `||` context, so `set -e` stays in force inside)
do_up() {
  up_locked "$@"
  release_lock
}

up_locked() {
  local n=$1 i
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > MAX_NODES)); then
    die "node count must be 1..$MAX_NODES, got '$n'"
  fi
  check_prereqs
  take_lock

  local cur
  cur=$(cluster_n)
  if [[ $cur == "$n" ]] && daemons_alive "$n" && nodes_ready "$n"; then
    log "already up with $n nodes"
    return 0
  fi
  if [[ -n $cur ]] || [[ -e $ROOT/ctld/pid ]] || compgen -G "$ROOT/nodes/*/pid" >/dev/null; then
    log "tearing down previous/partial cluster (had ${cur:-?} nodes)"
    teardown || die "could not stop the previous cluster (see above); try: $0 down"
  fi

  for ((i = 0; i <= n; i++)); do
    if port_in_use $((PORT_BASE + i)); then
      die "TCP port $((PORT_BASE + i)) is already in use (another Slurm? set SIMSLURM_PORT_BASE)"
    fi
  done

  local t0=$SECONDS
  ensure_munge
  mkdir -p /nvme /stage "$ROOT/shared"
  chmod 1777 "$ROOT/shared"
  ensure_users
  write_conf "$n"
  echo "$n" >"$ROOT/cluster.n"

  rm -rf "$ROOT/ctld" "$ROOT/nodes"
  mkdir -p "$ROOT/ctld/state"
  setsid slurmctld -D -i -f "$CONF" 9>&- </dev/null >>"$ROOT/ctld/stdout.log" 2>&1 &
  echo $! >"$ROOT/ctld/pid"
  local ctld_ok=0
  # (setsid is still "setsid" until it execs slurmctld: a loaded machine showed that state at
  # the first ping, which was taken for a dead slurmctld)
  ctld_ping() {
    starting_or_alive "$(ctld_pid)" slurmctld || return 0
    slurm scontrol ping 2>/dev/null | grep -q UP && ctld_ok=1
  }
  wait_until 30 "slurmctld to answer ping" ctld_ping || true
  if ((ctld_ok == 0)); then
    dump_logs; teardown || true; die "slurmctld did not come up within 30s (logs above, $ROOT/ctld/)"
  fi

  for ((i = 1; i <= n; i++)); do start_node "n$i"; done

  DAEMON_DIED=0
  if ! wait_until "$READY_TIMEOUT" "$n nodes idle in sinfo" ready_or_dead "$n" || ((DAEMON_DIED)); then
    slurm sinfo -N >&2 || true
    dump_logs
    teardown || true
    if ((DAEMON_DIED)); then die "a slurm daemon exited during startup (logs above, $ROOT)"; fi
    die "cluster did not become ready within ${READY_TIMEOUT}s (logs above, $ROOT)"
  fi

  # remember each node's mount namespace so down can find job processes left in it
  for ((i = 1; i <= n; i++)); do
    readlink "/proc/$(node_pid "n$i")/ns/mnt" >"$ROOT/nodes/n$i/mntns"
  done
  log "up: $n nodes ready in $((SECONDS - t0))s (SLURM_CONF=$CONF)"
  slurm sinfo -N >&2 || true
}

# kill everything this harness started. Safe on a partial or absent cluster.
teardown() {
  local rc=0 d node pid ns pids=() nspids

  # 1. cancel jobs while slurmctld still answers (lets slurmstepd clean up normally)
  if pid_is "$(ctld_pid)" slurmctld; then
    slurm scancel --partition=sim --full >/dev/null 2>&1 || true
  fi

  # 2. slurmd daemons
  for d in "$ROOT"/nodes/*/; do
    [[ -d $d ]] || continue
    pid=$(read_pid "$d/pid")
    if pid_is "$pid" slurmd; then
      readlink "/proc/$pid/ns/mnt" >"$d/mntns" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  stop_pids "$STOP_TIMEOUT" "${pids[@]}" || rc=1

  # 3. anything still living in a node namespace (slurmstepd, escaped job tasks, FUSE
  #    daemons). A process counts as ours only if its mount table has this node's /nvme
  #    bind, so a namespace id recycled by the kernel can never hit a stranger.
  for d in "$ROOT"/nodes/*/; do
    [[ -f $d/mntns ]] || continue
    node=$(basename "$d")
    ns=$(cat "$d/mntns")
    [[ $ns == mnt:* ]] || continue
    mapfile -t nspids < <(pids_in_ns "$ns" "$ROOT/nodes/$node/nvme")
    ((${#nspids[@]})) || continue
    log "stopping ${#nspids[@]} leftover process(es) in $node's namespace: ${nspids[*]}"
    stop_pids "$STOP_TIMEOUT" "${nspids[@]}" || rc=1
  done

  # 4. slurmctld
  pid=$(ctld_pid)
  if pid_is "$pid" slurmctld; then stop_pids "$STOP_TIMEOUT" "$pid" || rc=1; fi

  # 5. munged, only if we started it
  pid=$(read_pid "$ROOT/munged.pid")
  if [[ -n $pid && ${SIMSLURM_KEEP_MUNGE:-0} != 1 ]]; then
    if pid_is "$pid" munged; then stop_pids "$STOP_TIMEOUT" "$pid" || rc=1; fi
    rm -f "$ROOT/munged.pid"
  fi

  # 6. host side: nothing is mounted on the host (all binds live in the node namespaces,
  #    which vanish with their last process); just check and drop our /etc symlink.
  if [[ -f $ROOT/etc/linked && -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
    rm -f "$ETC_CONF"
  fi
  rm -f "$ROOT/etc/linked"
  if grep -qF " $ROOT/" /proc/self/mounts; then
    log "warning: mounts under $ROOT on the host:"; grep -F " $ROOT/" /proc/self/mounts >&2
    rc=1
  fi

  remove_users
  rm -f "$ROOT/cluster.n" "$ROOT/ctld/pid" "$ROOT"/nodes/*/pid
  return "$rc"
}

do_down() {
  [[ $(id -u) == 0 ]] || die "must run as root"
  [[ -d $ROOT ]] || { log "down: nothing to do ($ROOT does not exist)"; return 0; }
  take_lock
  local rc=0
  teardown || rc=$?
  release_lock
  if ((rc == 0)); then log "down: stopped"; else die "down: some processes did not exit (see above)"; fi
}

do_status() {
  local n i rc=0 pid
  n=$(cluster_n)
  if [[ -z $n ]]; then
    echo "state: down (root $ROOT)"
    return 3
  fi
  echo "state root: $ROOT  nodes: $n  SLURM_CONF=$CONF"
  pid=$(ctld_pid)
  if pid_is "$pid" slurmctld; then echo "slurmctld: running (pid $pid)"; else echo "slurmctld: NOT running"; rc=1; fi
  for ((i = 1; i <= n; i++)); do
    pid=$(node_pid "n$i")
    if pid_is "$pid" slurmd; then echo "slurmd n$i: running (pid $pid)"; else echo "slurmd n$i: NOT running"; rc=1; fi
  done
  if munge_ok; then echo "munge: ok"; else echo "munge: NOT answering"; rc=1; fi
  if ((rc == 0)); then
    slurm sinfo -N || rc=1
    nodes_ready "$n" || { echo "not all nodes ready"; rc=1; }
  fi
  echo "state: $([[ $rc == 0 ]] && echo up || echo degraded)"
  return "$rc"
}

print_env() {
  cat <<EOF
export SLURM_CONF=$CONF
export SIMSLURM_ROOT=$ROOT
export OMPI_MCA_pml=ob1
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export STAGEFS_CONF=$ROOT/etc/stagefs.conf
EOF
}

do_run() {
  local n=$1; shift
  [[ ${1:-} == -- ]] && shift
  (($#)) || die "run: no command given (usage: run N -- CMD...)"
  # always tear down, whatever happens from here on
  trap 'rc=$?; trap - EXIT; do_down || true; exit "$rc"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  do_up "$n"
  eval "$(print_env)"
  local rc=0
  "$@" || rc=$?
  exit "$rc"
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
    up) do_up "${1:-4}" ;;
    down) do_down ;;
    status) do_status ;;
    env) print_env ;;
    deps) do_deps ;;
    as) (($# >= 2)) || die "usage: as USER -- CMD..."; do_as "$@" ;;
    run) (($# >= 1)) || die "usage: run N -- CMD..."; do_run "$@" ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
