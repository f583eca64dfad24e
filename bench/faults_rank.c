/* faults_rank.c - one rank of a fault-injection run of bench/faults.sh.
 *
 * What it is: a small program on the public API (gradwire.h only) that joins a
 * job through gw_comm_init_env, plays its part in one fault scenario, and writes
 * down, on CLOCK_MONOTONIC (one clock for every process of this machine, also
 * across network namespaces), the moment of the fault (the faulting rank writes
 * it just before the fault) and the moment its own gradwire call returned the
 * error, with the result code and gw_comm_last_error().  faults.sh starts four of
 * these as plain processes (not under gw-run, whose teardown would stop the
 * survivors before they report), reads the files and prints the table.
 *
 * What it is not: a test.  It judges nothing; it records what happened.
 *
 * usage: faults_rank now     print CLOCK_MONOTONIC seconds (for the script's own faults)
 *        faults_rank port    print a free TCP port on 127.0.0.1
 *        faults_rank run     play FAULTS_SCENARIO (see below) as rank GW_RANK
 *
 * Scenarios (FAULTS_SCENARIO) and their parameters (environment):
 *   kill-busy   every rank loops allreduces of FAULTS_COUNT float32; FAULTS_DELAY s
 *               after the first one finished, FAULTS_VICTIM kills itself (SIGKILL)
 *               from a second thread while its main thread is inside an allreduce
 *   stop        as kill-busy, but the victim stops itself (SIGSTOP: every
 *               thread, as a debugger or Ctrl-Z would) instead of dying; it
 *               writes no report (whoever started it must SIGCONT or kill it)
 *   kill-idle   after a barrier the others call one allreduce; the victim sleeps
 *               FAULTS_DELAY s outside any call and kills itself
 *   straggler   after a barrier the victim never calls (it stays alive, sleeping
 *               FAULTS_LATE s or until every other rank wrote rank.R, then calls
 *               late); the others call one allreduce;
 *               the fault moment is when the victim should have called
 *   abort       after a barrier rank FAULTS_VICTIM calls no collective for
 *               FAULTS_LATE s (so the others wait), rank 0 calls gw_comm_abort
 *               from a second thread FAULTS_DELAY s after entering its allreduce
 *   mismatch    after a barrier everyone calls allreduce of FAULTS_COUNT float32,
 *               except rank 1 (twice the count) and rank 3 (float64); the fault
 *               moment is the first entry of rank 1 or 3 into that call
 *   loop        every rank loops allreduces of FAULTS_COUNT float32 and writes
 *               started.R after the first; the script makes the fault (cuts a link)
 *   late        after a barrier every rank but FAULTS_VICTIM calls one allreduce;
 *               the victim calls it FAULTS_LATE s later (the script cuts a link
 *               meanwhile, so nothing is in flight at the cut)
 * FAULTS_MAX_S bounds the loops (default 60).  Files in FAULTS_DIR:
 *   fault.R     "t<TAB>label" lines: fault moments written by rank R
 *   rank.R      "rank t_return call_s code codename iteration later_code later_name message"
 *               (tab-separated; message with tabs and newlines blanked)
 *   started.R   written by `loop` and `late` ranks once they are past setup
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gradwire.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static double env_d(const char *name, double dflt) {
  const char *v = getenv(name);
  return v && *v ? atof(v) : dflt;
}

static const char *dir;
static int rank = -1, nranks;

/* Appends one line to DIR/NAME.RANK with plain write(2), so it is in the page
 * cache before a SIGKILL that follows. */
static void put_line(const char *name, const char *line) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%d", dir, name, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) {
    fprintf(stderr, "faults_rank %d: cannot write %s: %s\n", rank, path, strerror(errno));
    return;
  }
  size_t len = strlen(line), off = 0;
  while (off < len) {
    ssize_t w = write(fd, line + off, len - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  close(fd);
}

static void mark_fault(double t, const char *label) {
  char line[256];
  snprintf(line, sizeof line, "%.6f\t%s\n", t, label);
  put_line("fault", line);
}

/* The straggler's wait: FAULTS_LATE s, or less once every other rank has
 * written its rank.R line (they reported; nothing it does now can change
 * what they said, and the netns tests then wait no longer than needed). */
static void sleep_until_reported(double late) {
  const double end = now() + late;
  for (;;) {
    int left = 0;
    for (int k = 0; k < nranks; k++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/rank.%d", dir, k);
      if (k != rank && access(path, F_OK) != 0) left++;
    }
    if (!left || now() >= end) return;
    sleep_s(end - now() < 0.05 ? end - now() : 0.05);
  }
}

static void mark_started(void) {
  char line[64];
  snprintf(line, sizeof line, "%.6f\n", now());
  put_line("started", line);
}

/* The rank's report: when its call returned, how long the call itself took, what it
 * returned and said, and what a later call on the same communicator returns. */
static void report(gw_comm_t comm, double t_ret, double call_s, gw_result_t r, long iter) {
  char msg[1024];
  const char *m = r == GW_SUCCESS ? "(no error)" : gw_comm_last_error(comm);
  snprintf(msg, sizeof msg, "%s", m ? m : "(null)");
  for (char *p = msg; *p; p++)
    if (*p == '\t' || *p == '\n' || *p == '\r') *p = ' ';
  gw_result_t later = GW_SUCCESS;
  if (r != GW_SUCCESS) { /* later operations must fail too, and at once */
    float one = 1;
    later = gw_allreduce(&one, &one, 1, GW_FLOAT32, GW_SUM, comm, NULL);
  }
  char line[1400];
  snprintf(line, sizeof line, "%d\t%.6f\t%.6f\t%d\t%s\t%ld\t%d\t%s\t%s\n", rank, t_ret, call_s, (int)r,
           gw_strerror(r), iter, (int)later, gw_strerror(later), msg);
  put_line("rank", line);
}

/* ---- the second threads: a self-kill and an abort ---------------------------- */

static atomic_int in_call;
static atomic_long iteration;

struct killer {
  double delay;
  int sig; /* SIGKILL, or SIGSTOP */
};

static void *kill_later(void *argp) {
  struct killer *k = argp;
  sleep_s(k->delay);
  char label[128];
  snprintf(label, sizeof label, "rank %d %s (main thread in_call=%d, iteration %ld)", rank,
           k->sig == SIGSTOP ? "SIGSTOP" : "SIGKILL", atomic_load(&in_call), atomic_load(&iteration));
  mark_fault(now(), label);
  kill(getpid(), k->sig);
  return NULL;
}

struct aborter {
  gw_comm_t comm;
  double delay;
};

static void *abort_later(void *argp) {
  struct aborter *a = argp;
  sleep_s(a->delay);
  char label[128];
  snprintf(label, sizeof label, "rank %d gw_comm_abort (main thread in_call=%d)", rank, atomic_load(&in_call));
  mark_fault(now(), label);
  gw_result_t r = gw_comm_abort(a->comm);
  if (r != GW_SUCCESS) fprintf(stderr, "faults_rank %d: gw_comm_abort returned %s\n", rank, gw_strerror(r));
  return NULL;
}

/* ---- scenarios ---------------------------------------------------------------- */

static float *big(size_t count) {
  float *b = malloc(count * sizeof *b);
  if (!b) {
    fprintf(stderr, "faults_rank %d: out of memory for %zu floats\n", rank, count);
    exit(3);
  }
  memset(b, 0, count * sizeof *b); /* zeros stay zeros under SUM: no overflow in loops */
  return b;
}

/* One blocking allreduce, timed, with in_call kept for the killer's label. */
static gw_result_t timed_allreduce(void *buf, size_t count, gw_dtype_t dt, gw_comm_t comm, double *t0,
                                   double *t1) {
  *t0 = now();
  atomic_store(&in_call, 1);
  gw_result_t r = gw_allreduce(buf, buf, count, dt, GW_SUM, comm, NULL);
  atomic_store(&in_call, 0);
  *t1 = now();
  return r;
}

/* Loops allreduces until one fails or max_s passes; reports the failing one. */
static int loop_until_error(gw_comm_t comm, size_t count, int victim, int sig, double delay, double max_s) {
  float *buf = big(count);
  double t0, t1, start = now();
  gw_result_t r = timed_allreduce(buf, count, GW_FLOAT32, comm, &t0, &t1);
  if (r != GW_SUCCESS) {
    report(comm, t1, t1 - t0, r, 0);
    return 0;
  }
  mark_started();
  pthread_t th;
  struct killer k = {delay, sig};
  if (rank == victim) pthread_create(&th, NULL, kill_later, &k);
  for (long it = 1;; it++) {
    atomic_store(&iteration, it);
    r = timed_allreduce(buf, count, GW_FLOAT32, comm, &t0, &t1);
    if (r != GW_SUCCESS || t1 - start > max_s) {
      report(comm, t1, t1 - t0, r, it);
      break;
    }
  }
  free(buf);
  return 0;
}

static int barrier_or_report(gw_comm_t comm) {
  double t0 = now();
  gw_result_t r = gw_barrier(comm);
  if (r != GW_SUCCESS) {
    fprintf(stderr, "faults_rank %d: setup barrier failed: %s\n", rank, gw_comm_last_error(comm));
    report(comm, now(), now() - t0, r, -1);
    return 1;
  }
  return 0;
}

static int one_allreduce(gw_comm_t comm, size_t count, gw_dtype_t dt) {
  void *buf = calloc(count, gw_dtype_size(dt));
  if (!buf) return 3;
  double t0, t1;
  gw_result_t r = timed_allreduce(buf, count, dt, comm, &t0, &t1);
  report(comm, t1, t1 - t0, r, 0);
  free(buf);
  return 0;
}

static int run(void) {
  const char *scen = getenv("FAULTS_SCENARIO");
  dir = getenv("FAULTS_DIR");
  if (!scen || !dir) {
    fprintf(stderr, "faults_rank: set FAULTS_SCENARIO and FAULTS_DIR (see the comment at the top)\n");
    return 2;
  }
  size_t count = (size_t)env_d("FAULTS_COUNT", 16 << 20);
  int victim = (int)env_d("FAULTS_VICTIM", 2);
  double delay = env_d("FAULTS_DELAY", 1.0), late = env_d("FAULTS_LATE", 8.0), max_s = env_d("FAULTS_MAX_S", 60);

  gw_comm_t comm;
  gw_result_t r = gw_comm_init_env(&comm);
  if (r != GW_SUCCESS) {
    fprintf(stderr, "faults_rank: gw_comm_init_env failed: %s: %s\n", gw_strerror(r), gw_comm_last_error(NULL));
    return 1;
  }
  gw_comm_rank(comm, &rank);
  gw_comm_size(comm, &nranks);

  int rc = 0;
  if (!strcmp(scen, "kill-busy") || !strcmp(scen, "loop") || !strcmp(scen, "stop")) {
    rc = loop_until_error(comm, count, !strcmp(scen, "loop") ? -1 : victim, !strcmp(scen, "stop") ? SIGSTOP : SIGKILL,
                          delay, max_s);
  } else if (!strcmp(scen, "kill-idle")) {
    if (barrier_or_report(comm)) goto done;
    if (rank == victim) {
      pthread_t th;
      struct killer k = {delay, SIGKILL};
      pthread_create(&th, NULL, kill_later, &k);
      pthread_join(th, NULL); /* never returns: the thread kills the process */
    }
    rc = one_allreduce(comm, count, GW_FLOAT32);
  } else if (!strcmp(scen, "straggler")) {
    if (barrier_or_report(comm)) goto done;
    if (rank == victim) {
      mark_fault(now(), "straggler does not call");
      sleep_until_reported(late);
    }
    rc = one_allreduce(comm, count, GW_FLOAT32);
  } else if (!strcmp(scen, "abort")) {
    if (barrier_or_report(comm)) goto done;
    if (rank == victim) sleep_s(late);
    pthread_t th;
    struct aborter a = {comm, delay};
    if (rank == 0) pthread_create(&th, NULL, abort_later, &a);
    rc = one_allreduce(comm, count, GW_FLOAT32);
    if (rank == 0) {
      pthread_join(th, NULL);
      gw_comm_t solo; /* "a new communicator can be made afterwards" */
      gw_result_t s = gw_comm_init(&solo, 1, 0, NULL);
      float x = 1;
      if (s == GW_SUCCESS) s = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, solo, NULL);
      fprintf(stderr, "faults_rank 0: new communicator after abort: %s\n", gw_strerror(s));
      gw_comm_destroy(solo);
    }
  } else if (!strcmp(scen, "mismatch")) {
    if (barrier_or_report(comm)) goto done;
    size_t c = rank == 1 ? 2 * count : count;
    gw_dtype_t dt = rank == 3 ? GW_FLOAT64 : GW_FLOAT32;
    char label[96];
    snprintf(label, sizeof label, "rank %d enters allreduce(count=%zu, %s)", rank, c, gw_dtype_name(dt));
    if (rank == 1 || rank == 3) mark_fault(now(), label);
    rc = one_allreduce(comm, c, dt);
  } else if (!strcmp(scen, "late")) {
    if (barrier_or_report(comm)) goto done;
    mark_started();
    if (rank == victim) sleep_s(late);
    rc = one_allreduce(comm, count, GW_FLOAT32);
  } else {
    fprintf(stderr, "faults_rank: unknown scenario '%s'\n", scen);
    rc = 2;
  }
done:
  gw_comm_destroy(comm);
  return rc;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    perror("faults_rank port");
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "now")) {
    printf("%.6f\n", now());
    return 0;
  }
  if (!strcmp(mode, "port")) {
    int p = free_port();
    if (p < 0) return 1;
    printf("%d\n", p);
    return 0;
  }
  if (!strcmp(mode, "run")) return run();
  fprintf(stderr, "usage: faults_rank now | port | run   (see bench/faults_rank.c)\n");
  return 2;
}
