/* harness.c - see harness.h. */
#include "harness.h"
#include "ports.h"
#include "comm.h" /* the ring's connections, for body_uses_transport */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int free_port(void) {
  const int port = test_free_ports(1); /* ports.h: from below the ephemeral range */
  if (port < 0) {
    fprintf(stderr, "free_port: no bindable port on 127.0.0.1 below the ephemeral range\n");
    exit(99);
  }
  return port;
}

struct wrap {
  rank_body_fn body;
  void *arg;
};

static int comm_body(int rank, int nranks, const char *master, void *arg) {
  struct wrap *w = arg;
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, nranks, rank, master);
  if (r != GW_SUCCESS) {
    fprintf(stderr, "rank %d: gw_comm_init failed: %s: %s\n", rank, gw_strerror(r), gw_comm_last_error(NULL));
    return 1;
  }
  int rc = w->body(comm, rank, nranks, w->arg);
  gw_comm_destroy(comm);
  return rc;
}

int run_ranks(int nranks, rank_body_fn body, void *arg, double timeout_s) {
  struct wrap w = {body, arg};
  return run_ranks_raw(nranks, comm_body, &w, timeout_s);
}

double test_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int run_ranks_raw(int nranks, raw_body_fn body, void *arg, double timeout_s) {
  char master[64], token[64];
  snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
  snprintf(token, sizeof token, "test-%d-%llx", (int)getpid(), (unsigned long long)mix64((uint64_t)test_now()));
  setenv("GW_JOB_TOKEN", token, 1);
  pid_t *pids = calloc((size_t)nranks, sizeof *pids);
  fflush(NULL);
  for (int r = 0; r < nranks; r++) {
    pid_t p = fork();
    if (p == 0) {
      int rc = body(r, nranks, master, arg);
      fflush(NULL); /* _exit skips stdio: keep what the rank printed */
      _exit(rc);
    }
    pids[r] = p;
  }
  int failed = 0, left = nranks;
  double deadline = test_now() + timeout_s;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < nranks; r++)
        if (pids[r] == p) {
          pids[r] = 0;
          left--;
          if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
          failed++;
          if (WIFSIGNALED(status)) fprintf(stderr, "harness: rank %d killed by signal %d\n", r, WTERMSIG(status));
          else fprintf(stderr, "harness: rank %d exited with %d\n", r, WEXITSTATUS(status));
        }
      continue;
    }
    if (test_now() > deadline) {
      for (int r = 0; r < nranks; r++)
        if (pids[r]) {
          fprintf(stderr, "harness: rank %d still running after %.0f s: killed\n", r, timeout_s);
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          pids[r] = 0;
          failed++;
          left--;
        }
      break;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  free(pids);
  return failed;
}

int body_rank1_killed(gw_comm_t comm, int rank, int n, void *arg) {
  double limit = *(const double *)arg;
  gw_comm_set_timeout(comm, 60);
  int32_t v = 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS && v == n, "first sum");
  if (rank == 1) raise(SIGKILL);
  double t0 = test_now();
  gw_result_t r = gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL);
  double took = test_now() - t0;
  EXPECT(r == GW_ERR_REMOTE, "returned %s after %.1f s: %s", gw_strerror(r), took, gw_comm_last_error(comm));
  EXPECT(took < limit, "took %.1f s to notice", took);
  EXPECT(strstr(gw_comm_last_error(comm), "rank 1"), "message does not name rank 1: %s", gw_comm_last_error(comm));
  return 0;
}

int body_uses_transport(gw_comm_t comm, int rank, int n, void *arg) {
  const char *want = arg;
  (void)n;
  EXPECT(!strcmp(comm->rings[0].send.tp->name, want) && !strcmp(comm->rings[0].recv.tp->name, want),
         "ring uses %s/%s, expected %s", comm->rings[0].send.tp->name, comm->rings[0].recv.tp->name, want);
  int64_t v = rank + 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT64, GW_SUM, comm, NULL) == GW_SUCCESS && v == 6, "sum %lld", (long long)v);
  return 0;
}

int run_in_child(int (*fn)(void *), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int r = fn(arg);
    fflush(NULL);
    _exit(r);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) {
    perror("run_in_child: fork / waitpid");
    return 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr), ran = srunner_ntests_run(sr);
  srunner_free(sr);
  if (!ran) { /* a CK_RUN_CASE that names no case (a typo, a renamed case) ran nothing: no pass */
    const char *c = getenv("CK_RUN_CASE");
    fprintf(stderr, "no test ran%s%s%s\n", c ? " (CK_RUN_CASE=" : "", c ? c : "", c ? " names no case)" : "");
    return 1;
  }
  return failed ? 1 : 0;
}

double test_unit_roundoff(gw_dtype_t dt) {
  switch (dt) {
    case GW_FLOAT16: return 0x1p-11;
    case GW_BFLOAT16: return 0x1p-8;
    case GW_FLOAT32: return 0x1p-24;
    case GW_FLOAT64: return 0x1p-53;
    default: return 0;
  }
}

int test_is_float(gw_dtype_t dt) { return test_unit_roundoff(dt) > 0; }

void test_in_child_with_env(const char *name, const char *value, void (*fn)(void *out, size_t cap), void *out,
                            size_t cap) {
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(p[0]);
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    fn(out, cap);
    _exit(write(p[1], out, cap) == (ssize_t)cap ? 0 : 1);
  }
  close(p[1]);
  size_t got = 0;
  for (ssize_t k; got < cap && (k = read(p[0], (char *)out + got, cap - got)) > 0;) got += (size_t)k;
  close(p[0]);
  int st = 0;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0 && got == cap, "the child with %s=%s failed", name,
                value ? value : "(unset)");
}

_Atomic int *test_shared_int(void) {
  _Atomic int *p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("test_shared_int: mmap");
    abort();
  }
  atomic_init(p, 0);
  return p;
}

void test_shared_free(_Atomic int *p) { munmap((void *)p, sizeof *p); }

static void *stop_self(void *arg) {
  (void)arg;
  usleep(300 * 1000);
  kill(getpid(), SIGSTOP);
  return NULL;
}

gw_result_t test_allreduce_until_rank1_stopped(gw_comm_t comm, int rank, const char *algo, double timeout_s,
                                               size_t count, double *took) {
  int n = 0;
  int64_t pid = getpid(), pids[8];
  gw_comm_size(comm, &n);
  if (n > 8 || gw_allgather(&pid, pids, 1, GW_INT64, comm, NULL) != GW_SUCCESS ||
      gw_comm_set_algo(comm, algo, "simple") != GW_SUCCESS) {
    fprintf(stderr, "rank %d: setup for %s at %d ranks failed: %s\n", rank, algo, n, gw_comm_last_error(comm));
    return GW_ERR_INTERNAL;
  }
  gw_comm_set_timeout(comm, timeout_s);
  float *buf = calloc(count, sizeof *buf);
  pthread_t t;
  if (!buf || (rank == 1 && pthread_create(&t, NULL, stop_self, NULL) != 0)) {
    fprintf(stderr, "rank %d: out of memory, or no thread\n", rank);
    free(buf);
    return GW_ERR_INTERNAL;
  }
  gw_result_t r = GW_SUCCESS;
  double start = 0;
  for (int i = 0; i < 100000 && r == GW_SUCCESS; i++) {
    start = test_now();
    r = gw_allreduce(buf, buf, count, GW_FLOAT32, GW_SUM, comm, NULL);
  }
  *took = test_now() - start;
  if (rank == 0) kill((pid_t)pids[1], SIGCONT);
  if (rank == 1) pthread_join(t, NULL);
  free(buf);
  return r;
}
