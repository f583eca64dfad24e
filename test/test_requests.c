/* test_requests.c - non-blocking requests beyond the happy path: gw_test on an
 * operation still waiting for its peer says not done and leaves the request
 * alone (then gw_wait completes it); gw_comm_abort from another thread while
 * several requests are queued behind one that waits fails the running one and
 * every queued one with GW_ERR_ABORTED promptly, without running the queued
 * ones, and the peer hears of it in its own calls; a rank that cannot start
 * its progress thread tells its peer why. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Waits (at most 30 s) until the other rank set *flag: a handshake. */
static void wait_flag(_Atomic int *flag) {
  for (double t0 = test_now(); !atomic_load(flag) && test_now() - t0 < 30;) usleep(10000);
}

static int body_test_unfinished(gw_comm_t comm, int rank, int n, void *arg) {
  _Atomic int *tested = arg; /* shared: rank 0 has called gw_test */
  gw_comm_set_timeout(comm, 40);
  int32_t v[256];
  for (int i = 0; i < 256; i++) v[i] = rank + 1;
  if (rank == 1) wait_flag(tested); /* rank 0's operation waits for this one meanwhile */
  gw_request_t req = NULL;
  EXPECT(gw_iallreduce(v, v, 256, GW_INT32, GW_SUM, comm, NULL, &req) == GW_SUCCESS && req, "iallreduce: %s",
         gw_comm_last_error(comm));
  if (rank == 0) {
    int done = -1;
    gw_request_t before = req;
    const gw_result_t r = gw_test(&req, &done);
    atomic_store(tested, 1);
    EXPECT(r == GW_SUCCESS && done == 0 && req == before,
           "gw_test on an operation its peer has not joined: done %d, request %s", done,
           req == before ? "kept" : "changed");
  }
  EXPECT(gw_wait(&req) == GW_SUCCESS && req == NULL, "wait: %s", gw_comm_last_error(comm));
  for (int i = 0; i < 256; i++)
    if (v[i] != n * (n + 1) / 2) {
      EXPECT(0, "rank %d: element %d is %d", rank, i, v[i]);
      break;
    }
  return 0;
}

START_TEST(test_test_unfinished) {
  _Atomic int *tested = test_shared_int();
  ck_assert_int_eq(run_ranks(2, body_test_unfinished, (void *)tested, 60), 0);
  test_shared_free(tested);
}
END_TEST

static void *abort_later(void *arg) {
  usleep(300000);
  gw_comm_abort((gw_comm_t)arg);
  return NULL;
}

enum { NQ = 4, QN = 1024 };

static int body_abort_queued(gw_comm_t comm, int rank, int n, void *arg) {
  _Atomic int *gave_up = arg; /* shared: rank 0's waits all returned */
  (void)n;
  gw_comm_set_timeout(comm, 60);
  static int32_t v[NQ][QN];
  for (int k = 0; k < NQ; k++)
    for (int i = 0; i < QN; i++) v[k][i] = 7;
  if (rank == 1) { /* joins after rank 0 gave up: hears of the abort in its own calls */
    wait_flag(gave_up);
    double t0 = test_now();
    /* the first may still complete (rank 0's part of it was sent before the
     * abort, the notice behind it); the next meets the notice */
    gw_result_t r = gw_allreduce(v[0], v[0], QN, GW_INT32, GW_SUM, comm, NULL);
    if (r == GW_SUCCESS) r = gw_allreduce(v[1], v[1], QN, GW_INT32, GW_SUM, comm, NULL);
    EXPECT(r != GW_SUCCESS && strstr(gw_comm_last_error(comm), "abort"), "rank 1: %s: %s", gw_strerror(r),
           gw_comm_last_error(comm));
    EXPECT(test_now() - t0 < 10, "rank 1 took %.1f s", test_now() - t0);
    return 0;
  }
  gw_request_t req[NQ];
  for (int k = 0; k < NQ; k++)
    EXPECT(gw_iallreduce(v[k], v[k], QN, GW_INT32, GW_SUM, comm, NULL, &req[k]) == GW_SUCCESS, "iallreduce %d", k);
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, abort_later, comm) == 0, "pthread_create");
  double t0 = test_now();
  for (int k = 0; k < NQ; k++) {
    gw_result_t r = gw_wait(&req[k]);
    EXPECT(r == GW_ERR_ABORTED, "request %d: %s: %s", k, gw_strerror(r), gw_comm_last_error(comm));
  }
  const double took = test_now() - t0;
  atomic_store(gave_up, 1);
  pthread_join(th, NULL);
  EXPECT(took < 5, "the waits took %.1f s after the abort", took);
  for (int k = 1; k < NQ; k++) /* the queued ones never ran: their buffers as they were */
    EXPECT(v[k][0] == 7 && v[k][QN - 1] == 7, "queued request %d ran: %d", k, v[k][0]);
  return 0;
}

START_TEST(test_abort_queued) {
  _Atomic int *gave_up = test_shared_int();
  ck_assert_int_eq(run_ranks(2, body_abort_queued, (void *)gave_up, 60), 0);
  test_shared_free(gave_up);
}
END_TEST

/* A rank that cannot start its progress thread (its user's limit on threads
 * reached: ulimit -u, a container's pids.max) fails its non-blocking call
 * naming the limit, and its peer, already in the call, hears why at once.
 * The call failed on that rank alone, with no reason given: the peer waited
 * out GW_TIMEOUT and then said the rank had not started the call.  Rank 1
 * drops to user nobody (its saved user id kept, to come back for destroy,
 * which removes its files) with a thread limit of 0. */
static int body_no_progress_thread(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 60);
  if (rank == 1) {
    const struct rlimit none = {0, 0};
    EXPECT(setresuid(65534, 65534, 0) == 0 && setrlimit(RLIMIT_NPROC, &none) == 0, "setresuid, setrlimit: %s",
           strerror(errno));
  }
  int32_t v[64];
  for (int i = 0; i < 64; i++) v[i] = rank + 1;
  gw_request_t req = NULL;
  const double t0 = test_now();
  gw_result_t r = gw_iallreduce(v, v, 64, GW_INT32, GW_SUM, comm, NULL, &req);
  if (r == GW_SUCCESS) r = gw_wait(&req);
  const double took = test_now() - t0;
  const char *msg = gw_comm_last_error(comm);
  if (rank == 1) {
    EXPECT(setresuid(0, 0, 0) == 0, "back to root: %s", strerror(errno));
    EXPECT(r == GW_ERR_SYSTEM && has(msg, "cannot start the progress thread") && has(msg, "ulimit -u"),
           "rank 1: %s: %s", gw_strerror(r), msg);
  } else {
    EXPECT(r == GW_ERR_REMOTE && has(msg, "rank 1: cannot start the progress thread") && took < 20,
           "rank 0, after %.1f s: %s: %s", took, gw_strerror(r), msg);
  }
  return 0;
}

/* Root that may become user 65534 (not where a user namespace maps no such user). */
static bool can_be_nobody(void) {
  const pid_t p = fork();
  if (p == 0) _exit(setresuid(65534, 65534, 0) == 0 && setresuid(0, 0, 0) == 0 ? 0 : 1);
  int st = 0;
  return geteuid() == 0 && p > 0 && waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

START_TEST(test_no_progress_thread_told) {
  if (!can_be_nobody()) {
    printf("test_no_progress_thread_told: cannot drop to user 65534 and back here (needs root): not run\n");
    return;
  }
  ck_assert_int_eq(run_ranks(2, body_no_progress_thread, NULL, 90), 0);
}
END_TEST

/* The same at init: rank 1 cannot start a channel's thread (GW_NCHANNELS=2)
 * once every connection is made, after rank 0's init may have finished.
 * Rank 0 then heard only that rank 1 "left the communicator", at its first
 * call, without the reason. */
static int body_no_channel_thread(int rank, int n, const char *master, void *arg) {
  (void)arg;
  setenv("GW_NCHANNELS", "2", 1);
  if (rank == 1) {
    const struct rlimit none = {0, 0};
    EXPECT(setresuid(65534, 65534, 0) == 0 && setrlimit(RLIMIT_NPROC, &none) == 0, "setresuid, setrlimit: %s",
           strerror(errno));
  }
  gw_comm_t comm = NULL;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", gw_comm_last_error(NULL));
  if (rank == 1) {
    EXPECT(setresuid(0, 0, 0) == 0, "back to root: %s", strerror(errno));
    EXPECT(r == GW_ERR_SYSTEM && has(msg, "cannot start the thread of channel 1") && has(msg, "ulimit -u"),
           "rank 1: %s: %s", gw_strerror(r), msg);
    return 0;
  }
  if (r == GW_SUCCESS) { /* its init was done: the first call hears why */
    int32_t v[64] = {0};
    r = gw_allreduce(v, v, 64, GW_INT32, GW_SUM, comm, NULL);
    snprintf(msg, sizeof msg, "%s", gw_comm_last_error(comm));
    gw_comm_destroy(comm);
  }
  EXPECT(r != GW_SUCCESS && has(msg, "rank 1: cannot start the thread of channel 1"), "rank 0: %s: %s",
         gw_strerror(r), msg);
  return 0;
}

START_TEST(test_no_channel_thread_told) {
  if (!can_be_nobody()) {
    printf("test_no_channel_thread_told: cannot drop to user 65534 and back here (needs root): not run\n");
    return;
  }
  for (int i = 0; i < 3; i++) ck_assert_int_eq(run_ranks_raw(2, body_no_channel_thread, NULL, 60), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("requests");
  TCase *tc = tcase_create("requests");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_test_unfinished);
  tcase_add_test(tc, test_abort_queued);
  tcase_add_test(tc, test_no_progress_thread_told);
  tcase_add_test(tc, test_no_channel_thread_told);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
