#!/usr/bin/env bash
# ./run.sh - installs what is missing, builds into build/, and runs the main job:
# until the trainer exists, the allreduce bandwidth test with 2 local ranks from
# 8 B to 64 MiB (float32 sum).  Extra arguments go to gw-perf.
set -euo pipefail
cd "$(dirname "$0")"
. scripts/deps.sh
gw_install_deps
gw_build build
exec build/tools/gw-run -n 2 build/tools/gw-perf -b 8 -e 64M -f 2 -n 20 -w 5 "$@"
