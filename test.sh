#!/usr/bin/env bash
# ./test.sh - installs what is missing, builds into build/ with warnings as
# errors, runs every test suite with `meson test`, and ends with one line:
# "N passed, N failed, N skipped" (meson's counts).
set -uo pipefail
cd "$(dirname "$0")"
. scripts/deps.sh
gw_install_deps || exit 1
gw_build build || { echo "build failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }

log=build/meson-logs/test-summary.txt
meson test -C build --print-errorlogs "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
count() { awk -v k="$1" '$0 ~ "^"k":" {print $NF; exit}' "$log"; }
ok=$(count "Ok"); fail=$(count "Fail"); xpass=$(count "Unexpected Pass"); tmo=$(count "Timeout"); skip=$(count "Skipped")
failed=$(( ${fail:-0} + ${xpass:-0} + ${tmo:-0} ))
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "${ok:-0} passed, ${failed} failed, ${skip:-0} skipped"
exit $(( failed > 0 ))
