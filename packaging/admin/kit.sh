# shellcheck shell=bash
# kit.sh: what stagefs's Slurm prolog and epilog share (sourced by both; not run alone).
#
# They run as root on every node of a job (slurmd's Prolog and Epilog), with SLURM_JOB_ID,
# SLURM_JOB_UID, SLURM_JOB_USER and SLURM_JOB_GID in their environment, and read the site's
# settings from /etc/stagefs/stagefs.conf (STAGEFS_CONF names another file). They never fail a
# job: a problem is logged (stderr, which slurmd logs, and syslog) and the job goes on; a job
# that uses `stagefs run` then fails with the daemon's message, which names the cause.
#
# Nothing here follows a path a user may change: directories a user owns are removed with
# `rm -rf --one-file-system` (which never follows symlinks), and what is done inside a user's
# cache is done as that user (setpriv), bounded by timeout.

PATH=/usr/sbin:/usr/bin:/sbin:/bin
KIT_NAME=${KIT_NAME:-stagefs-kit}

kit_log() {
  echo "$KIT_NAME: job ${SLURM_JOB_ID:-?}: $*" >&2
  logger -t "$KIT_NAME" -- "job ${SLURM_JOB_ID:-?}: $*" 2>/dev/null || true
}

# The settings: the defaults, then the file's KEY=VALUE lines (read, never sourced: a value is
# one word, bare or quoted, as stagefs run reads it). A file that others could change is not
# read at all.
# shellcheck disable=SC2034  # the settings are the prolog's and the epilog's
kit_settings() {
  STAGEFS_MOUNT=/stage/%j
  STAGEFS_CACHE=/nvme/stagefs/%u
  STAGEFS_FUSE_MODE=0666
  STAGEFS_PURGE_AFTER_DAYS=30
  STAGEFS_PURGE_ABOVE=80
  local conf=${STAGEFS_CONF:-/etc/stagefs/stagefs.conf} line key value owner mode
  [[ -e $conf ]] || return 0
  read -r owner mode < <(stat -L -c '%u %a' -- "$conf")
  if [[ $owner != 0 ]] || (((8#$mode & 8#022) != 0)); then
    kit_log "$conf is not root's alone (owner uid $owner, mode $mode): using the defaults"
    return 0
  fi
  while IFS= read -r line || [[ -n $line ]]; do
    line=${line#"${line%%[![:space:]]*}"}
    line=${line%"${line##*[![:space:]]}"}
    [[ -z $line || $line == \#* ]] && continue
    key=${line%%=*} value=${line#*=}
    if [[ $value =~ ^\"([^\"]*)\"$ || $value =~ ^\'([^\']*)\'$ ]]; then value=${BASH_REMATCH[1]}; fi
    case $key in
      STAGEFS_MOUNT | STAGEFS_CACHE | STAGEFS_FUSE_MODE | STAGEFS_PURGE_AFTER_DAYS | STAGEFS_PURGE_ABOVE)
        printf -v "$key" '%s' "$value" ;;
    esac
  done <"$conf"
}

# The job's user: SLURM_JOB_UID, and its name and group (Slurm's, else the user database's).
kit_job_user() {
  JOB=${SLURM_JOB_ID:?} JOB_UID=${SLURM_JOB_UID:?}
  JOB_USER=${SLURM_JOB_USER:-$(getent passwd "$JOB_UID" | cut -d: -f1)}
  JOB_GID=${SLURM_JOB_GID:-$(getent passwd "$JOB_UID" | cut -d: -f4)}
  [[ $JOB =~ ^[0-9_]+$ && $JOB_UID =~ ^[0-9]+$ && -n $JOB_USER && $JOB_USER != */* && $JOB_GID =~ ^[0-9]+$ ]]
}

# kit_expand PATTERN: the pattern with %j, %u, %U and %% replaced (as stagefs run does);
# fails on another code.
kit_expand() {
  local p=$1 out='' c
  while [[ -n $p ]]; do
    c=${p:0:1} p=${p:1}
    if [[ $c != % ]]; then out+=$c; continue; fi
    c=${p:0:1} p=${p:1}
    case $c in
      %) out+=% ;;
      j) out+=$JOB ;;
      u) out+=$JOB_USER ;;
      U) out+=$JOB_UID ;;
      *) return 1 ;;
    esac
  done
  printf '%s\n' "$out"
}

# kit_user_path KEY CODES: KEY's path for this job; its last component must hold one of
# CODES (a regex of %-codes), so that it is the job's or the user's alone.
kit_user_path() {
  local key=$1 codes=$2 pattern=${!1}
  if [[ $pattern != /* || ${pattern##*/} != *%[$codes]* ]]; then
    kit_log "$key=$pattern: must be an absolute path whose last component holds %[$codes]; nothing prepared"
    return 1
  fi
  kit_expand "$pattern" || { kit_log "$key=$pattern: an unknown %-code"; return 1; }
}

# kit_unmount_below DIR: lazily unmounts whatever is mounted at or below DIR, deepest first.
kit_unmount_below() {
  local dir=$1 p
  awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
    while IFS= read -r p; do
      umount -l -- "$p" && kit_log "unmounted $p (left behind)"
    done
}
