#!/usr/bin/env bash
# ./test.sh - installs what is missing, builds into build/ with warnings as
# errors, runs every test suite with `meson test`, and ends with one line:
# "N passed, N failed, N skipped" (meson's counts).
#   ./test.sh --sanitize=address   the same in build-asan/ with ASan + UBSan
#   ./test.sh --sanitize=thread    the same in build-tsan/ with TSan
# Other arguments go to `meson test` (a test name, --suite grid, ...).
set -uo pipefail
cd "$(dirname "$0")"
. scripts/deps.sh
dir=build
extra=()
if [[ ${1:-} == --sanitize=* ]]; then
  case "${1#--sanitize=}" in
    # without CUDA: nvcc's output is not instrumented, the code behind it needs
    # a GPU (its tests skip), and compiling it took half of this build
    address) dir=build-asan; extra=(-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized -Dcuda=disabled)
             export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} ;;
    thread) dir=build-tsan; extra=(-Db_sanitize=thread -Db_lundef=false -Dbuildtype=debugoptimized) ;;
    *) echo "test.sh: --sanitize takes address or thread" >&2; exit 2 ;;
  esac
  shift
fi
gw_install_deps || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
# What deps.sh installs is required here: a missing library fails the setup
# (auto would leave the suites out, or skip the model's, and pass).
extra+=(-Dtests=enabled -Donednn=enabled -Dibverbs=enabled)
gw_build "$dir" "${extra[@]}" || { echo "build failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

log=$dir/meson-logs/test-summary.txt
wlog=$dir/meson-logs/test-summary-waits.txt
rm -f "$wlog"
built=$SECONDS
# The tests of suite 'waits' spend their time waiting (for timeouts, graces,
# signals, launchers: ~250 s of meson's slots here for ~45 s of CPU), so they
# run in a meson run of their own, all at once, beside the others' (two at a
# time, one per core): in either run alone they held a slot each while a core
# idled.  Only when the arguments leave the choice of tests to test.sh (none,
# or --no-suite only); a test name, --suite or any other option runs as
# asked, in one run.  Not under TSan, whose ranks are many times slower: six
# such tests at once there would press their timing limits.
split=1
[ "$dir" = build-tsan ] && split=0
a=("$@")
for ((i = 0; i < ${#a[@]}; i++)); do
  case "${a[i]}" in
    --no-suite) i=$((i + 1)) ;;
    --no-suite=*) ;;
    *) split=0 ;;
  esac
done
wpid=
if [ $split = 1 ]; then
  meson test -C "$dir" --no-rebuild --print-errorlogs --logbase testlog-waits --num-processes 8 --suite waits "$@" \
    >"$wlog" 2>&1 &
  wpid=$!
  trap '[ -n "$wpid" ] && kill "$wpid" 2>/dev/null' EXIT
  set -- --no-suite waits "$@"
fi
meson test -C "$dir" --no-rebuild --print-errorlogs "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ -n "$wpid" ]; then
  wait "$wpid"
  wrc=$?
  wpid=
  echo "--- suite waits (run beside the above; log: $dir/meson-logs/testlog-waits.txt)"
  cat "$wlog"
  [ $wrc -ne 0 ] && rc=$wrc
fi
# meson's closing counts: the last lines of these names (a test's own output
# printed before them could start with the same words), both runs added up
count() {
  local f n=0 v
  for f in "$log" "$wlog"; do
    [ -f "$f" ] || continue
    v=$(awk -v k="$1" '$0 ~ "^"k":" {v = $NF} END {print v + 0}' "$f")
    n=$((n + v))
  done
  echo $n
}
ok=$(count "Ok"); fail=$(count "Fail"); xpass=$(count "Unexpected Pass"); tmo=$(count "Timeout"); skip=$(count "Skipped")
failed=$(( fail + xpass + tmo ))
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
# nothing ran (a mistyped test or suite name): no success
if [ $(( ok + failed + skip )) -eq 0 ]; then echo "test.sh: no test ran" >&2; failed=1; fi
echo "$dir: built in $built s, tested in $((SECONDS - built)) s"
echo "${ok} passed, ${failed} failed, ${skip} skipped"
exit $(( failed > 0 ))
