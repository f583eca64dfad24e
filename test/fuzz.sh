#!/usr/bin/env bash
# test/fuzz.sh - builds the libFuzzer targets (clang with
# -fsanitize=fuzzer,address,undefined) and runs each for GW_FUZZ_SECONDS
# (default 20) from an empty corpus.  A crash, over-read, UB or leak fails.
# Exits 77 (meson: skipped) when clang or libFuzzer is missing.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
secs=${GW_FUZZ_SECONDS:-20}
command -v clang >/dev/null || { echo "fuzz: clang not found; skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n); int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$work/probe.c"
clang -fsanitize=fuzzer "$work/probe.c" -o "$work/probe" 2>/dev/null || { echo "fuzz: no libFuzzer (libclang-rt-14-dev); skipped"; exit 77; }
flags=(-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$src/comm" -I"$src/transport" -I"$src/model" -I"$src/data" -I"$work")
printf '#pragma once\n' > "$work/gw_config.h"
fail=0
for t in bootstrap tcp safetensors jpeg png tune; do
  libs=(-lpthread -lm) defs=()
  [ "$t" = jpeg ] && libs+=(-lturbojpeg)
  [ "$t" = png ] && libs+=(-lpng) defs+=(-DGW_HAVE_PNG=1)
  if ! clang "${flags[@]}" "${defs[@]}" "$src/test/fuzz/fuzz_$t.c" "$src/comm/debug.c" -o "$work/fuzz_$t" "${libs[@]}"; then
    echo "fuzz: fuzz_$t does not build"; fail=1; continue
  fi
  mkdir -p "$work/corpus_$t"
  if "$work/fuzz_$t" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=1024 \
       "$work/corpus_$t" >"$work/$t.log" 2>&1; then
    echo "fuzz: $t: $(grep -E '^#[0-9]+.*DONE' "$work/$t.log" | tail -1 | awk '{print $1}' | tr -d '#') runs, no failure"
  else
    echo "fuzz: $t FAILED"; tail -40 "$work/$t.log"; fail=1
  fi
done
exit $fail
