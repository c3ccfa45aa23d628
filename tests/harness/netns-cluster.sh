#!/usr/bin/env bash
# netns-cluster.sh - a simulated N-node cluster on one machine, each node with its own network,
# UTS and mount namespace, for stagefs tests that need real links to cut or slow down.
#
# Node k (1..N) is three persistent namespaces (no long-running holder process):
#   net    /run/netns/<P>-n<k>   "eth0" 10.77.0.k/24, a veth whose peer "v<k>" sits on a bridge
#   uts    $ROOT/ns/node<k>.uts  hostname node<k>
#   mount  $ROOT/ns/node<k>.mnt  private propagation; inside the node:
#            /sys                  sysfs of the node's netns
#            /dev/shm              fresh tmpfs
#            /tmp                  bind of $ROOT/nodes/node<k>/tmp
#            /etc/hosts            127.0.0.1 localhost + 10.77.0.k node<k> for every node
#            $ROOT/view/nvme       bind of $ROOT/nodes/node<k>/nvme   (the node-local disk)
#            $ROOT/view/stage      bind of $ROOT/nodes/node<k>/stage  (a mount point: a FUSE
#                                  mount made there in node k is seen only in node k)
#          FUSE mounts copied in from the host at creation are detached (in the node only), so
#          a node never keeps a stranger's FUSE superblock alive.
# The network is entirely inside namespaces this script creates: the bridge "br0" lives in a
# switch namespace <P>-sw, and mpirun runs in a launcher namespace <P>-l (eth0 10.77.0.254).
# No address, route or interface is added to the host's network namespace, and no namespace
# has a default route: traffic can only go between the simulated nodes and the launcher.
# Everything else (/, /usr, /work, $ROOT/shared, ...) is shared by all nodes.
#
# mpirun runs in the launcher netns (host mount namespace); this script is Open MPI's
# plm_rsh_agent: it starts each orted inside its node's namespaces. One rank per node.
#
# Usage (root):
#   netns-cluster.sh up N                 create N nodes (a healthy cluster of N: no-op; anything
#                                         else: torn down first). Node dirs start empty.
#   netns-cluster.sh down                 remove everything this script made (processes in the
#                                         nodes, FUSE mounts, namespaces, links); always safe
#   netns-cluster.sh status               exit 0 up and healthy, 1 degraded, 3 down
#   netns-cluster.sh exec K CMD...        run CMD inside node K (cwd kept)
#   netns-cluster.sh mpirun [OPTS] PROG ARGS...   one rank per node (exec: signals reach mpirun)
#   netns-cluster.sh shape K RATE|off     tc tbf on node K's link, both directions (e.g. 20mbit)
#   netns-cluster.sh linkdown K | linkup K   cut / restore node K's link (switch side)
#   netns-cluster.sh pids K               processes living in node K (mount or net namespace)
#   netns-cluster.sh mounts K             node K's mounts under $ROOT/view (TARGET FSTYPE)
#   netns-cluster.sh env                  print ROOT, paths and names as shell assignments
#   netns-cluster.sh run N -- CMD...      up N, CMD (with env exported), always down
#
# Environment:
#   NETNS_SIM_ROOT          state root (default /var/tmp/stagefs-netns; no spaces). Namespace
#                           names derive from it, so several roots can coexist.
#   NETNS_SIM_NET           first three octets of the private /24 (default 10.77.0)
#   NETNS_SIM_STOP_TIMEOUT  seconds processes get after SIGTERM on down (default 15)
set -euo pipefail

PROG=netns-cluster
SELF=$(readlink -f "$0")
ROOT=${NETNS_SIM_ROOT:-/var/tmp/stagefs-netns}
ROOT=${ROOT%/}
NET=${NETNS_SIM_NET:-10.77.0}
STOP_TIMEOUT=${NETNS_SIM_STOP_TIMEOUT:-15}
RUN=$ROOT/ns
VIEW_NVME=$ROOT/view/nvme
VIEW_STAGE=$ROOT/view/stage
SHARED=$ROOT/shared
MAX_NODES=32
# namespace names: a short hash of ROOT keeps two roots apart (names are host-global)
P=sfn$(printf '%s' "$ROOT" | md5sum | cut -c1-6)
SW=$P-sw
LNS=$P-l

log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$SELF" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; }

[[ $ROOT == /* && $ROOT != *[[:space:]]* && $ROOT != / ]] || die "NETNS_SIM_ROOT must be an absolute path without spaces"
[[ $NET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "NETNS_SIM_NET must look like 10.77.0"

# wait_until TIMEOUT_S DESCRIPTION CMD... : poll CMD (backing off 0.05 s .. 0.5 s)
wait_until() {
  local timeout=$1 desc=$2; shift 2
  local deadline=$((SECONDS + timeout)) delay=0.05
  until "$@"; do
    if ((SECONDS >= deadline)); then log "timed out after ${timeout}s waiting for: $desc"; return 1; fi
    sleep "$delay"
    case $delay in 0.05) delay=0.1 ;; 0.1) delay=0.2 ;; *) delay=0.5 ;; esac
  done
}

alive() {  # PID... : true if any is alive and not a zombie (no forks: they are slow on some VMs)
  local p st
  for p in "$@"; do
    st=
    { read -r st </proc/"$p"/stat; } 2>/dev/null || continue
    st=${st##*) }
    [[ ${st%% *} != [ZX] ]] && return 0
  done
  return 1
}
none_alive() { ! alive "$@"; }

# stop_pids TIMEOUT PID... : SIGTERM, wait, SIGKILL. Prints "killed" on stdout if SIGKILL was needed.
stop_pids() {
  local timeout=$1; shift
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  if ! wait_until "$timeout" "pids $* to exit after SIGTERM" none_alive "$@"; then
    log "SIGKILL to $*"
    kill -KILL "$@" 2>/dev/null || true
    wait_until 5 "pids $* to exit after SIGKILL" none_alive "$@" || return 1
  fi
}

nnodes() { local n; n=$(cat "$ROOT/nnodes" 2>/dev/null || true); [[ $n =~ ^[0-9]+$ ]] && echo "$n" || echo 0; }
check_node() { [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= $(nnodes))) || die "no node '$1' (cluster has $(nnodes) nodes)"; }
nsargs() { echo "--net=/run/netns/$P-n$1" "--uts=$RUN/node$1.uts" "--mount=$RUN/node$1.mnt"; }

take_lock() {
  mkdir -p "$ROOT"
  exec 9>"$ROOT/lock"
  flock -w 120 9 || die "another up/down of $ROOT holds $ROOT/lock for >120s"
}

check_prereqs() {
  [[ $(id -u) == 0 ]] || die "must run as root"
  local b missing=()
  for b in ip tc nsenter unshare mount umount findmnt flock md5sum; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  ((${#missing[@]} == 0)) || die "missing commands: ${missing[*]}"
  ip netns list >/dev/null 2>&1 || die "'ip netns' does not work here"
}

# ---------------------------------------------------------------------------------------
# processes of a node: in its net namespace, or in its mount namespace (while the ns file
# is still bound, so the inode cannot have been recycled)

node_mnt_ino() { [[ -e $RUN/node$1.mnt ]] && mountpoint -q "$RUN/node$1.mnt" 2>/dev/null && stat -L -c %i "$RUN/node$1.mnt" 2>/dev/null; }

node_pids() {
  local k=$1 ino p
  {
    [[ -e /run/netns/$P-n$k ]] && ip netns pids "$P-n$k" 2>/dev/null
    if ino=$(node_mnt_ino "$k"); then
      find /proc/[0-9]*/ns/mnt -maxdepth 0 -lname "mnt:\\[$ino\\]" 2>/dev/null | cut -d/ -f3
    fi
  } | sort -un | while read -r p; do
    [[ $p == "$$" || $p == "${BASHPID:-}" ]] && continue
    alive "$p" && echo "$p"
  done
  return 0
}

# mounts of node k under $ROOT/view (TARGET FSTYPE), read from inside the node
node_mounts() {
  [[ -e $RUN/node$1.mnt ]] || return 0
  nsenter --mount="$RUN/node$1.mnt" findmnt -rn -o TARGET,FSTYPE 2>/dev/null | awk -v v="$ROOT/view/" 'index($1, v) == 1' || true
}

# ---------------------------------------------------------------------------------------
# up / down

healthy() {
  local n=$1 k
  [[ $(nnodes) == "$n" ]] || return 1
  [[ -e /run/netns/$SW && -e /run/netns/$LNS ]] || return 1
  ip -n "$LNS" -br link show eth0 2>/dev/null | grep -q UP || return 1
  for ((k = 1; k <= n; k++)); do
    [[ -e /run/netns/$P-n$k ]] || return 1
    # shellcheck disable=SC2046
    nsenter $(nsargs "$k") true 2>/dev/null || return 1
    ip -n "$SW" -br link show "v$k" 2>/dev/null | grep -q UP || return 1
  done
}

setup_node() {
  local k=$1 n=$2 d=$ROOT/nodes/node$1
  mkdir -p "$d"/{nvme,stage,tmp}
  chmod 1777 "$d/tmp"
  ip netns add "$P-n$k"
  ip -n "$SW" link add "v$k" type veth peer name eth0 netns "$P-n$k"
  ip -n "$SW" link set "v$k" master br0 up
  ip -n "$P-n$k" addr add "$NET.$k/24" dev eth0
  ip -n "$P-n$k" link set eth0 up
  ip -n "$P-n$k" link set lo up
  touch "$RUN/node$k.uts" "$RUN/node$k.mnt"
  # nsenter (not "ip netns exec", which makes a throw-away mount namespace) keeps unshare's
  # parent in the host mount namespace, so the persistence binds land in $RUN.
  # shellcheck disable=SC2016  # expanded by the inner sh
  nsenter --net="/run/netns/$P-n$k" unshare --uts="$RUN/node$k.uts" --mount="$RUN/node$k.mnt" \
    --propagation private -- /bin/sh -ec '
      k=$1 d=$2 root=$3
      hostname "node$k"
      # detach FUSE mounts copied from the host (in this namespace only)
      findmnt -rn -o TARGET,FSTYPE | awk '\''$2 ~ /^fuse/ {print $1}'\'' | sort -r | while read -r t; do
        umount -l "$(printf "%b" "$t")" 2>/dev/null || true
      done
      umount -l "$root/ns" 2>/dev/null || true   # namespace files of the other nodes: no cross references
      mount -t sysfs sysfs /sys
      mount -t tmpfs -o mode=1777 tmpfs /dev/shm
      mount --bind "$d/tmp" /tmp
      mount --bind "$root/hosts" /etc/hosts
      mount --bind "$d/nvme" "$root/view/nvme"
      mount --bind "$d/stage" "$root/view/stage"
    ' sh "$k" "$d" "$ROOT"
}

up_locked() {
  local n=$1 k
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_NODES)) || die "node count must be 1..$MAX_NODES, got '$n'"
  if healthy "$n"; then log "already up with $n nodes ($ROOT)"; return 0; fi
  if [[ -e $ROOT/nnodes ]] || compgen -G "/run/netns/$P-*" >/dev/null || mountpoint -q "$RUN" 2>/dev/null; then
    log "tearing down a previous or partial cluster"
    teardown || die "could not remove the previous cluster (see above)"
  fi
  # from here on, any failure removes what was made
  trap 'rc=$?; trap - EXIT; if ((rc)); then log "up failed; cleaning up"; teardown || true; fi; exit $rc' EXIT
  mkdir -p "$RUN" "$VIEW_NVME" "$VIEW_STAGE" "$SHARED" "$ROOT/nodes"
  chmod 1777 "$SHARED"
  rm -rf --one-file-system "$ROOT"/nodes/node*
  # unshare --mount=FILE needs FILE on a private mount (unshare(1))
  mount --bind "$RUN" "$RUN"
  mount --make-private "$RUN"
  { echo "127.0.0.1 localhost"; for ((k = 1; k <= n; k++)); do echo "$NET.$k node$k"; done; } >"$ROOT/hosts"
  : >"$ROOT/hostfile"
  for ((k = 1; k <= n; k++)); do echo "node$k slots=1" >>"$ROOT/hostfile"; done
  echo "$n" >"$ROOT/nnodes"   # written first: teardown uses it
  ip netns add "$SW"
  ip -n "$SW" link add br0 type bridge
  ip -n "$SW" link set br0 up
  ip -n "$SW" link set lo up
  ip netns add "$LNS"
  ip -n "$SW" link add v0 type veth peer name eth0 netns "$LNS"
  ip -n "$SW" link set v0 master br0 up
  ip -n "$LNS" addr add "$NET.254/24" dev eth0
  ip -n "$LNS" link set eth0 up
  ip -n "$LNS" link set lo up
  for ((k = 1; k <= n; k++)); do setup_node "$k" "$n"; done
  # links are up when every node answers (no fixed sleep: poll the bridge ports' state)
  for ((k = 1; k <= n; k++)); do
    wait_until 20 "node$k eth0 up" sh -c "ip -n $P-n$k -br link show eth0 | grep -q ' UP '"
  done
  trap - EXIT
  log "up: $n nodes under $ROOT (netns $P-n1..$P-n$n, switch $SW, launcher $LNS)"
}

# remove everything; safe on a partial or absent cluster. Returns 1 if something remains.
teardown() {
  local rc=0 k n pids t
  n=$(nnodes)
  # the node count may be lost: also find node namespaces by name
  for t in /run/netns/"$P"-n*; do [[ -e $t ]] && k=${t##*-n} && [[ $k =~ ^[0-9]+$ ]] && ((k > n)) && n=$k; done
  for t in "$RUN"/node*.mnt; do [[ -e $t ]] && k=${t##*/node} && k=${k%.mnt} && [[ $k =~ ^[0-9]+$ ]] && ((k > n)) && n=$k; done
  # 1. the launcher first (mpirun: SIGTERM lets it end its job in order; it may wait forever
  #    for a node that is cut off, hence the short grace), then whatever still runs in the
  #    nodes (FUSE daemons, orted, readers), TERM then KILL, all nodes at once
  if [[ -e /run/netns/$LNS ]]; then
    pids=(); mapfile -t pids < <(ip netns pids "$LNS" 2>/dev/null)
    if ((${#pids[@]})); then
      log "stopping ${#pids[@]} process(es) in the launcher: ${pids[*]}"
      stop_pids 5 "${pids[@]}" || rc=1
    fi
  fi
  pids=()
  for ((k = 1; k <= n; k++)); do mapfile -t -O "${#pids[@]}" pids < <(node_pids "$k"); done
  if ((${#pids[@]})); then
    log "stopping ${#pids[@]} process(es) left in the nodes: ${pids[*]}"
    stop_pids "$STOP_TIMEOUT" "${pids[@]}" || rc=1
  fi
  # 2. per node: FUSE mounts, then the persistent namespaces
  for ((k = 1; k <= n; k++)); do
    if [[ -e $RUN/node$k.mnt ]] && mountpoint -q "$RUN/node$k.mnt" 2>/dev/null; then
      while read -r t _; do
        [[ -n $t ]] || continue
        log "node$k: lazy-unmounting $t"
        nsenter --mount="$RUN/node$k.mnt" umount -l "$(printf '%b' "$t")" 2>/dev/null || true
      done < <(nsenter --mount="$RUN/node$k.mnt" findmnt -rn -o TARGET,FSTYPE 2>/dev/null | awk '$2 ~ /^fuse/' | sort -r)
    fi
    umount "$RUN/node$k.mnt" 2>/dev/null || true
    umount "$RUN/node$k.uts" 2>/dev/null || true
    rm -f "$RUN/node$k.mnt" "$RUN/node$k.uts" 2>/dev/null || true
    # explicit link delete: orphaned TCP sockets can keep a deleted netns (and its veth) alive
    [[ -e /run/netns/$SW ]] && ip -n "$SW" link del "v$k" 2>/dev/null || true
    [[ -e /run/netns/$P-n$k ]] && { ip netns del "$P-n$k" || rc=1; }
  done
  if [[ -e /run/netns/$LNS ]]; then
    ip -n "$SW" link del v0 2>/dev/null || true
    ip netns del "$LNS" || rc=1
  fi
  [[ -e /run/netns/$SW ]] && { ip netns del "$SW" || rc=1; }
  mountpoint -q "$RUN" 2>/dev/null && { umount "$RUN" || umount -l "$RUN" || rc=1; }
  rm -f "$ROOT/nnodes"
  # 3. verify
  if compgen -G "/run/netns/$P-*" >/dev/null; then log "left over: $(echo /run/netns/"$P"-*)"; rc=1; fi
  if findmnt -rn -o TARGET | grep -qF "$ROOT/"; then
    log "left over mounts on the host:"; findmnt -rn -o TARGET | grep -F "$ROOT/" >&2; rc=1
  fi
  return "$rc"
}

do_up() { check_prereqs; take_lock; up_locked "$1"; }

do_down() {
  [[ $(id -u) == 0 ]] || die "must run as root"
  [[ -d $ROOT ]] || { log "down: nothing to do"; return 0; }
  take_lock
  if teardown; then log "down: removed"; else die "down: something remains (see above)"; fi
}

do_status() {
  local n k
  n=$(nnodes)
  ((n)) || { echo "state: down ($ROOT)"; return 3; }
  echo "root: $ROOT  nodes: $n  netns: $P-n1..$P-n$n"
  for ((k = 1; k <= n; k++)); do
    printf 'node%d: link %s, qdisc %s, processes %s\n' "$k" \
      "$(ip -n "$SW" -br link show "v$k" 2>/dev/null | awk '{print $2}')" \
      "$(tc -n "$SW" qdisc show dev "v$k" 2>/dev/null | awk 'NR==1{print $2}')" \
      "$(node_pids "$k" | wc -l)"
  done
  if healthy "$n"; then echo "state: up"; return 0; fi
  echo "state: degraded"; return 1
}

# Open MPI calls "<agent> <host> <orted command ...>" like ssh: run the command inside that node
do_rsh() {
  local host=$1; shift
  while [[ $host == -* ]]; do host=$1; shift; done   # ssh-style options, if any
  local k=${host#node}
  [[ $k =~ ^[0-9]+$ ]] || die "rsh: unknown host '$host'"
  # shellcheck disable=SC2046
  exec nsenter $(nsargs "$k") -- /bin/sh -c "$*"
}

do_mpirun() {
  local n; n=$(nnodes)
  ((n)) || die "cluster is down"
  export NETNS_SIM_ROOT=$ROOT   # the rsh agent (a child of mpirun) finds this cluster by it
  # mpirun: launcher netns, host mount namespace (nsfs binds of mount namespaces are not copied
  # into new mount namespaces, so the agent's nsenter --mount would fail inside one).
  exec nsenter --net="/run/netns/$LNS" -- mpirun --allow-run-as-root --oversubscribe \
    -np "$n" --hostfile "$ROOT/hostfile" --map-by node \
    --mca plm_rsh_agent "$SELF rsh" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$NET.0/24" \
    --mca pml ob1 --mca btl tcp,vader,self --mca btl_tcp_if_include "$NET.0/24" \
    -x NETNS_SIM_ROOT "$@"
}

do_shape() {
  local k=$1 rate=$2
  check_node "$k"
  tc -n "$SW" qdisc del dev "v$k" root 2>/dev/null || true
  tc -n "$P-n$k" qdisc del dev eth0 root 2>/dev/null || true
  if [[ $rate != off ]]; then
    tc -n "$SW" qdisc add dev "v$k" root tbf rate "$rate" burst 1mb latency 100ms     # -> node k
    tc -n "$P-n$k" qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 100ms   # node k ->
  fi
}

do_env() {
  cat <<EOF
NETNS_SIM_ROOT=$ROOT
NETNS_SIM_NODES=$(nnodes)
NETNS_SIM_NVME=$VIEW_NVME
NETNS_SIM_STAGE=$VIEW_STAGE
NETNS_SIM_SHARED=$SHARED
NETNS_SIM_NODEDIR=$ROOT/nodes/node
NETNS_SIM_PREFIX=$P
EOF
}

do_run() {
  local n=$1; shift
  [[ ${1:-} == -- ]] && shift
  (($#)) || die "usage: run N -- CMD..."
  do_up "$n"
  exec 9>&-
  trap 'rc=$?; trap - EXIT; do_down || true; exit $rc' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  set -a; eval "$(do_env)"; set +a
  local rc=0
  "$@" || rc=$?
  exit "$rc"
}

cmd=${1:-}
(($#)) && shift
case $cmd in
  up) do_up "${1:?usage: up N}" ;;
  down) do_down ;;
  status) do_status ;;
  exec) k=${1:?usage: exec K CMD...}; shift; check_node "$k"
        # shellcheck disable=SC2046
        exec nsenter $(nsargs "$k") --wd="$PWD" -- "$@" ;;
  rsh) do_rsh "$@" ;;
  mpirun) do_mpirun "$@" ;;
  shape) do_shape "${1:?usage: shape K RATE|off}" "${2:?usage: shape K RATE|off}" ;;
  linkdown) check_node "${1:?}"; ip -n "$SW" link set "v$1" down ;;
  linkup) check_node "${1:?}"; ip -n "$SW" link set "v$1" up ;;
  pids) check_node "${1:?}"; node_pids "$1" ;;
  mounts) check_node "${1:?}"; node_mounts "$1" ;;
  env) do_env ;;
  run) do_run "$@" ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
