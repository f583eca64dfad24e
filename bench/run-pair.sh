#!/usr/bin/env bash
# run-pair.sh - starts a 2-rank job as two processes on this machine, optionally each
# in its own network namespace, for the peer harnesses that read their rank from
# GW_RANK / GW_WORLD_SIZE (gloo_allreduce) and for one launcher per "node" (gw-run
# --nnodes 2).  Used by bench/compare-tcp.sh; it does not depend on gw-run, so the
# peers still run while gradwire's launcher is being changed.
#
# usage: run-pair.sh [--netns NS0 NS1] [--env K=V]... [--env0 K=V]... [--env1 K=V]...
#                    [--] COMMAND [ARGS...]
#
# Each process gets GW_RANK=0 or 1, GW_WORLD_SIZE=2, a GW_JOB_TOKEN shared by the
# pair (fresh for each start unless set), the --env settings and its own --env0 or
# --env1; the text %RANK% in COMMAND or ARGS becomes the rank.  With --netns, rank r
# runs under `ip netns exec NSr` (root only; the namespaces must exist).  Rank 0's
# output goes to stdout as it is, rank 1's to stderr with "[1] " in front.  When one
# rank fails the other is stopped (SIGTERM to the process this script started); the
# exit status is the first failing rank's, else 0.  SIGINT / SIGTERM stop both.
set -euo pipefail

die() { echo "run-pair.sh: $*" >&2; exit 2; }

netns=()
env_all=() env0=() env1=()
while (($#)); do
  case $1 in
    --netns) (($# >= 3)) || die "--netns needs two namespace names"; netns=("$2" "$3"); shift 3 ;;
    --env) (($# >= 2)) || die "--env needs K=V"; env_all+=("$2"); shift 2 ;;
    --env0) (($# >= 2)) || die "--env0 needs K=V"; env0+=("$2"); shift 2 ;;
    --env1) (($# >= 2)) || die "--env1 needs K=V"; env1+=("$2"); shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done
(($#)) || die "no command given (--help for usage)"
for kv in "${env_all[@]}" "${env0[@]}" "${env1[@]}"; do
  [[ $kv == [A-Za-z_]*=* ]] || die "bad environment setting '$kv' (want NAME=VALUE)"
done

token=${GW_JOB_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}

pids=()
# shellcheck disable=SC2317  # called from the traps
stop_all() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
}
trap 'stop_all; wait; exit 130' INT
trap 'stop_all; wait; exit 143' TERM

for r in 0 1; do
  args=("${@//%RANK%/$r}")
  if ((r == 0)); then mine=("${env0[@]}"); else mine=("${env1[@]}"); fi
  launch=(env "GW_RANK=$r" GW_WORLD_SIZE=2 "GW_JOB_TOKEN=$token" "${env_all[@]}" "${mine[@]}" "${args[@]}")
  ((${#netns[@]} == 0)) || launch=(ip netns exec "${netns[r]}" "${launch[@]}")
  if ((r == 0)); then
    "${launch[@]}" &
  else
    "${launch[@]}" > >(sed -u 's/^/[1] /' >&2) 2>&1 &
  fi
  pids+=($!)
done

# The first rank to end decides: a failure stops the other one at once, so a rank
# left waiting for a dead peer does not hold the job until its timeout.
status=0
left=("${pids[@]}")
while ((${#left[@]})); do
  rc=0 done_pid=
  wait -n -p done_pid "${left[@]}" || rc=$?
  [[ -n $done_pid ]] || break # none of them is left to wait for
  rest=()
  for p in "${left[@]}"; do [[ $p == "$done_pid" ]] || rest+=("$p"); done
  left=("${rest[@]}")
  if ((rc != 0 && status == 0)); then
    status=$rc
    for p in "${left[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  fi
done
wait || true
exit "$status"
