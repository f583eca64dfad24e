#!/usr/bin/env bash
# gw_perf_flags.sh GW_RUN GW_PERF - gw-perf refuses bad sizes and output files
# before it measures (non-zero exit, the message naming the flag and value, no
# file written), warns about a GW_TUNING_FILE that is a directory, and
# measures each size once after rounding it down to whole elements; its checks
# catch a collective that writes nothing and a spoilt timed result; rows name
# what ran.
set -u
run=$1 perf=$2 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
refused() { # WORDS ARGS...: exit 2 (a bad command line), or $want_rc
  local words=$1 out rc
  shift
  out=$("$run" -n 2 "$perf" "$@" 2>&1)
  rc=$?
  if [ $rc -ne "${want_rc:-2}" ] || ! grep -qF -- "$words" <<<"$out"; then
    echo "FAIL: gw-perf $*: exit $rc, expected ${want_rc:-2} and a refusal naming \"$words\":"
    tail -5 <<<"$out"
    fail=1
  fi
}
refused "-b '0.5' is not a whole number of bytes" -b 0.5 -e 64
refused "-b '1e-3' is not a whole number of bytes" -b 1e-3
refused "-b ' 8' is not a size" -b ' 8'
# hexadecimal (strtod's) and a space before an integer: refused as the rest are
refused "-b '0x10' is not a size" -b 0x10
refused "-f '0x2' must be a number greater than 1" -f 0x2
refused "-n ' 1' is not an integer" -n ' 1'
refused "-e '4X' is not a size" -e 4X
refused "-i '0' must be at least one byte" -i 0
refused "-f and -i both say how the size steps" -f 2 -i 1K
refused "-f 'inf' must be a number greater than 1" -f inf
refused "-f '1e999' must be a number greater than 1" -f 1e999
refused "-b 'nan' is not a size" -b nan
refused "-b 8 -e 1048576 -i 8 makes more than 10000 steps" -b 8 -e 1M -i 8
refused "--csv $tmp/a and --json $tmp/a name the same file" --csv "$tmp/a" --json "$tmp/a"
refused "--tune writes the tuning file only" --tune "$tmp/t" --csv "$tmp/c"
refused "--csv /nonexistent-gw/c.csv: its directory /nonexistent-gw does not exist" --csv /nonexistent-gw/c.csv
# every rank exits 2 on rank 0's refusal, told of it (rank 1 left waiting in
# a collective exited 1 when rank 0 left, and gw-run's status was whichever
# exit came first); 3 ranks, the refusal's message on rank 1 and rank 2
out=$("$run" -n 3 "$perf" --json /nonexistent-gw/j.json 2>&1)
rc=$?
if [ $rc -ne 2 ] || [ "$(grep -c "rank 0 refused its output file" <<<"$out")" != 2 ] || grep -q "exited with code 1" <<<"$out"; then
  echo "FAIL: rank 0's refusal on 3 ranks: exit $rc, expected 2 on every rank, told:"; tail -6 <<<"$out"; fail=1
fi
refused "--tune $tmp: is a directory" --tune "$tmp"
# a mount that takes no files, though access() says yes to root (written only after the measurement)
if [ "$(id -u)" = 0 ]; then refused "--csv /proc/gw-perf.csv: cannot create files in /proc: " --csv /proc/gw-perf.csv
else refused "--csv /proc/gw-perf.csv: cannot write into /proc: " --csv /proc/gw-perf.csv; fi
# one file by two spellings or a link: refused like the same string (the CSV was lost)
refused "--csv $tmp/a and --json $tmp/./a name the same file" --csv "$tmp/a" --json "$tmp/./a"
: >"$tmp/j" && ln -s "$tmp/j" "$tmp/jl"
refused "--csv $tmp/jl and --json $tmp/j name the same file" --csv "$tmp/jl" --json "$tmp/j"
rm -f "$tmp/j" "$tmp/jl"
# a link to nothing is written through (open makes what it names): checked
# where the file will be, not at the link (it failed after the measurement),
# and a link and the file it will make are one file
ln -s /nonexistent-gw/c.csv "$tmp/dl1" && ln -s dl1 "$tmp/dl2" && ln -s sub/c.csv "$tmp/dl3" && ln -s dl4 "$tmp/dl4"
refused "--csv $tmp/dl2 -> /nonexistent-gw/c.csv: its directory /nonexistent-gw does not exist" --csv "$tmp/dl2"
refused "--csv $tmp/dl4: a symbolic link that cannot be followed: Too many levels" --csv "$tmp/dl4"
mkdir "$tmp/sub"
refused "--csv $tmp/dl3 and --json $tmp/sub/c.csv name the same file" --csv "$tmp/dl3" --json "$tmp/sub/c.csv"
out=$("$run" -n 1 "$perf" -b 8 -e 8 -n 1 -w 0 --csv "$tmp/dl3" 2>&1) && [ -L "$tmp/dl3" ] && [ -s "$tmp/sub/c.csv" ] ||
  { echo "FAIL: --csv through a link to a new file in an existing directory:"; tail -4 <<<"$out"; fail=1; }
rm -rf "$tmp"/dl[1-4] "$tmp/sub"
# a FIFO or device as the tuning file: refused at once (rank 0 blocked in
# open() on a FIFO for ever; a device was replaced by a regular file)
mkfifo "$tmp/fifo"
refused "--tune $tmp/fifo: not a regular file" --tune "$tmp/fifo"
[ -p "$tmp/fifo" ] || { echo "FAIL: --tune replaced the FIFO"; fail=1; }
rm -f "$tmp/fifo" "$tmp/fifo.lock"
# a file that is no tuning file (a checkpoint, notes): refused at once, kept
# byte for byte (it was replaced by the measured rows)
printf 'remember the milk\nand the bread\n' >"$tmp/notes"
printf '\x20\0\0\0\0\0\0\0{"w":{"dtype":"F32"}}' >"$tmp/ckpt.safetensors"
cp "$tmp/notes" "$tmp/notes.orig" && cp "$tmp/ckpt.safetensors" "$tmp/ckpt.orig"
refused "--tune $tmp/notes: has none of a tuning file's rows (line 1 of 2: \"remember the milk\")" --tune "$tmp/notes"
refused "--tune $tmp/ckpt.safetensors: holds a NUL byte (line 1): not a tuning file" --tune "$tmp/ckpt.safetensors"
cmp -s "$tmp/notes" "$tmp/notes.orig" && cmp -s "$tmp/ckpt.safetensors" "$tmp/ckpt.orig" ||
  { echo "FAIL: --tune changed a file that is no tuning file"; fail=1; }
rm -f "$tmp"/notes* "$tmp"/ckpt*
# the tuning file's temporary name adds 12 (".tmp." and a pid), not the
# weights writer's 32: a 250-character name leaves no room, 243 is the most
refused "the file name is 250 characters long; at most 243 here (its temporary file's name adds 12 to it" \
  --tune "$tmp/$(printf 't%.0s' $(seq 250))"
refused "-f 1.0000001 makes more than 10000 steps" -f 1.0000001
# every size under one element (of a rank's share): refused, not a sweep of empty operations that passed
refused "-e 7: no size up to it holds a whole float64 element (8 bytes), so float64 would measure nothing: take -e 8" \
  -b 7 -e 7 -d float64
refused "-e 7: no size up to it holds a whole int32 element (4 bytes) for each rank (reduce_scatter splits the size)" \
  -b 1 -e 7 -d int32 -C reduce_scatter
# not a number of emulated devices: no device, named (it ran the emulator)
out=$(GW_DEV_EMULATE=false "$run" -n 2 "$perf" -D -b 8 -e 8 2>&1) &&
  { echo "FAIL: GW_DEV_EMULATE=false accepted"; fail=1; }
grep -qF "GW_DEV_EMULATE=false is not a number of emulated devices" <<<"$out" ||
  { echo "FAIL: GW_DEV_EMULATE=false:"; tail -3 <<<"$out"; fail=1; }
# buffers past the machine's available memory: refused, not OOM-killed while
# faulted in (2 ranks x 2 buffers of the machine's whole memory; -e is at most
# 64G, so a machine of over 120 GiB is not asked)
total_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
if [ -n "$total_kib" ] && [ "$total_kib" -lt $((120 * 1024 * 1024)) ]; then
  big=$(( total_kib / 1048576 + 1 ))G
  want_rc=1 refused "the send and receive buffers (host memory) of 2 ranks on this machine need" -b "$big" -e "$big"
  # the emulator's device memory is host memory too: 4 buffers a rank, where
  # 2 were counted (a sixth of the machine each passed, and would have filled
  # it; ulimit -v makes a regression fail to allocate instead, so not under
  # ASan, whose shadow memory needs more address space than that)
  e=$(( total_kib / 6 / 1024 + 1 ))M
  if ! grep -qa __asan_init "$perf"; then
    out=$( (ulimit -v $(( total_kib / 2 )); GW_DEV_EMULATE=1 "$run" -n 2 "$perf" -D -b "$e" -e "$e") 2>&1) &&
      { echo "FAIL: -D -e $e on the emulator accepted"; fail=1; }
    grep -qF "(emulated device memory in host memory, and their pinned host copies) of 2 ranks on this machine need" \
      <<<"$out" || { echo "FAIL: -D -e $e on the emulator:"; tail -3 <<<"$out"; fail=1; }
  fi
fi
refused "-e '65G' is above the largest size gw-perf takes, 64G" -e 65G
refused "-a tree applies to allreduce only: allgather always runs on the ring" -a tree -C allgather
refused "-a exchange applies to allreduce only: broadcast always runs on the ring" -a exchange -C broadcast
# Flags that would have been ignored: --tune measures its own sizes and every
# algorithm (a forced one also dropped the others' rows from the file); -o and
# -r where nothing is reduced or nothing has a root.
refused "--tune measures its own sizes, algorithms and protocols: -b does not apply" --tune "$tmp/t" -b 8
refused "--tune measures its own sizes, algorithms and protocols: -a does not apply" --tune "$tmp/t" -a ring
refused "-o applies to allreduce and reduce_scatter: allgather reduces nothing" -C allgather -o prod
refused "-r (the root) applies to -C broadcast only" -r 1
# nccl-tests' -g and -t: 1 accepted (its own quick example runs), else refused
refused "-g '2': a gw-perf rank is one process with one GPU (nccl-tests' -g 1 -t 1); start N ranks with gw-run -n N" -g 2
refused "-t '4': a gw-perf rank is one process with one GPU" -t 4
out=$("$run" -n 2 "$perf" -b 8 -e 128 -f 2 -g 1 -t 1 -n 1 -w 0 2>&1) ||
  { echo "FAIL: nccl-tests' -g 1 -t 1 refused:"; tail -3 <<<"$out"; fail=1; }
out=$(GW_ALGO=ring "$run" -n 2 "$perf" --tune "$tmp/t" 2>&1) &&
  { echo "FAIL: --tune under GW_ALGO=ring accepted"; fail=1; }
grep -qF "unset GW_ALGO (it is ring)" <<<"$out" || { echo "FAIL: --tune under GW_ALGO=ring:"; tail -3 <<<"$out"; fail=1; }
# A file that cannot be written to the end (a full disk) fails the run.
want_rc=1 refused "--csv /dev/full: writing failed" -b 8 -e 8 -n 1 -w 0 --csv /dev/full
refused "unrecognized option '--bogus'" --bogus
# Options that differ across ranks: named by the rank that has them (the calls
# then mismatched, "collective calls differ", naming no flag; --min-bw on rank
# 1 alone stopped it with a peer's "left the communicator"); rank 0's own
# flags (--csv, --json, --min-bw) may be given to rank 0 alone
printf '#!/bin/sh\nif [ "$RANK" = "$GW_TEST_RANK" ]; then exec "%s" "$@" $GW_TEST_EXTRA; fi\nexec "%s" "$@"\n' \
  "$perf" "$perf" >"$tmp/one.sh"
chmod +x "$tmp/one.sh"
differs="this rank's options are not rank 0's (rank 0's -> this rank's): "
for extra in "-e 2K|$differs-e 1024 -> 2048" "-d int32 -o max|$differs-d float32 -> int32, -o sum -> max" \
  "--min-bw 1000|--min-bw is given here and not on rank 0 (rank 0 decides" \
  "--csv $tmp/c|--csv is given here and not on rank 0 (rank 0 writes the file"; do
  out=$(GW_TEST_RANK=1 GW_TEST_EXTRA=${extra%%|*} "$run" -n 2 "$tmp/one.sh" -b 8 -e 1K -n 1 -w 0 2>&1)
  rc=$?
  if [ $rc -ne 2 ] || ! grep -qF "rank 1: ${extra#*|}" <<<"$out" ||
    ! grep -qF "rank 0: rank 1 runs with options other than rank 0's" <<<"$out"; then
    echo "FAIL: ${extra%%|*} on rank 1 alone: exit $rc:"; tail -4 <<<"$out"; fail=1
  fi
done
out=$(GW_TEST_RANK=0 GW_TEST_EXTRA="--csv $tmp/c0 --min-bw 0.000001" "$run" -n 2 "$tmp/one.sh" -b 8 -e 1K -n 1 -w 0 2>&1) &&
  [ -s "$tmp/c0" ] || { echo "FAIL: --csv and --min-bw on rank 0 alone:"; tail -4 <<<"$out"; fail=1; }
rm -f "$tmp/c0"
# rank 0's --min-bw failing: every rank takes it (the others exited 0 and
# rank 0's wait before its exit 1 failed, "rank 1 ... is gone")
out=$(GW_TEST_RANK=0 GW_TEST_EXTRA="--min-bw 1000000" "$run" -n 2 "$tmp/one.sh" -b 8 -e 1K -n 1 -w 0 2>&1)
rc=$?
if [ $rc -ne 1 ] || ! grep -qF "FAILED (--min-bw 1e+06)" <<<"$out" || grep -qF "is gone" <<<"$out"; then
  echo "FAIL: --min-bw failing on rank 0 alone: exit $rc:"; tail -4 <<<"$out"; fail=1
fi
# Under a file-size limit (ulimit -f): the shared-memory FIFOs over it are
# named (sizing one raised SIGXFSZ and its default action killed the ranks
# unexplained), and a CSV past it fails the run with EFBIG, said.
if command -v prlimit >/dev/null; then # (util-linux's; scripts/deps.sh installs it)
out=$(prlimit --fsize=1000000 -- "$run" -n 2 "$perf" -b 8 -e 8 -n 1 -w 0 2>&1) &&
  { echo "FAIL: FIFOs over ulimit -f accepted"; fail=1; }
grep -qF "over this process's file-size limit (ulimit -f) of 1000000 bytes" <<<"$out" ||
  { echo "FAIL: FIFOs over ulimit -f:"; tail -3 <<<"$out"; fail=1; }
out=$(prlimit --fsize=10 -- "$run" -n 1 "$perf" -b 8 -e 8 -n 1 -w 0 --csv "$tmp/big.csv" 2>&1) &&
  { echo "FAIL: a CSV past ulimit -f passed"; fail=1; }
grep -qF -- "--csv $tmp/big.csv: writing failed: File too large" <<<"$out" ||
  { echo "FAIL: a CSV past ulimit -f:"; tail -3 <<<"$out"; fail=1; }
rm -f "$tmp/big.csv"
else
  echo "SKIP: the ulimit -f cases (no prlimit here: util-linux, which scripts/deps.sh installs)"
fi
for f in a c t; do
  [ -e "$tmp/$f" ] && { echo "FAIL: a refused run wrote $tmp/$f"; fail=1; }
done
out=$(GW_TUNING_FILE=$tmp "$run" -n 2 "$perf" -b 8 -e 8 -n 1 -w 0 2>&1)
grep -qF "GW_TUNING_FILE $tmp: is a directory" <<<"$out" || { echo "FAIL: no warning for a directory as GW_TUNING_FILE"; tail -5 <<<"$out"; fail=1; }
# -f 1.01 from 8 to 24 bytes of float32: 8, 12, 16, 20 and 24 bytes, once each
sizes=$("$run" -n 2 "$perf" -b 8 -e 24 -f 1.01 -d float32 -o sum -n 1 -w 0 2>&1 | awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {printf "%s ", $2}')
[ "$sizes" = "8 12 16 20 24 " ] || { echo "FAIL: -f 1.01 measured sizes '$sizes', expected '8 12 16 20 24 '"; fail=1; }
# -i steps linearly: 1 KiB to 4 KiB by 1 KiB
sizes=$("$run" -n 2 "$perf" -b 1K -e 4K -i 1K -n 1 -w 0 2>&1 | awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {printf "%s ", $2}')
[ "$sizes" = "1024 2048 3072 4096 " ] || { echo "FAIL: -i 1K measured sizes '$sizes', expected '1024 2048 3072 4096 '"; fail=1; }
# The check must catch a collective that writes nothing (GW_PERF_TEST_SKIP_CHECKED_RUN
# leaves the checked run out): every size, out of place and in place, counts wrong
# elements (in place, an allgather's other blocks and a broadcast's non-root
# buffers keep what was there before: not an earlier run's result), and gw-perf fails.
for coll in allreduce allgather reduce_scatter broadcast; do
  out=$(GW_PERF_TEST_SKIP_CHECKED_RUN=1 "$run" -n 3 "$perf" -C "$coll" -b 96 -e 96K -f 32 -d float32 -n 1 -w 0 2>&1)
  rc=$?
  rows=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ && $3 > 0' <<<"$out")
  caught=$(awk '$10 > 0 && $14 > 0' <<<"$rows" | wc -l)
  if [ $rc -eq 0 ] || [ -z "$rows" ] || [ "$caught" -ne "$(wc -l <<<"$rows")" ]; then
    echo "FAIL: $coll with nothing written: exit $rc, $caught of $(wc -l <<<"$rows") sizes caught:"; tail -8 <<<"$out"; fail=1
  fi
done
# An element left unwritten never passes: out of place, every element of both
# checked runs counts on both ranks (4 x count), integers too, whose all-ones
# fill was a likely result (-1 or 255: 8-27% of elements passed); count is
# per rank for reduce_scatter (nccl-tests' column); the summary says FAILED.
for coll in allreduce reduce_scatter; do
  for d in int8 uint8 int32; do
    for op in sum max avg; do
      out=$(GW_PERF_TEST_SKIP_CHECKED_RUN=1 "$run" -n 2 "$perf" -C $coll -b 4K -e 4K -d $d -o $op -n 1 -w 0 2>&1)
      rc=$?
      es=$([ $d = int32 ] && echo 4 || echo 1)
      want=$(( 4096 / es / $([ $coll = reduce_scatter ] && echo 2 || echo 1) ))
      if [ $rc -ne 1 ] || ! awk -v c=$want '$1 == "[0]" && $2 == 4096 && $3 == c && $10 == 4 * c {f=1} END {exit !f}' <<<"$out" ||
         ! grep -qE "Out of bounds values : [0-9]+ FAILED" <<<"$out"; then
        echo "FAIL: $coll $d $op with nothing written: exit $rc, expected count $want and #wrong $((4 * want)):"
        tail -4 <<<"$out"; fail=1
      fi
    done
  done
done
# The timed runs' own result is checked where they leave it: GW_PERF_TEST_SPOIL_TIMED
# spoils one element of it (as a fault of back-to-back calls would), the fresh
# checked runs stay right; out of place every collective, in place allgather and
# broadcast (a reduction's in-place output is its next run's input) count it.
for coll in allreduce allgather reduce_scatter broadcast; do
  out=$(GW_PERF_TEST_SPOIL_TIMED=1 "$run" -n 2 "$perf" -C "$coll" -b 64 -e 64K -f 32 -d float32 -n 2 -w 0 2>&1)
  rc=$?
  rows=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ && $3 > 0' <<<"$out")
  case $coll in allgather | broadcast) want='$10 > 0 && $14 > 0' ;; *) want='$10 > 0 && $14 == 0' ;; esac
  caught=$(awk "$want" <<<"$rows" | wc -l)
  if [ $rc -eq 0 ] || [ -z "$rows" ] || [ "$caught" -ne "$(wc -l <<<"$rows")" ]; then
    echo "FAIL: $coll with a timed result spoilt: exit $rc, $caught of $(wc -l <<<"$rows") sizes as expected:"; tail -8 <<<"$out"; fail=1
  fi
done
# Timed runs that wrote nothing (GW_PERF_TEST_SKIP_TIMED_RUNS) leave the
# checked run's result, whose inputs differ, so it is wrong; with warmup runs
# (which leave the timed runs' very result) too: the output is cleared after
# them.  Out of place every collective, in place allgather and broadcast.
for w in 0 2; do
  for coll in allreduce allgather reduce_scatter broadcast; do
    out=$(GW_PERF_TEST_SKIP_TIMED_RUNS=1 "$run" -n 2 "$perf" -C "$coll" -b 64 -e 64K -f 32 -d float32 -n 2 -w $w 2>&1)
    rc=$?
    rows=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ && $3 > 0' <<<"$out")
    case $coll in allgather | broadcast) want='$10 > 0 && $14 > 0' ;; *) want='$10 > 0' ;; esac
    if [ $rc -eq 0 ] || [ -z "$rows" ] || [ "$(awk "$want" <<<"$rows" | wc -l)" -ne "$(wc -l <<<"$rows")" ]; then
      echo "FAIL: $coll, -w $w: timed runs that wrote nothing passed: exit $rc:"; tail -6 <<<"$out"; fail=1
    fi
  done
done
# ... every element of them, integers too: with -w 0 the output held the
# checked run's result, often the timed runs' too (MAX of +-1..5 at 4 ranks:
# 0, 52 and 192 of 4, 64 and 256 elements caught), now cleared.
for w in 0 2; do
  out=$(GW_PERF_TEST_SKIP_TIMED_RUNS=1 "$run" -n 4 "$perf" -d int8 -o max -b 1 -e 64 -f 4 -n 1 -w $w 2>&1)
  rows=$(awk '$1 == "[0]" && $2 ~ /^[0-9]+$/' <<<"$out")
  if [ -z "$rows" ] || [ "$(awk '$10 == 4 * $3' <<<"$rows" | wc -l)" -ne "$(wc -l <<<"$rows")" ]; then
    echo "FAIL: int8 max, -w $w: timed runs that wrote nothing not caught at every element (#wrong 4 x count):"
    tail -6 <<<"$out"; fail=1
  fi
done
# Float sums are checked exactly at any rank count: the inputs shrink so that
# n ranks' sums stay within the integers the dtype holds.  Four ranks stand
# for many with bfloat16 holding integers only to 8 (GW_PERF_TEST_BF16_LIMIT):
# with inputs 1..5 regardless, the tolerance rounding then needs let a result
# off by 1 (GW_PERF_TEST_NUDGE: a rank counted twice) pass; untouched, no
# false alarm.
for nudge in 0 1; do
  out=$(env GW_PERF_TEST_BF16_LIMIT=8 $([ $nudge = 1 ] && echo GW_PERF_TEST_NUDGE=1) "$run" -n 4 "$perf" \
    -b 64 -e 64 -d bfloat16 -o sum -n 1 -w 0 2>&1)
  rc=$?
  wrong=$(awk '$1 == "[0]" && $2 == "64" {print $10}' <<<"$out")
  if { [ $nudge = 1 ] && { [ $rc -eq 0 ] || [ "${wrong:-0}" -eq 0 ]; }; } ||
     { [ $nudge = 0 ] && { [ $rc -ne 0 ] || [ "$wrong" != 0 ]; }; }; then
    echo "FAIL: bfloat16 sums past its integers, nudge $nudge: exit $rc, #wrong '$wrong':"; tail -4 <<<"$out"; fail=1
  fi
done
# Past the exact integers (bfloat16 products of 4 ranks' 1..5 reach 625) a
# result is checked to a tolerance: rank 1's largest one unit off in its last
# place (GW_PERF_TEST_RANK1_ULP) passes that, and is caught by comparing the
# ranks' bits (every check, both columns); untouched, no false alarm.
for ulp in 0 1; do
  out=$(env $([ $ulp = 1 ] && echo GW_PERF_TEST_RANK1_ULP=1) "$run" -n 4 "$perf" -b 256 -e 256 -d bfloat16 -o prod \
    -n 1 -w 0 2>&1)
  rc=$?
  cols=$(awk '$1 == "[0]" && $2 == "256" {print $10, $14}' <<<"$out")
  if { [ $ulp = 1 ] && { [ $rc -eq 0 ] || [ "$cols" != "8 8" ]; }; } || { [ $ulp = 0 ] && { [ $rc -ne 0 ] || [ "$cols" != "0 0" ]; }; }; then
    echo "FAIL: a rank's result a unit off, ulp $ulp: exit $rc, #wrong '$cols' (ulp 1: 8 8, ulp 0: 0 0):"; tail -4 <<<"$out"; fail=1
  fi
done
# Each row names what ran, and the average bus bandwidth is over both columns
# (nccl-tests' definition).
for ap in "ring simple ring/simple" "exchange simple exchange/simple" "ring ll ring/ll"; do
  set -- $ap
  out=$("$run" -n 2 "$perf" -a "$1" -p "$2" -b 1M -e 1M -n 2 -w 0 2>&1)
  awk -v want="$3" '$1 == "[0]" && $2 == "1048576" && $NF == want {f=1} END {exit !f}' <<<"$out" ||
    { echo "FAIL: -a $1 -p $2: the row does not name $3:"; tail -4 <<<"$out"; fail=1; }
done
awk '$1 == "[0]" && $2 == "1048576" {want = ($9 + $13) / 2} /Avg bus bandwidth/ {got = $NF}
     END {exit !(want > 0 && got - want < 0.006 && want - got < 0.006)}  # rows print two decimals' <<<"$out" ||
  { echo "FAIL: the average bus bandwidth is not the mean of both columns:"; tail -4 <<<"$out"; fail=1; }
refused "-b 8 -e 67108864 -f 1.0001 makes more than 10000 steps" -b 8 -e 64M -f 1.0001
# --min-bw (nccl-tests' NCCL_TESTS_MIN_BW): an average below it fails the run,
# said on the closing line; above it, OK.
out=$("$run" -n 2 "$perf" -b 1K -e 1K -n 1 -w 0 --min-bw 1e6 2>&1)
rc=$?
[ $rc -eq 1 ] && grep -qE "Avg bus bandwidth    : [0-9.e+-]+ FAILED \(--min-bw 1e\+06\)" <<<"$out" ||
  { echo "FAIL: --min-bw 1e6: exit $rc:"; tail -4 <<<"$out"; fail=1; }
out=$("$run" -n 2 "$perf" -b 1K -e 1K -n 1 -w 0 --min-bw 1e-9 2>&1)
rc=$?
[ $rc -eq 0 ] && grep -qE "Avg bus bandwidth    : [0-9.e+-]+ OK \(--min-bw 1e-09\)" <<<"$out" ||
  { echo "FAIL: --min-bw 1e-9: exit $rc:"; tail -4 <<<"$out"; fail=1; }
refused "--min-bw 'fast' must be a bus bandwidth in GB/s above 0" --min-bw fast
refused "--min-bw '0' must be a bus bandwidth in GB/s above 0" --min-bw 0
# -c 0 checks nothing and says so: N/A, not a #wrong of 0.
out=$("$run" -n 2 "$perf" -b 8 -e 8 -n 1 -w 0 -c 0 -d float32 -o sum 2>&1)
grep -qF "Out of bounds values : N/A" <<<"$out" && awk '$1 == "[0]" && $2 == "8" && $10 == "N/A" && $14 == "N/A" {f=1} END {exit !f}' <<<"$out" ||
  { echo "FAIL: -c 0 did not report N/A:"; tail -5 <<<"$out"; fail=1; }
# --tune on one rank: refused before it measures (it measured it all, then
# the write failed: no world size of 1 in a tuning file).
out=$(GW_RANK=0 GW_WORLD_SIZE=1 timeout 60 "$perf" --tune "$tmp/one.tune" 2>&1)
rc=$?
[ $rc -eq 2 ] && grep -qF -- "--tune measures between ranks: run it on 2 ranks or more" <<<"$out" &&
  [ ! -e "$tmp/one.tune" ] || { echo "FAIL: --tune on one rank: exit $rc:"; tail -3 <<<"$out"; fail=1; }
# A table that cannot reach standard output (a full disk) is a failure, not a
# finished run (exit 0 with nothing written).
if [ -w /dev/full ]; then
  out=$(GW_RANK=0 GW_WORLD_SIZE=1 "$perf" -b 8 -e 64 -n 1 -w 0 2>&1 >/dev/full)
  rc=$?
  [ $rc -ne 0 ] && grep -qF "writing the results to standard output failed" <<<"$out" ||
    { echo "FAIL: gw-perf > /dev/full: exit $rc:"; tail -3 <<<"$out"; fail=1; }
fi
# GW_PROTO=ll where a transport has no LL format: the warning names it (it
# said "tcp" over emulated ib too).
out=$(GW_IB_EMULATE=1 GW_TRANSPORT=ib GW_PROTO=ll "$run" -n 2 "$perf" -b 8 -e 8 -n 1 -w 0 2>&1)
grep -qF "some connections (this rank's over ib) have no LL format" <<<"$out" ||
  { echo "FAIL: GW_PROTO=ll over ib: the warning does not name ib:"; grep -F "LL format" <<<"$out"; fail=1; }
# -R with -D: refused as a bad command line before the rendezvous; "all" in any
# case, as the dtype and op names are
refused "-R and -D: registering device memory is not supported yet" -R -D
out=$("$run" -n 2 "$perf" -d ALL -o All -b 8 -e 8 -n 1 -w 0 2>&1) && grep -q "int8 *prod" <<<"$out" ||
  { echo "FAIL: -d ALL -o All:"; tail -3 <<<"$out"; fail=1; }
# a cgroup's memory limit (a container's, a job's) bounds the buffers, not the
# machine's memory: refused before they are made (they went past the limit,
# and the kernel killed the ranks); a fake v2 tree, 1 GiB left at the job's level
mkdir -p "$tmp/cg/job" && : >"$tmp/cg/cgroup.controllers" && echo 2147483648 >"$tmp/cg/job/memory.max" &&
  echo 1073741824 >"$tmp/cg/job/memory.current" && echo "0::/job" >"$tmp/cgproc"
GW_TEST_CGROUP_FS="$tmp/cg" GW_TEST_PROC_CGROUP="$tmp/cgproc" want_rc=1 refused \
  "need 4.0 GiB, and it has 1.0 GiB available under its cgroup's memory limit: lower -e" -b 1G -e 1G -n 1 -w 0
# --json is a whole document while its rows come: a run stopped midway leaves
# the rows so far and "complete": false (it left an empty file); a finished
# run's has every row and "complete": true
"$run" -n 2 "$perf" -b 8 -e 64K -n 200000 -w 1 --json "$tmp/part.json" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 400); do grep -q '"size": 16,' "$tmp/part.json" 2>/dev/null && break; sleep 0.05; done
kill -TERM $pid
wait $pid
python3 - "$tmp/part.json" <<'PY' || { echo "FAIL: --json of a run stopped midway:"; head -c 600 "$tmp/part.json"; echo; fail=1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d["complete"] is False and len(d["results"]) >= 2 and d["results"][1]["size"] == 16, d
PY
out=$("$run" -n 2 "$perf" -b 8 -e 1K -n 2 -w 1 --json "$tmp/whole.json" 2>&1)
python3 - "$tmp/whole.json" <<'PY' || { echo "FAIL: --json of a whole run:"; tail -3 <<<"$out"; head -c 600 "$tmp/whole.json"; echo; fail=1; }
import json, sys
d = json.load(open(sys.argv[1]))
assert d["complete"] is True and [r["size"] for r in d["results"]] == [8 << k for k in range(8)] and d["wrong"] == 0, d
PY
[ $fail -eq 0 ] && echo "gw-perf flags: all refused as expected, sizes measured once, a collective that writes nothing caught"
exit $fail
