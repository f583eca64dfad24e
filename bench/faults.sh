#!/usr/bin/env bash
# faults.sh - tries each fault of issue 8 on a 4-rank job and records, for every
# surviving rank, the seconds from the fault to the moment its gradwire call
# returned the error, the result code and the message (gw_comm_last_error).
#
# Faults: kill -9 of rank 2 inside a large allreduce (shm, tcp); kill -9 of an idle
# rank 2 while the others wait in an allreduce for it (shm, tcp); rank 2 never
# calling, alive, with GW_TIMEOUT=5 (shm, tcp); gw_comm_abort on rank 0 from a
# second thread while it waits (shm, tcp); mismatched calls at one sequence number,
# rank 1 with twice the count and rank 3 with float64 (shm, tcp); and, as root, a
# vanished machine: 2 "machines" (network + UTS namespaces, 2 ranks each) on a
# bridge, the link of machine 1 cut (its switch port taken off the bridge, no
# carrier change on either side, nobody killed), once during a loop of large
# allreduces and once while every rank waits with nothing in flight; and on
# the same two machines rank 1, machine 0's last, stopped (SIGSTOP) during large
# allreduces with GW_TIMEOUT=5 (rank 2 waits on it across machines, rank 3 on
# rank 2 and rank 0 on rank 3: the line of waits each must see through).
#
# The fault moment is on CLOCK_MONOTONIC, shared by every process of this machine
# and across network namespaces: the faulting rank writes it just before the fault
# (bench/faults_rank.c), or this script takes it with `faults_rank now` just before
# cutting the link.  The ranks are started as plain processes (not under gw-run, whose
# teardown would stop the survivors before they report); each scenario runs under
# `timeout`, so a hung rank shows up as "no report" instead of stalling the script.
#
# usage: BUILD=build bench/faults.sh        (BUILD relative to the repository root or absolute)
# Output: a markdown table on stdout and in bench/results/faults.md; every rank's
# full message and log in bench/results/faults.log.  FAULTS_ONLY="kill-busy abort"
# runs a subset (scenario names as in the table's first column key, see `scenarios`);
# FAULTS_COUNT (float32 elements of the "large" allreduce, default 16M = 64 MiB),
# FAULTS_TRIM (message characters in the table, default 220).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${BUILD:-build}
[[ $build == /* ]] || build=$root/$build
rank_bin=$build/bench/faults_rank
if [[ ! -x $rank_bin ]]; then
  echo "faults.sh: $rank_bin missing; building it (ninja -C $build bench/faults_rank)" >&2
  ninja -C "$build" bench/faults_rank >&2 || { echo "faults.sh: build failed" >&2; exit 1; }
fi
count=${FAULTS_COUNT:-$((16 << 20))}
trim=${FAULTS_TRIM:-220}
nranks=4
results=$here/results
mkdir -p "$results"
work=$(mktemp -d /tmp/gw-faults.XXXXXX)
tag="gwf$$"
namespaces=()
US=$'\x1f'  # field separator of `rows` (messages may hold any printable character)
rows=()   # fault US transport US rank US seconds US code US message, message untrimmed
cleanup() {
  local ns
  for ns in "${namespaces[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log=$work/faults.log
: >"$log"
note() { echo "$*" >&2; echo "$*" >>"$log"; }

# collect NAME FAULT TRANSPORT DIR EXPECT_DEAD: turns DIR's files into table rows.
collect() {
  local name=$1 fault=$2 transport=$3 d=$4 dead=$5
  local tf
  tf=$(cat "$d"/fault.* 2>/dev/null | sort -n | head -n 1 | cut -f1) # the earliest, if several
  {
    echo "=== $name ($fault, $transport)"
    cat "$d"/fault.* 2>/dev/null | sed 's/^/fault: /'
    cat "$d"/rank.* 2>/dev/null | sed 's/^/report: /'
    for r in $(seq 0 $((nranks - 1))); do
      echo "--- rank $r exit ${exit_of[$r]:-?}"
      cat "$d/out.$r" 2>/dev/null
    done
  } >>"$log"
  if [[ -z $tf ]]; then
    rows+=("$fault$US$transport$US-$US-$US-${US}no fault moment recorded (setup failed?): see faults.log")
    return
  fi
  local r
  for r in $(seq 0 $((nranks - 1))); do
    [[ " $dead " == *" $r "* ]] && continue
    local f=$d/rank.$r
    if [[ ! -s $f ]]; then
      local why="exit ${exit_of[$r]:-?}"
      [[ ${exit_of[$r]:-} == 124 || ${exit_of[$r]:-} == 137 ]] && why="still running at the scenario deadline: killed"
      rows+=("$fault$US$transport$US$r$US-$US-${US}no report ($why)")
      continue
    fi
    local t_ret call_s code cname later lname msg
    IFS=$'\t' read -r _ t_ret call_s code cname _ later lname msg <"$f"
    local secs
    secs=$(awk -v a="$t_ret" -v b="$tf" 'BEGIN { printf "%.2f", a - b }')
    local extra=""
    [[ $name == straggler* && $r == "${straggler_rank:-}" ]] && extra=" [the straggler itself, calling late; call took ${call_s%????} s]"
    [[ $name == abort* && $r == "${late_rank:-}" ]] && extra=" [called late; call took ${call_s%????} s]"
    [[ $code != 0 && $later == "$code" ]] || [[ $code == 0 ]] || extra+=" [next call: $lname]"
    rows+=("$fault$US$transport$US$r$US$secs$US$code $cname$US$msg$extra")
  done
}

exit_of=()

# local_job NAME FAULT TRANSPORT DEADLINE DEAD_RANKS ENV...: 4 ranks on this machine.
local_job() {
  local name=$1 fault=$2 transport=$3 deadline=$4 dead=$5
  shift 5
  local d=$work/$name
  mkdir -p "$d"
  local port token
  if ! port=$("$rank_bin" port); then
    note "faults.sh: no free port"
    rows+=("$fault$US$transport$US-$US-$US-${US}setup failed: no free port")
    return
  fi
  token="faults-$$-$RANDOM$RANDOM"
  local pids=() r
  exit_of=()
  for r in $(seq 0 $((nranks - 1))); do
    timeout -k 2 "$deadline" env GW_RANK="$r" GW_WORLD_SIZE=$nranks GW_LOCAL_RANK="$r" \
      GW_MASTER_ADDR=127.0.0.1 GW_MASTER_PORT="$port" GW_JOB_TOKEN="$token" \
      GW_TRANSPORT="$transport" FAULTS_DIR="$d" FAULTS_COUNT="$count" "$@" \
      "$rank_bin" run >"$d/out.$r" 2>&1 &
    pids+=($!)
  done
  for r in $(seq 0 $((nranks - 1))); do
    local code=0
    wait "${pids[$r]}" 2>/dev/null || code=$?
    exit_of[r]=$code
  done
  note "faults.sh: $name ($transport) done; exits: ${exit_of[*]}"
  collect "$name" "$fault" "$transport" "$d" "$dead"
}

want() { [[ -z ${FAULTS_ONLY:-} || " $FAULTS_ONLY " == *" $1 "* ]]; }

straggler_rank=2
late_rank=3
for tr in shm tcp; do
  want kill-busy && local_job "kill-busy-$tr" "kill -9 rank 2 during 64 MiB allreduces" "$tr" 60 2 \
    GW_TIMEOUT=30 FAULTS_SCENARIO=kill-busy FAULTS_VICTIM=2 FAULTS_DELAY=1 FAULTS_MAX_S=45
  want kill-idle && local_job "kill-idle-$tr" "kill -9 idle rank 2, others in allreduce" "$tr" 60 2 \
    GW_TIMEOUT=30 FAULTS_SCENARIO=kill-idle FAULTS_VICTIM=2 FAULTS_DELAY=1
  want straggler && local_job "straggler-$tr" "rank 2 never calls (alive), GW_TIMEOUT=5" "$tr" 40 "" \
    GW_TIMEOUT=5 FAULTS_SCENARIO=straggler FAULTS_VICTIM=2 FAULTS_LATE=9 FAULTS_COUNT=1048576
  want abort && local_job "abort-$tr" "gw_comm_abort on rank 0 (2nd thread) while it waits" "$tr" 60 "" \
    GW_TIMEOUT=30 FAULTS_SCENARIO=abort FAULTS_VICTIM=3 FAULTS_DELAY=1 FAULTS_LATE=3 FAULTS_COUNT=1048576
  want mismatch && local_job "mismatch-$tr" "mismatch: rank 1 count x2, rank 3 float64" "$tr" 60 "" \
    GW_TIMEOUT=30 FAULTS_SCENARIO=mismatch FAULTS_COUNT=1024
done

# ---- a vanished machine: network namespaces --------------------------------------
# netns_job NAME FAULT DEADLINE ENV...: ranks 0,1 on machine 0 (10.81.0.1), 2,3 on
# machine 1 (10.81.0.2); when all 4 wrote started.*, wait 1 s, take the time, cut.
# With NETNS_CUT=0 the script cuts nothing (the ranks make the fault) and, once
# three ranks reported, lets a stopped one go on (SIGCONT).
netns_job() {
  local name=$1 fault=$2 deadline=$3
  shift 3
  local d=$work/$name
  mkdir -p "$d"
  local token="faults-$$-$RANDOM$RANDOM" pids=() r
  exit_of=()
  # a fresh switch port for machine 1 in case an earlier run cut it
  ip -n "${tag}sw" link set "${tag}b1" master br0 && ip -n "${tag}sw" link set "${tag}b1" up
  for r in $(seq 0 $((nranks - 1))); do
    local k=$((r / 2))
    # shellcheck disable=SC2016  # $0 and $@ are the inner sh's
    ip netns exec "${tag}n$k" unshare --uts sh -c 'hostname "$0" && exec "$@"' "faultnode$k" \
      timeout -k 2 "$deadline" env GW_RANK="$r" GW_WORLD_SIZE=$nranks GW_LOCAL_RANK=$((r % 2)) \
      GW_MASTER_ADDR=10.81.0.1 GW_MASTER_PORT=29650 GW_JOB_TOKEN="$token" \
      FAULTS_DIR="$d" FAULTS_COUNT="$count" GW_DEBUG=INFO GW_DEBUG_SUBSYS=INIT "$@" \
      "$rank_bin" run >"$d/out.$r" 2>&1 &
    pids+=($!)
  done
  local waited=0
  started() { local f=("$d"/started.*); [[ -e ${f[0]} ]] && echo ${#f[@]} || echo 0; }
  while (($(started) < nranks && waited < 300)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  if (($(started) < nranks)); then
    note "faults.sh: $name: ranks did not start within 30 s"
  elif [[ ${NETNS_CUT:-1} == 0 ]]; then
    reported() { local f=("$d"/rank.*); [[ -e ${f[0]} ]] && echo ${#f[@]} || echo 0; }
    while (($(reported) < nranks - 1 && waited < 3000)); do
      sleep 0.1
      waited=$((waited + 1))
    done
    pkill -CONT -x faults_rank
  else
    sleep 1
    # the machine vanishes: its switch port leaves the bridge (both NICs keep carrier)
    "$rank_bin" now | awk '{ printf "%s\tscript cuts machine 1 off the switch\n", $1 }' >"$d/fault.script"
    ip -n "${tag}sw" link set "${tag}b1" nomaster
  fi
  for r in $(seq 0 $((nranks - 1))); do
    local code=0
    wait "${pids[$r]}" 2>/dev/null || code=$?
    exit_of[r]=$code
  done
  note "faults.sh: $name done; exits: ${exit_of[*]}"
  collect "$name" "$fault" "tcp (netns)" "$d" ""
}

netns_setup() {
  [[ $(id -u) -eq 0 ]] || { note "faults.sh: vanished machine skipped: needs root"; return 1; }
  if ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
    note "faults.sh: vanished machine skipped: needs ip and unshare"
    return 1
  fi
  ns_add() { ip netns add "$1" && namespaces+=("$1") && ip -n "$1" link set lo up; }
  ns_add "${tag}sw" 2>/dev/null || { note "faults.sh: vanished machine skipped: cannot create network namespaces"; return 1; }
  if ! ip -n "${tag}sw" link add br0 type bridge || ! ip -n "${tag}sw" link set br0 up; then
    note "faults.sh: vanished machine skipped: no bridge in a namespace"
    return 1
  fi
  local k
  for k in 0 1; do
    if ! { ns_add "${tag}n$k" &&
      ip link add "${tag}a$k" type veth peer name "${tag}b$k" &&
      ip link set "${tag}a$k" netns "${tag}n$k" && ip link set "${tag}b$k" netns "${tag}sw" &&
      ip -n "${tag}n$k" link set "${tag}a$k" name eth0 &&
      ip -n "${tag}n$k" addr add "10.81.0.$((k + 1))/24" dev eth0 &&
      ip -n "${tag}n$k" link set eth0 up &&
      ip -n "${tag}sw" link set "${tag}b$k" master br0 &&
      ip -n "${tag}sw" link set "${tag}b$k" up; }; then
      note "faults.sh: vanished machine skipped: namespace setup failed"
      return 1
    fi
  done
  return 0
}

if want cut-busy || want cut-idle || want stop-remote; then
  if netns_setup; then
    want cut-busy && netns_job cut-busy "machine 1 vanishes (link cut) during 64 MiB allreduces" 100 \
      GW_TIMEOUT=60 FAULTS_SCENARIO=loop FAULTS_MAX_S=80
    want stop-remote && NETNS_CUT=0 netns_job stop-remote "rank 1 (machine 0's last) stops (SIGSTOP) during 64 MiB allreduces, GW_TIMEOUT=5" 100 \
      GW_TIMEOUT=5 FAULTS_SCENARIO=stop FAULTS_VICTIM=1 FAULTS_DELAY=1 FAULTS_MAX_S=60
    want cut-idle && netns_job cut-idle "machine 1 vanishes while all wait (rank 2 late, nothing in flight)" 100 \
      GW_TIMEOUT=60 FAULTS_SCENARIO=late FAULTS_VICTIM=2 FAULTS_LATE=4 FAULTS_COUNT=1048576
  else
    rows+=("machine vanishes (link cut)${US}tcp (netns)$US-$US-$US-${US}skipped: see the note above / faults.log")
  fi
fi

# ---- the table ----------------------------------------------------------------------
{
  echo "# gradwire fault report ($nranks ranks)"
  echo
  echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname) ($(nproc) cores), tree at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$root" diff --quiet 2>/dev/null || echo ' + uncommitted changes'), by bench/faults.sh with $rank_bin."
  echo "Seconds: from the fault (CLOCK_MONOTONIC, written by the faulting rank or the script just before it) to the return of the rank's gradwire call."
  echo "Messages are trimmed to $trim characters; full text in faults.log."
  echo
  echo "| fault | transport | rank | seconds to report | result code | message |"
  echo "|---|---|---|---|---|---|"
  for row in "${rows[@]}"; do
    IFS=$US read -r f t r s c m <<<"$row"
    m=${m//|/\\|}
    ((${#m} > trim)) && m="${m:0:trim}..."
    echo "| $f | $t | $r | $s | $c | $m |"
  done
} >"$work/faults.md"
cat "$work/faults.md"
cp "$work/faults.md" "$results/faults.md"
cp "$log" "$results/faults.log"
echo >&2
echo "faults.sh: table in $results/faults.md, full messages and rank logs in $results/faults.log" >&2
# A scenario that did not run, or a surviving rank that never reported, is a
# failure of this run (the table above says which), not a quiet row.
failed=0
for row in "${rows[@]}"; do
  [[ $row == *"no report ("* || $row == *"no fault moment recorded"* || $row == *"setup failed"* ]] && failed=$((failed + 1))
done
if ((failed)); then
  echo "faults.sh: $failed row(s) without a report or with a failed setup (see the table)" >&2
  exit 1
fi
