#!/usr/bin/env bash
# mpirun_launch.sh GW_PERF - launching under Open MPI's mpirun instead of gw-run:
# gw_comm_init_env takes the rank, world size and local rank from
# OMPI_COMM_WORLD_* and the job's identity from PMIX_NAMESPACE, the master from
# GW_MASTER_ADDR/PORT passed with -x.  3 ranks run gw-perf's checked allreduce
# (every result compared: "#wrong" 0, exit 0); without a master address each rank
# fails at once with a message saying what to set (no hang).  Exits 77
# (skipped) without mpirun.
set -u
perf=${1:?usage: mpirun_launch.sh GW_PERF}
command -v mpirun >/dev/null || { echo "mpirun not found: skipped"; exit 77; }
mpi=(mpirun --oversubscribe -n 3)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(timeout 120 "${mpi[@]}" -x GW_MASTER_ADDR=127.0.0.1 -x GW_MASTER_PORT="$port" \
      "$perf" -b 8 -e 4M -f 8 -n 2 -w 1 -o all 2>&1)
rc=$?
echo "$out" | tail -5
[ $rc = 0 ] || { echo "FAIL: gw-perf under mpirun exited $rc"; exit 1; }
echo "$out" | grep -q "nranks 3\|3 ranks" || { echo "FAIL: the job did not have 3 ranks"; echo "$out" | head -5; exit 1; }
echo "$out" | grep -q "Out of bounds values : 0 OK" || { echo "FAIL: wrong results under mpirun"; exit 1; }
out=$(timeout 60 "${mpi[@]}" "$perf" -b 8 -e 8 -n 1 -w 0 2>&1)
rc=$?
[ $rc = 124 ] && { echo "FAIL: without a master address mpirun hung"; exit 1; }
[ $rc != 0 ] || { echo "FAIL: without a master address it succeeded"; exit 1; }
echo "$out" | grep -q "no master address; set GW_MASTER_ADDR and GW_MASTER_PORT" ||
  { echo "FAIL: no message naming the missing master address:"; echo "$out" | head -5; exit 1; }
echo "mpirun launch: 3 ranks checked, missing master refused"
