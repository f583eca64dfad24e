# lib.sh - shell pieces shared by bench/compare.sh and bench/compare-tcp.sh.
# Sourced, not run.  The caller sets `prog` (its name, for messages) and `here`
# (bench/) before sourcing, and `work` (a scratch directory) before run_step.
# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034  # prog, here, work come from the caller; what is set here is for it

die() { echo "$prog: $*" >&2; exit 1; }

# "256M" -> 268435456 (powers of 1024, as gw-perf and the peer harnesses read them).
to_bytes() {
  local v=$1 n mult=1
  [[ $v =~ ^([0-9]+)([kKmMgG]?)[bB]?$ ]] || die "bad size '$v'"
  n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    k|K) mult=1024 ;;
    m|M) mult=$((1024 * 1024)) ;;
    g|G) mult=$((1024 * 1024 * 1024)) ;;
  esac
  echo $((n * mult))
}

# bench_settings DEFAULT_FACTOR [top]: reads the BENCH_* sizes, counts and limits
# into min max split factor iters warmup iters_large warmup_large step_timeout
# rounds, checks them, and fills `ranges`: each entry is "first last iters warmup"
# for one invocation of each tool.  min..max is split into at most two ranges, so big
# sizes can run fewer iterations.  The sizes are min, min*factor, ... up to max; with
# "top" they are max, max/factor, ... down to min instead, and min on its own in front
# when it is not one of them (factor 4 from 8 would miss 256M; from 256M down it
# misses 8).
bench_settings() {
  min=$(to_bytes "${BENCH_MIN:-8}")
  max=$(to_bytes "${BENCH_MAX:-256M}")
  split=$(to_bytes "${BENCH_SPLIT:-1M}")
  factor=${BENCH_FACTOR:-$1}
  iters=${BENCH_ITERS:-100}
  warmup=${BENCH_WARMUP:-10}
  iters_large=${BENCH_ITERS_LARGE:-20}
  warmup_large=${BENCH_WARMUP_LARGE:-3}
  step_timeout=${BENCH_TIMEOUT:-300}
  rounds=${BENCH_ROUNDS:-2}
  [[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 ]] || die "BENCH_ROUNDS must be an integer >= 1"
  [[ $factor =~ ^[0-9]+$ && $factor -ge 2 ]] || die "BENCH_FACTOR must be an integer >= 2"
  ((min >= 4 && min <= max)) || die "need 4 <= BENCH_MIN <= BENCH_MAX"

  ranges=()
  if [[ ${2:-} == top ]]; then
    local lo=$max
    while ((lo % factor == 0 && lo / factor >= min)); do lo=$((lo / factor)); done
    ((lo == min)) || bench_add_ranges "$min" "$min"
    bench_add_ranges "$lo" "$max"
  else
    bench_add_ranges "$min" "$max"
  fi
}

# bench_add_ranges FIRST LAST: appends FIRST..LAST (by factor) to `ranges`, split in
# two at `split`.
bench_add_ranges() {
  local first=$1 last=$2 s
  if ((last <= split)); then
    ranges+=("$first $last $iters $warmup")
  elif ((first > split)); then
    ranges+=("$first $last $iters_large $warmup_large")
  else
    s=$first
    while ((s * factor <= split)); do s=$((s * factor)); done
    ranges+=("$first $s $iters $warmup")
    if ((s * factor <= last)); then ranges+=("$((s * factor)) $last $iters_large $warmup_large"); fi
  fi
}

# bench_print_ranges: the "# first..last B: n iterations after w warmup" lines.
bench_print_ranges() {
  local r first last n w
  for r in "${ranges[@]}"; do
    read -r first last n w <<<"$r"
    echo "#   $first..$last B: $n iterations after $w warmup"
  done
}

# bench_mpi_opts DEFAULT...: `mpi_opts` from MPIRUN_ARGS, else the given defaults;
# as root, the options and environment that let mpirun run.
bench_mpi_opts() {
  if [[ -n ${MPIRUN_ARGS:-} ]]; then
    read -r -a mpi_opts <<<"$MPIRUN_ARGS"
  else
    mpi_opts=("$@")
  fi
  if [[ $(id -u) == 0 ]]; then
    mpi_opts+=(--allow-run-as-root)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

# bench_results NAME: creates bench/results (ignored by git) and sets `results`,
# `stamp` and `out_csv` = bench/results/NAME-<stamp>.csv.
bench_results() {
  results=$here/results
  mkdir -p "$results"
  [[ -f $results/.gitignore ]] || printf '*.csv\n*.log\n' >"$results/.gitignore"
  stamp=$(date +%Y-%m-%d-%H%M%S)
  out_csv=$results/$1-$stamp.csv
}

# try_step NAME CSVPREFIX COMMAND...: runs COMMAND once per range with the range's
# -b -e -f -n -w and --csv appended, echoing its output into $work/CSVPREFIX.log
# too, then joins the CSVs into $work/CSVPREFIX.csv.  On a failure, a timeout
# (BENCH_TIMEOUT) or a missing CSV it says so on stderr and returns 1, leaving
# no $work/CSVPREFIX.csv.  With bench_async=1 the command runs in the background
# (see bench_stop_step).
try_step() {
  local name=$1 prefix=$2 i=0 r first last n w rc
  shift 2
  echo
  echo "## $name"
  for r in "${ranges[@]}"; do
    read -r first last n w <<<"$r"
    rc=0
    if [[ ${bench_async:-0} == 1 ]]; then
      # In the background, so that the caller's INT / TERM trap runs at once (bash
      # runs traps only between foreground commands) and can end the step with
      # bench_stop_step; timeout leads its own process group and passes a signal on
      # to all of it.
      (
        set +e
        sh -c 'echo $$ >"$0"; exec "$@"' "$work/step.pid" timeout --kill-after=10 "$step_timeout" \
          "$@" -b "$first" -e "$last" -f "$factor" -n "$n" -w "$w" --csv "$work/$prefix.part$i.csv" 2>&1 |
          tee -a "$work/$prefix.log"
        exit "${PIPESTATUS[0]}"
      ) &
      wait $! || rc=$?
      rm -f "$work/step.pid"
    else
      timeout --kill-after=10 "$step_timeout" \
        "$@" -b "$first" -e "$last" -f "$factor" -n "$n" -w "$w" --csv "$work/$prefix.part$i.csv" 2>&1 |
        tee -a "$work/$prefix.log" || rc=${PIPESTATUS[0]}
    fi
    ((rc == 0)) || {
      if ((rc == 124 || rc == 137)); then
        echo "$prog: $name did not finish within $step_timeout s (BENCH_TIMEOUT); its output is above" >&2
      else
        echo "$prog: $name failed (exit $rc); its output is above" >&2
      fi
      return 1
    }
    [[ -s $work/$prefix.part$i.csv ]] || {
      echo "$prog: $name wrote no CSV" >&2
      return 1
    }
    i=$((i + 1))
  done
  # One header, then every range's rows.
  awk 'FNR == 1 && NR != 1 { next } { print }' "$work/$prefix".part*.csv >"$work/$prefix.csv"
}

# bench_stop_step: ends the step that try_step runs in the background (bench_async=1),
# if any, with SIGTERM to its timeout, which passes it on to the tool.
bench_stop_step() {
  local pid
  pid=$(cat "$work/step.pid" 2>/dev/null) || return 0
  [[ $pid =~ ^[0-9]+$ ]] && kill -TERM "$pid" 2>/dev/null
  wait 2>/dev/null || true
}

# run_step NAME CSVPREFIX COMMAND...: try_step, and the script fails with it.
run_step() {
  try_step "$@" || exit 1
}
