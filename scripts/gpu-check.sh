#!/usr/bin/env bash
# scripts/gpu-check.sh OUTDIR - the project's one GPU check (docs/gpu.md).
#
# On a machine with an NVIDIA GPU, nvcc, a C compiler, meson and ninja (pip's
# are fine; no Check, libibverbs or oneDNN needed, nothing is installed):
#   1. uses build-gpu/ if it was carried along and runs here, else builds it
#      (meson -Druntime_only=true: the runtime, gw-perf, gw-run, the device
#      suite on test/mini_check, the stand-in for Check, whether Check is
#      there or not: the same build everywhere, so CI compiles this one
#      (.ci/run), the kernel bench);
#   2. runs the GPU suite (test_device on the real device: the grid at 2, 3
#      and 4 ranks on this one GPU, stream ordering, streams, hardware
#      queues, misuse, IPC, a dead peer; the stream-ordered ring's cases too);
#   3. runs gw-perf on device buffers at 2 and 4 ranks over the device ring
#      (#wrong must be 0), stream-ordered up to 64 MiB, at 2 ranks through
#      host staging, and on host buffers at 2 ranks beside them (what earlier
#      checks settled is left out unless GW_CHECK_ALL=1: below);
#   4. measures the reduction kernel against cudaMemcpy device-to-device;
#   5. the cudnn backend (cuDNN and cuBLAS from the toolkit, or from PyTorch's
#      pip wheels through a directory of links, /tmp/gradwire-cuda-extra): its
#      kernels' 16-bit conversions against the host's, bit for bit, the model
#      backend suite on cudnn (every layer against naive references), the
#      same suite with NHWC activations, the bfloat16 and float16 suites on
#      cudnn (every layer against float32), the ResNets against PyTorch's
#      fixture (a step of ResNet-50, 3 SGD steps of ResNet-18, NCHW and
#      NHWC), ResNet-50 training throughput of model_bench (bf16 NHWC and
#      NCHW, fp16 NCHW and NHWC; last, bf16 NHWC with one block per piece of
#      batch norm's sums) beside PyTorch on the same GPU (channels_last + AMP
#      bf16 and fp16), gw-train --amp bf16 (NHWC) on synthetic 224x224 data at
#      1 and 2 ranks (and 2 on the stream-ordered ring), and the GPU time per
#      call site (our kernels, cuDNN's executions) of model_bench bf16 and fp16 NHWC
#      (GW_CUDNN_KERNEL_TIMES);
#   6. last, what may leave a process or the device in a bad state: a rank
#      killed mid-operation at 4 ranks, the stream-ordered ring at 256 MiB
#      past CUDA's launch queue, the device ring forced on with one queue;
# and writes summary.txt, log.txt and the CSVs into OUTDIR.  Each step has its
# own time limit, and the benchmarks after the suites run only while the
# script is inside 7 minutes (what is skipped for time is said), so the whole
# stays under 8 on one H200.
set -u
# What the build was made from: a hash of the sources (no git needed), kept in
# build-gpu/.gw-source-stamp by a build here; a carried build-gpu/ runs only
# with the stamp of the tree it arrives in.  A build-gpu/ made by hand
# (meson compile -C build-gpu) is marked as current with --stamp.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source_stamp() {
  (cd "$ROOT" &&
    find comm cuda model data tools bench test transport scripts meson.build meson_options.txt -type f \
      \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' -o -name '*.py' -o -name '*.sh' \
      -o -name meson.build -o -name meson_options.txt \) -print0 2>/dev/null | LC_ALL=C sort -z |
    xargs -0 sha1sum | sha1sum | cut -c1-16)
}
if [ "${1:-}" = --stamp ]; then
  d="$ROOT/build-gpu"
  [ -d "$d" ] || { echo "gpu-check.sh --stamp: no build-gpu/ (meson setup build-gpu ... first)" >&2; exit 2; }
  source_stamp >"$d/.gw-source-stamp" && echo "build-gpu/ marked as built from $(cat "$d/.gw-source-stamp")"
  exit 0
fi
# --build-only OUTDIR: step 1 alone (a build here, with warnings as errors),
# then the device suite's misuse case on the device emulator, through the
# stand-in for Check: what CI runs (.ci/run), so this build compiles on a
# machine without a GPU before a lent one meets it.
BUILD_ONLY=0
if [ "${1:-}" = --build-only ]; then BUILD_ONLY=1; shift; fi
OUT=${1:?usage: scripts/gpu-check.sh [--build-only] OUTDIR | --stamp}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2
# The log's tee ignores TERM and INT: a time limit that signals the whole
# process group must leave it running for the summary written at the exit.
exec > >(trap '' TERM INT HUP; exec tee "$OUT/log.txt") 2>&1
exec 3>&1 # the log, for finish(): a trap can run inside a step's redirection
START=$(date +%s)
: >"$OUT/summary.txt"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
elapsed() { echo $(($(date +%s) - START)); }
# The tables (scripts/gpu_check_summary.py) and the total, however the script
# ends: also after a failed build's exit or a TERM, what ran until then.
# Written to the file first (a log that is gone must not cost it).
finished=0
finish() {
  [ $finished = 1 ] && return
  finished=1
  trap '' PIPE
  if [ $BUILD_ONLY = 0 ]; then
    # the NHWC sums' tuner compares every plan's sums with the rules' plan's:
    # a plan that differs is a kernel defect (left out of the timing)
    local defects
    defects=$(grep -rh --include='*.txt' --exclude=summary.txt --exclude=tables.txt --exclude=log.txt \
                'bn sums NHWC plan .* gave other sums' "$OUT")
    [ -n "$defects" ] && { echo "bn sums NHWC: $(grep -c . <<<"$defects") line(s), $(sed 's/.*plan \(L[0-9]* G[0-9]* v[0-9]*\) gave.*/\1/' <<<"$defects" | sort -u | wc -l) distinct plan(s) gave other sums than the rules' plan (a kernel defect, in them or in the rules' plan; the first:)"
                           head -1 <<<"$defects"; } | tee -a "$OUT/summary.txt" >&3
    python3 "$ROOT/scripts/gpu_check_summary.py" "$OUT" >"$OUT/tables.txt" 2>&1
    cat "$OUT/tables.txt" >>"$OUT/summary.txt"
    cat "$OUT/tables.txt" >&3
  fi
  echo "total: $(elapsed) s" >>"$OUT/summary.txt"
  echo "total: $(elapsed) s" >&3
}
# A TERM or INT (a time limit): the running step's process group goes too
# (each step runs in the background of a wait, so the trap runs at once),
# then the summary.  A subshell that runs steps sets the trap again (bash
# resets caught signals in subshells).
STEP_PID=
on_term() {
  [ -n "$STEP_PID" ] && kill -TERM -- "-$STEP_PID" 2>/dev/null
  exit 143
}
trap finish EXIT
trap on_term TERM INT
B=build-gpu
[ $BUILD_ONLY = 1 ] && B="$OUT/build-gpu" # CI's: not the tree's build-gpu/, which may be one to carry
# One deadline for everything (seconds from the start; the whole must end
# before 8 minutes): lim N is N or what is left before it, whichever is
# smaller; run_to N CMD... runs CMD under that limit (-k: killed if it
# ignores the TERM), or skips it (exit 125, said: not a failure) when under
# 15 s are left.
DEADLINE=${GW_CHECK_DEADLINE:-450}
# GW_CHECK_SKIP: names of steps to leave out (a rerun in the device time that
# is left: what passed before), each a gpu-suite case (n2:grid ...), a gw-perf
# or suite output name (gw-perf-device-n2, model-backend-cudnn ...), reduce-bw,
# or model-bench-TAG, model-bench-torch-TAG, kernel-times-TAG, gw-train-TAG;
# said in the summary.  Use a fresh OUTDIR: the summary's tables read every
# CSV there, a skipped step's from an earlier run too.
# GW_CHECK_ONLY: the names of the only steps to run (the same names; the
# build always runs), e.g. the last section's when the deadline cut it.
# (Names may be split by any white space, newlines included.)
words() { printf ' %s ' "$(printf '%s' "$1" | tr -s '[:space:]' ' ')"; }
# Besides those, what earlier checks settled (docs/gpu.md's figures) is left
# out: the device ring's copies by kernel against the copy engine, 1 MiB
# chunks, the flags as kernels, staging against the ring for small
# operations, the TF32 and unfused comparisons, gw-train with --host-step and
# the NCHW kernel times; GW_CHECK_ALL=1 runs them too, and a name in
# GW_CHECK_ONLY runs it.
SETTLED="gw-perf-device-n2-ce gw-perf-device-allgather-n2 gw-perf-device-allgather-n2-ce gw-perf-device-n2-chunk1m
  gw-perf-device-n4-ringonly gw-perf-device-n2-flagkernel model-bench-tf32 model-bench-torch-tf32
  model-bench-bf16-nofuse gw-train-n2-hoststep kernel-times-bf16"
[ "${GW_CHECK_ALL:-0}" = 1 ] && SETTLED=
SKIP=$(words "${GW_CHECK_SKIP:-}") SETTLED=$(words "$SETTLED") ONLY=$(words "${GW_CHECK_ONLY:-}")
only() { # NAME: not left out by GW_CHECK_ONLY (silently)
  [ -z "${ONLY// /}" ] && return 0
  case "$ONLY" in *" $1 "*) return 0 ;; esac
  return 1
}
want() { # NAME: to run (what GW_CHECK_SKIP or SETTLED leaves out is said)
  only "$1" || return 1
  case "$SKIP" in *" $1 "*) say "left out (GW_CHECK_SKIP): $1"; return 1 ;; esac
  case "$ONLY" in *" $1 "*) return 0 ;; esac
  case "$SETTLED" in *" $1 "*) say "left out (settled before; GW_CHECK_ALL=1 runs it): $1"; return 1 ;; esac
  return 0
}
lim() { local l=$((DEADLINE - $(elapsed))); if [ "$l" -lt "$1" ]; then echo "$l"; else echo "$1"; fi; }
run_to() {
  local l
  l=$(lim "$1")
  shift
  if [ "$l" -lt 15 ]; then say "skipped for time (at $(elapsed) s): $*"; return 125; fi
  # in the background of a wait: a TERM's trap runs at once (not after the step)
  timeout -k 5 "$l" "$@" &
  STEP_PID=$!
  wait "$STEP_PID"
  local rc=$?
  STEP_PID=
  return $rc
}

STAMP=$(source_stamp)
say "# gradwire GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), sources $STAMP"
[ $BUILD_ONLY = 1 ] || say "gpu: $(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
say "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | tail -1)"
[ $BUILD_ONLY = 1 ] || say "torch: $(timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null || echo none)"

# ---- 1. build ----------------------------------------------------------------------
MESON=(meson)
command -v meson >/dev/null || MESON=(python3 -m mesonbuild.mesonmain)
if ! command -v ninja >/dev/null; then
  NINJA_DIR=$(python3 -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null)
  export PATH="$PATH:$NINJA_DIR"
fi
command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
# cuDNN and cuBLAS: in the toolkit, or else in PyTorch's pip wheels (nvidia/*/lib
# holds only libcudnn.so.9 and the like, no unversioned names to link with): a
# directory of links to them, given to meson as extra_cuda_libs and to the
# loader as LD_LIBRARY_PATH.
EXTRA_OPT=()
TORCH_LDLP=${LD_LIBRARY_PATH:-} # PyTorch runs with the caller's: its wheels' cudart, not the toolkit's
cuda_extra() {
  # outside the source tree (meson refuses include directories inside it)
  local top lib f d x="${TMPDIR:-/tmp}/gradwire-cuda-extra" sp dirs=
  top=$(cd "$(dirname "$(command -v nvcc)")/.." 2>/dev/null && pwd)
  [ -e "$top/lib64/libcudnn.so" ] && [ -e "$top/lib64/libcublas.so" ] && return 0
  sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  rm -rf "$x" && mkdir -p "$x/include" "$x/lib" || return 0
  for lib in cudnn cublas; do
    [ -e "$top/lib64/lib$lib.so" ] && continue
    # shellcheck disable=SC2086
    f=$(find $sp -path '*nvidia*' -name "lib$lib.so*" 2>/dev/null | sort | head -1)
    [ -n "$f" ] || continue
    d=$(dirname "$f")
    # only this library's own files (CUDA 13 wheels keep every CUDA library and
    # header in one nvidia/cu13 directory: cudart from there would shadow the
    # toolkit's)
    ln -sf "$d"/lib"$lib"* "$x/lib/" && ln -sf "$f" "$x/lib/lib$lib.so"
    [ "$lib" = cublas ] && [ -e "$d/libcublasLt.so.13" ] && ln -sf "$d/libcublasLt.so.13" "$x/lib/libcublasLt.so"
    [ -d "$d/../include" ] && for h in "$d/../include/$lib"*.h; do [ -e "$h" ] && ln -sf "$h" "$x/include/"; done
    dirs="$dirs:$d"
  done
  # The links first, then the toolkit's own libraries (the binaries' cudart:
  # LD_LIBRARY_PATH goes before their RUNPATH, and the CUDA 13 wheels'
  # directory holds a libcudart.so.13 too), the wheels' directories last (what
  # cuDNN loads at run time that the links lack, nvrtc and the like).
  [ -n "$dirs" ] && export LD_LIBRARY_PATH="$x/lib:$top/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}$dirs"
  EXTRA_OPT=(-Dextra_cuda_libs="$x")
  say "cuda extra: $(ls "$x/lib" | grep -E '^lib(cudnn|cublas)\.so$' | tr '\n' ' ')from $sp"
}
cuda_extra
runs_here() {
  local bins=("$B/test/test_device" "$B/tools/gw-perf" "$B/bench/gpu_reduce_bw" "$B/test/test_model_backend"
              "$B/test/test_model_bf16" "$B/test/test_model_torch" "$B/bench/model_bench" "$B/tools/gw-train")
  for b in "${bins[@]}"; do [ -x "$b" ] || return 1; done
  # the cudnn backend's module, which the model's programs load when asked
  [ -e "$B/model/libgwcudnn.so" ] || return 1
  ! ldd "${bins[@]}" "$B/model/libgwcudnn.so" 2>&1 | grep -q "not found" || return 1
  # built from these sources (a stale carried build tested old code)
  [ "$(cat "$B/.gw-source-stamp" 2>/dev/null)" = "$STAMP" ] || { say "build: the carried $B was built from other sources"; return 1; }
  # a case that needs no IPC (pidfd_getfd, which a container may forbid)
  GW_DEV_EMULATE=1 CK_RUN_CASE=misuse timeout 60 "$B/test/test_device" >/dev/null 2>&1
}
build_fail=0
# The kernels for one target (-Dgpu_arch): here the lent GPU's machine code
# (its compute capability, as nvidia-smi says it), in --build-only compute_90
# PTX (CI: the plain pass compiled every target of the default already; a
# device pass per target, 40 s of nvcc there).
if [ $BUILD_ONLY = 1 ]; then
  EXTRA_OPT+=(--werror -Dgpu_arch=compute_90)
else
  # (the default where nvcc cannot compile for it or nvidia-smi does not say)
  cc=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [[ $cc =~ ^[0-9]+$ ]] && nvcc --list-gpu-code 2>/dev/null | grep -qx "sm_$cc" && EXTRA_OPT+=(-Dgpu_arch=sm_$cc)
fi
if [ $BUILD_ONLY = 0 ] && runs_here; then
  say "build: the carried $B runs here"
else
  [ -d "$B" ] && [ $BUILD_ONLY = 0 ] && say "build: the carried $B does not run here; building"
  rm -rf "$B"
  # -k0: a target that fails to compile (a warning the lent machine's compiler
  # adds, -Werror) costs that target only; what was built runs.
  if ! run_to 120 "${MESON[@]}" setup "$B" -Druntime_only=true -Dmini_check=true -Dbuildtype=release -Dcuda=enabled \
      -Dibverbs=disabled -Donednn=disabled "${EXTRA_OPT[@]}" >"$OUT/build.txt" 2>&1; then
    tail -30 "$OUT/build.txt"
    say "build: meson setup FAILED after $(elapsed) s (see build.txt)"
    exit 1
  fi
  if ! run_to 240 "${MESON[@]}" compile -C "$B" --ninja-args=-k0 >>"$OUT/build.txt" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.txt" | head -20
    build_fail=1 # the exit status says so, whatever runs after
    say "build: some targets FAILED after $(elapsed) s (see build.txt); running what was built"
  else
    echo "$STAMP" >"$B/.gw-source-stamp"
    say "build: built $B in $(elapsed) s"
  fi
  # gw-run and gw-perf are what every step after this one needs; the others
  # (the suite, the benches, the model) each run when built.
  if [ ! -x "$B/tools/gw-run" ] || [ ! -x "$B/tools/gw-perf" ]; then
    say "build: FAILED: no gw-run / gw-perf"
    exit 1
  fi
fi

if [ $BUILD_ONLY = 1 ]; then
  (trap on_term TERM INT
   export GW_DEV_EMULATE=2 GW_TEST_NRANKS=2 CK_RUN_CASE=misuse
   run_to 120 "$B/test/test_device") >"$OUT/misuse-emulated.txt" 2>&1
  rc=$?
  say "the device suite's misuse case on the emulator, through mini_check: exit $rc: $(grep -E 'Checks:' "$OUT/misuse-emulated.txt" | tail -1)"
  [ $rc = 0 ] || tail -20 "$OUT/misuse-emulated.txt"
  exit $((build_fail || rc != 0))
fi

# ---- 2. the GPU suite ------------------------------------------------------------------
suite_fail=0
verdict() { # RC: a suite's word for it (skipped is not passed)
  case $1 in 0) echo passed ;; 77) echo SKIPPED ;; 125) echo "skipped for time" ;; *) echo "FAILED (exit $1)" ;; esac
}
gpu_case() { # N:CASE; Na:CASE: the stream-ordered device ring (GW_DEV_ASYNC=1); NqK:CASE: the streams
  # in K hardware queues (CUDA_DEVICE_MAX_CONNECTIONS=K; with 1, no device ring); NcK:CASE: device-ring
  # chunks of K KiB (GW_DEV_CHUNK_BYTES; the default 4 MiB leaves most of the grid's sizes one chunk)
  local n=${1%%:*} c=${1#*:} a=0 q= k= t0 rc verdict
  case $n in *c*) k=${n#*c} n=${n%%c*} ;; esac
  case $n in *q*) q=${n#*q} n=${n%%q*} ;; esac
  case $n in *a) a=1 n=${n%a} ;; esac
  local sfx=
  [ $a = 1 ] && sfx=-async
  [ -n "$q" ] && sfx=$sfx-q$q
  [ -n "$k" ] && sfx=$sfx-c$k
  local name=n$n$sfx:$c
  want "$name" || return 0
  t0=$(date +%s)
  (trap on_term TERM INT
   export GW_TEST_NRANKS=$n CK_RUN_CASE=$c GW_DEV_ASYNC=$a
   [ -n "$q" ] && export CUDA_DEVICE_MAX_CONNECTIONS=$q
   [ -n "$k" ] && export GW_DEV_CHUNK_BYTES=$((k * 1024))
   run_to 60 "$B/test/test_device") >"$OUT/gpu-suite-${name/:/-}.txt" 2>&1
  rc=$?
  verdict=$(verdict $rc)
  [ $rc = 0 ] || [ $rc = 125 ] || suite_fail=1
  say "gpu suite, $n ranks$([ $a = 1 ] && echo ", stream-ordered")$([ -n "$q" ] && echo ", $q hardware queue(s)")$([ -n "$k" ] && echo ", $k KiB chunks"), $c: $verdict in $(($(date +%s) - t0)) s: $(grep -E 'Checks:' "$OUT/gpu-suite-${name/:/-}.txt" | tail -1)"
  [ $rc = 0 ] || tail -20 "$OUT/gpu-suite-${name/:/-}.txt"
}
# Every case at 2 ranks, each under its own limit (a hang costs that case
# only), the stream-ordered ring's (Na: GW_DEV_ASYNC=1; never run on a GPU
# before) beside the synchronized ring's, the hardware-queue cases (NqK:
# CUDA_DEVICE_MAX_CONNECTIONS=K), the grid at 3 and 4, and dead-peer last (a
# rank killed mid-operation must not cost the grids if it leaves the device
# in a bad state; the 4-rank dead-midop cases come at the very end).
if [ -x "$B/test/test_device" ]; then
  for run in 2:grid 2a:grid 2:ordering 2:streams 2a:streams 2:queues 2aq2:queues 2q1:ordering 2:misuse 2:destroy \
             2:bucketer 2:ipc 2:teardown 3:grid 4:grid 3a:grid 2:dead-peer; do
    gpu_case "$run"
  done
else
  suite_fail=1
  say "gpu suite: test_device was not built (see build.txt)"
fi

# ---- 3. gw-perf on device buffers --------------------------------------------------------
perf_fail=0
perf() { # NAME RANKS ENV ARGS... (ENV: VAR=value, or - for none)
  local name=$1 n=$2 envv=$3
  shift 3
  want "$name" || return 0
  [ "$envv" = - ] && envv=GW_UNUSED=0
  (trap on_term TERM INT; export "${envv?}"; run_to 60 "$B/tools/gw-run" -n "$n" "$B/tools/gw-perf" -b 4 -e 256M -f 4 -n 10 -w 2 "$@" \
    --csv "$OUT/$name.csv") >"$OUT/$name.txt" 2>&1
  local rc=$?
  [ $rc = 0 ] || [ $rc = 125 ] || perf_fail=1
  [ $rc = 125 ] && { say "$name: skipped for time"; return 0; }
  say "$name: exit $rc, $(grep -E 'Out of bounds|Avg bus' "$OUT/$name.txt" | sed 's/^\[0\] # //' | tr '\n' ' ')"
}
perf gw-perf-device-n2 2 - -D                     # the device ring (CUDA IPC)
perf gw-perf-device-n4 4 - -D
# The stream-ordered ring (GW_DEV_ASYNC=1) up to 64 MiB: gw-perf queues its
# 10 operations back to back, and at 256 MiB their launches pass CUDA's
# queue (the caller then waits in the driver; step 6 shows that at the end).
perf gw-perf-device-n2-async 2 GW_DEV_ASYNC=1 -D -e 64M
perf gw-perf-device-n4-async 4 GW_DEV_ASYNC=1 -D -e 64M
perf gw-perf-device-staged-n2 2 GW_DEV_IPC=0 -D   # through pinned host staging
perf gw-perf-host-n2 2 - 
# The device ring's copies: a kernel (default: a forwarded chunk read once for
# its two destinations) against the copy engine, on allreduce and on allgather
# (all copies); docs/gpu.md says which is the default and why.
perf gw-perf-device-n2-ce 2 GW_DEV_COPY_ENGINE=1 -D
perf gw-perf-device-allgather-n2 2 - -D -C allgather
perf gw-perf-device-allgather-n2-ce 2 GW_DEV_COPY_ENGINE=1 -D -C allgather
# Chunks of 1 MiB instead of 4 (the default): a stream synchronization and a
# header per chunk, so bigger chunks amortize the host's part at large sizes.
perf gw-perf-device-n2-chunk1m 2 GW_DEV_CHUNK_BYTES=1048576 -D
# Small operations through host staging (the default under 64 KiB) against the
# ring for every size, at 4 ranks, where the ring's 6 steps cost the most.
perf gw-perf-device-n4-ringonly 4 GW_DEV_RING_MIN_BYTES=0 -D
# The stream flags as kernels instead of stream memory operations (the
# default): small sizes only, since every step then waits a time slice.
perf gw-perf-device-n2-flagkernel 2 GW_DEV_FLAG_KERNEL=1 -D -e 1M

# ---- 4. the reduction kernel against a device-to-device copy ----------------------------------
if ! want reduce-bw; then
  :
elif [ -x "$B/bench/gpu_reduce_bw" ]; then
  run_to 60 "$B/bench/gpu_reduce_bw" --csv "$OUT/reduce-bw.csv" >"$OUT/reduce-bw.txt" 2>&1
  rc=$?
  [ $rc = 0 ] || [ $rc = 125 ] || perf_fail=1
  say "reduce kernel bench: exit $rc"
  cat "$OUT/reduce-bw.txt"
else
  say "reduce kernel bench: not built (see build.txt)"
fi

# ---- 5. the cudnn backend ----------------------------------------------------------------------
model_fail=0
bench_fail=0 # a benchmark or gw-train that did not exit 0
bench_rc() { # RC: counts a failure (not in a $(...): a subshell's variables are lost)
  [ "$1" = 0 ] || [ "$1" = 125 ] || bench_fail=1
}
suite() { # NAME TITLE LIMIT COMMAND...: a test suite's verdict (skipped is not passed)
  local name=$1 title=$2 limit=$3 t0 rc
  shift 3
  want "$name" || return 0
  t0=$(date +%s)
  run_to "$limit" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  [ $rc = 0 ] || [ $rc = 125 ] || model_fail=1
  say "$title: $(verdict $rc) in $(($(date +%s) - t0)) s: $(grep -E 'Checks:|resnet18 on|against PyTorch|patterns widened' "$OUT/$name.txt" | tr '\n' ' ')"
  [ $rc = 0 ] || tail -20 "$OUT/$name.txt"
}
budget() { # SECONDS WHAT: whether this many are left before the deadline, else say what is skipped
  [ $(($(elapsed) + $1)) -le "$DEADLINE" ] && return 0
  say "skipped for time (at $(elapsed) s): $2"
  return 1
}
BATCH=${GW_CHECK_BATCH:-256}
mb=(--batch "$BATCH" --steps 8 --warmup 2)
# With --profile 1 in OPTIONS, one more step is profiled after the timed ones
# (per kind of layer for gradwire, per operator/kernel for PyTorch): the tables
# go into the summary too, to show where the two differ.
bench_gw() { # TAG OPTIONS: model_bench on cudnn
  want "model-bench-$1" || return 0
  budget 45 "model_bench $2" || return 0
  # shellcheck disable=SC2086
  run_to 100 "$B/bench/model_bench" --backend cudnn $2 "${mb[@]}" >"$OUT/model-bench-$1.txt" 2>&1
  local rc=$?
  bench_rc $rc
  say "model_bench cudnn ($2): exit $rc $(tail -1 "$OUT/model-bench-$1.txt")"
  grep '^host per step' "$OUT/model-bench-$1.txt" | tee -a "$OUT/summary.txt"
  sed -n '/^profile/,/slowest layers/p' "$OUT/model-bench-$1.txt" | tee -a "$OUT/summary.txt"
}
bench_torch() { # TAG OPTIONS: the same network in PyTorch on the same GPU
  want "model-bench-torch-$1" || return 0
  budget 45 "model_bench_torch $2" || return 0
  # shellcheck disable=SC2086
  run_to 100 env LD_LIBRARY_PATH="$TORCH_LDLP" python3 bench/model_bench_torch.py --device cuda $2 "${mb[@]}" >"$OUT/model-bench-torch-$1.txt" 2>&1
  local rc=$?
  bench_rc $rc
  say "model_bench_torch ($2): exit $rc $(tail -1 "$OUT/model-bench-torch-$1.txt")"
  awk '/^profile/ { on = 1 } /^pytorch / { on = 0 } on' "$OUT/model-bench-torch-$1.txt" | tee -a "$OUT/summary.txt"
}
train() { # RANKS [--host-step]: gw-train on synthetic ImageNet-sized data, NHWC (gw-train's default on cudnn with --amp);
  # TRAIN_TAG=-x in the environment: a variant's suffix (its settings in the environment too)
  local n=$1 tag=n$1${2:+-hoststep}${TRAIN_TAG:-}
  want "gw-train-$tag" || return 0
  budget 60 "gw-train $*" || return 0
  rm -f "$OUT/gw-train-$tag.jsonl"
  # shellcheck disable=SC2086
  run_to 120 "$B/tools/gw-run" -n "$n" "$B/tools/gw-train" --backend cudnn --amp bf16 --data synthetic \
    --image-size 224 --classes 1000 --synthetic-samples 20000 --batch $((BATCH / n)) --steps 20 --no-eval \
    --loader-threads 6 --metrics "$OUT/gw-train-$tag.jsonl" ${2:-} >"$OUT/gw-train-$tag.txt" 2>&1
  local rc=$?
  bench_rc $rc
  say "gw-train cudnn --amp bf16 ${2:-}, $n rank(s) x batch $((BATCH / n)): exit $rc"
}
kernel_times() { # TAG OPTIONS: GPU time per call site over 3 steps of model_bench (GW_CUDNN_KERNEL_TIMES)
  want "kernel-times-$1" || return 0
  budget 60 "kernel times $2" || return 0
  # shellcheck disable=SC2086
  run_to 90 env GW_CUDNN_KERNEL_TIMES=1 "$B/bench/model_bench" --backend cudnn $2 --batch "$BATCH" --steps 2 --warmup 1 \
    >"$OUT/kernel-times-$1.txt" 2>&1
  local rc=$?
  bench_rc $rc
  say "GPU time per call site, model_bench cudnn $2, 3 steps (exit $rc; GW_CUDNN_KERNEL_TIMES, top 25):"
  sed -n '/^kernel times/,$p' "$OUT/kernel-times-$1.txt" | head -26 | tee -a "$OUT/summary.txt"
  # NHWC batch norm's sums: each shape's timed plans (the rules' plan in
  # variant 0, the chosen one, each variant's best), summed once per shape
  # (a shape called several times a step counts once here)
  grep '^bn sums NHWC tuned' "$OUT/kernel-times-$1.txt" >"$OUT/bn-plans-$1.txt"
  if [ -s "$OUT/bn-plans-$1.txt" ]; then
    awk -F ' [|] ' '{ split($2, d, " "); split($3, c, " "); nb = split($4, b, " "); rules += d[5]; chosen += c[5]
        n[c[4]]++; for (i = 4; i + 1 <= nb; i += 2) best[b[i]] += b[i + 1] }
      END { printf "bn sums NHWC plans over %d shapes: rules %.0f us, chosen %.0f us (%.2fx); best per variant",
              NR, rules, chosen, (chosen > 0 ? rules / chosen : 0)
            for (i = 0; i < 3; i++) printf " v%d %.0f", i, best["v" i]
            printf " us; chosen"; for (i = 0; i < 3; i++) printf " v%d: %d", i, n["v" i]; printf "\n" }' "$OUT/bn-plans-$1.txt" |
      tee -a "$OUT/summary.txt"
  fi
}
if [ -x "$B/test/test_model_backend" ] && [ -x "$B/bench/model_bench" ]; then
  # Most wanted first (the deadline cuts the tail): issue 10's comparison,
  # the suites, one gw-train run, the other comparisons, then the gains of
  # the fusion and the layout and the other gw-train runs.
  # NHWC first: gw-train's default on cudnn with --amp (1.11x NCHW on the H200, 2026-12-04)
  bench_gw bf16-nhwc "--act bf16 --layout nhwc --profile 1"
  bench_torch bf16 "--tf32 1 --channels-last --amp bf16 --profile 1"
  bench_gw bf16 "--act bf16 --layout nchw --profile 1"
  suite cudnn-cast-gpu "16-bit conversions of our kernels on the device, bit for bit against the host's" 60 \
    "$B/test/test_cudnn_cast_gpu"
  suite model-backend-cudnn "model backend suite on cudnn" 90 "$B/test/test_model_backend" cudnn
  suite model-backend-cudnn-nhwc "model backend suite on cudnn, NHWC" 90 "$B/test/test_model_backend" cudnn nhwc
  suite model-bf16-cudnn "bfloat16 suite on cudnn" 60 "$B/test/test_model_bf16" cudnn
  suite model-fp16-cudnn "float16 suite on cudnn" 60 "$B/test/test_model_bf16" cudnn fp16
  suite model-torch-cudnn "ResNets on cudnn against PyTorch's fixture (3 SGD steps)" 60 \
    env GW_FIXTURES=test/fixtures "$B/test/test_model_torch" cudnn
  suite model-torch-cudnn-nhwc "the same, NHWC" 60 env GW_FIXTURES=test/fixtures "$B/test/test_model_torch" cudnn nhwc
  train 1
  train 2
  # gw-train at 2 ranks with its buckets on the stream-ordered ring (beside gw-train-n2)
  TRAIN_TAG=-async GW_DEV_ASYNC=1 train 2
  kernel_times bf16-nhwc "--act bf16 --layout nhwc"
  bench_gw fp16 "--act fp16 --layout nchw"
  bench_gw fp16-nhwc "--act fp16 --layout nhwc"
  kernel_times fp16-nhwc "--act fp16 --layout nhwc"
  # what the NHWC sums' timed plans gain: the rules' plans in variant 0 (as before 2026-12-04 evening)
  GW_BN_NHWC_KERNEL=0 bench_gw bf16-nhwc-v0 "--act bf16 --layout nhwc"
  bench_torch fp16 "--tf32 1 --channels-last --amp fp16"
  kernel_times bf16 "--act bf16 --layout nchw"
  bench_gw tf32 "--tf32 1"
  bench_torch tf32 "--tf32 1"
  bench_gw bf16-nofuse "--act bf16 --layout nchw --no-fuse"
  train 2 --host-step
  # What splitting small grids' batch-norm sums over several blocks gains
  # (NHWC, one block per piece as before 2026-12-01).
  GW_BN_NHWC_GROUPS=1 bench_gw bf16-nhwc-g1 "--act bf16 --layout nhwc"
else
  say "cudnn backend: not built here (no cuDNN/cuBLAS found: see build.txt)"
fi

# ---- 6. what may leave a process or the device in a bad state, last -----------------------------
# A rank killed in the middle of an operation at 4 ranks, synchronized and
# stream-ordered (the survivors' streams run out their work into the dead
# rank's IPC-mapped memory: not yet seen on a GPU); the stream-ordered ring
# at 256 MiB with gw-perf's 10 operations queued back to back (past CUDA's
# queue: the caller waits in the driver for room while the progress thread
# still makes CUDA calls); what the deadline leaves no room for is said.
if [ -x "$B/test/test_device" ]; then
  # the other hardware-queue cases: the grid through staging with one queue,
  # the synchronized ring's queues case with two
  only n2-q1:grid && budget 45 "gpu suite case 2q1:grid" && gpu_case 2q1:grid
  only n2-q2:queues && budget 45 "gpu suite case 2q2:queues" && gpu_case 2q2:queues
  # one hardware queue with the stream-ordered ring (Megatron's
  # CUDA_DEVICE_MAX_CONNECTIONS=1 with GW_DEV_ASYNC=1): the ring is kept there
  # now (all of an operation's work on the caller's stream); never run on a GPU
  only n2-async-q1:ordering && budget 45 "gpu suite case 2aq1:ordering" && gpu_case 2aq1:ordering
  # the grid on device-ring chunks of 256 KiB: most of its sizes in several
  # chunks (the emulator suites' 64 KiB chunks hid a refused chunk size that
  # the shipped 4 MiB met), synchronized at 3 ranks and stream-ordered at 2
  only n3-c256:grid && budget 45 "gpu suite case 3c256:grid" && gpu_case 3c256:grid
  only n2-async-c256:grid && budget 45 "gpu suite case 2ac256:grid" && gpu_case 2ac256:grid
  only n4:dead-midop && budget 45 "gpu suite case 4:dead-midop" && gpu_case 4:dead-midop
  only n4-async:dead-midop && budget 45 "gpu suite case 4a:dead-midop" && gpu_case 4a:dead-midop
fi
only gw-perf-device-n4-async-256m && budget 45 "gw-perf-device-n4-async-256m" &&
  perf gw-perf-device-n4-async-256m 4 GW_DEV_ASYNC=1 -D -b 64M
# Last: the device ring forced on with one hardware queue (GW_DEV_QUEUES=8 with
# CUDA_DEVICE_MAX_CONNECTIONS=1), 20 s: expected to fail, the probe finding no
# engine stream that runs while the caller's stream waits (all share its one
# queue; about 9 s), or to hang: either shows the hazard the defaults avoid
# is real on this GPU.  timeout kills the ranks' whole process group.
if [ -x "$B/test/test_device" ] && want one-queue-ring && budget 25 "one-queue-ring"; then
  (trap on_term TERM INT
   export GW_TEST_NRANKS=2 CK_RUN_CASE=ordering CUDA_DEVICE_MAX_CONNECTIONS=1 GW_DEV_QUEUES=8
   run_to 20 "$B/test/test_device") >"$OUT/one-queue-ring.txt" 2>&1
  rc=$?
  say "device ring forced on with one hardware queue (expected to fail or hang): $([ $rc = 0 ] && echo "passed: the queues did not serialize the streams" || echo "$([ $rc = 124 ] || [ $rc = 137 ] && echo hung || echo "failed (exit $rc)"), as expected: $(grep -o 'none of the [0-9]* engine streams runs[^(]*' "$OUT/one-queue-ring.txt" | head -1)")"
fi

# ---- summary: finish(), at the exit ------------------------------------------------------------
exit $((suite_fail || model_fail || perf_fail || bench_fail || build_fail))
