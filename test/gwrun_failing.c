/* gwrun_failing.c - a rank for gw-run's tests of naming the rank a job's
 * failure began at (tools/gw-run-cause.c).
 *
 * Every rank joins (gw_comm_init_env) and passes a barrier.  Then rank
 * GWF_RANK (default 1) gives up on its own: with GWF_RECORD=1 it first
 * records "rank R: bad input (gwrun_failing)" (gw_record_failure); it aborts
 * its communicator and calls an allreduce, which fails and tells the others
 * (the library records that abort as this rank's own failure, unless the
 * program's record came first), then takes GWF_LINGER seconds (default 3)
 * before exiting 1, as a program cleaning up or saving would.  The others
 * call one allreduce, which fails with the notice, and exit 1 at once: gw-run
 * sees them fail first.
 *
 * GWF_DIE_WHEN_GONE=FILE instead: a rank a long time dying, as the kernel
 * sees it.  Its main thread ends at once (the process is then "exiting"
 * until its last thread is); another waits for that, makes the file
 * GWF_DIE_MARK, then waits for FILE to hold a pid and for that process to be
 * gone (collected by gw-run), and kills this one with SIGKILL at once.  No
 * communicator. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradwire.h"

static char main_state(void) {
  char path[64], st[512] = "";
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)getpid());
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  const size_t n = fread(st, 1, sizeof st - 1, f);
  fclose(f);
  st[n] = 0;
  const char *p = strrchr(st, ')');
  return p && p[1] && p[2] ? p[2] : '?';
}

static void *die_late(void *arg) {
  for (int i = 0; i < 5000 && main_state() != 'Z'; i++) usleep(1000);
  const char *mark = getenv("GWF_DIE_MARK");
  if (mark) close(open(mark, O_CREAT | O_WRONLY, 0644));
  long pid = 0;
  for (int i = 0; i < 20000 && pid <= 0; i++) { /* 20 s at most */
    FILE *f = fopen(arg, "r");
    if (!f || fscanf(f, "%ld", &pid) != 1) pid = 0;
    if (f) fclose(f);
    if (pid <= 0) usleep(1000);
  }
  for (int i = 0; i < 20000 && pid > 0 && kill((pid_t)pid, 0) == 0; i++) usleep(1000);
  kill(getpid(), SIGKILL);
  return NULL;
}

int main(void) {
  if (getenv("GWF_DIE_WHEN_GONE")) {
    pthread_t t;
    if (pthread_create(&t, NULL, die_late, getenv("GWF_DIE_WHEN_GONE")) != 0) return 2;
    pthread_exit(NULL);
  }
  gw_comm_t comm;
  if (gw_comm_init_env(&comm) != GW_SUCCESS) {
    fprintf(stderr, "gwrun_failing: init: %s\n", gw_comm_last_error(NULL));
    return 2;
  }
  int rank = -1;
  gw_comm_rank(comm, &rank);
  const int victim = getenv("GWF_RANK") ? atoi(getenv("GWF_RANK")) : 1;
  const double linger = getenv("GWF_LINGER") ? atof(getenv("GWF_LINGER")) : 3;
  if (gw_barrier(comm) != GW_SUCCESS) {
    fprintf(stderr, "gwrun_failing: rank %d: barrier: %s\n", rank, gw_comm_last_error(comm));
    return 2;
  }
  float x = 1;
  if (rank == victim) {
    char why[128];
    snprintf(why, sizeof why, "rank %d: bad input (gwrun_failing)", rank);
    if (getenv("GWF_RECORD") && atoi(getenv("GWF_RECORD"))) gw_record_failure(why, 1);
    fprintf(stderr, "%s; giving up\n", why);
    gw_comm_abort(comm);
    gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL); /* fails: the others hear of it */
    usleep((useconds_t)(linger * 1e6));
    gw_comm_destroy(comm);
    return 1;
  }
  const gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL);
  fprintf(stderr, "gwrun_failing: rank %d: allreduce: %s: %s\n", rank, gw_strerror(r), gw_comm_last_error(comm));
  gw_comm_destroy(comm);
  return r == GW_SUCCESS ? 0 : 1;
}
