/* test_tcp_stopped.c - a rank stopped in the middle of an operation on
 * another machine is named by every other rank (part of test_tcp's "waits"
 * case).
 *
 * Every rank runs in a UTS namespace of its own whose host name says which
 * "machine" it is on, so ranks on different names see each other as remote:
 * tcp between them, and no look at each other's process state (the /proc
 * check that names a stopped peer on the same machine at once).  Rank 1 stops
 * itself (SIGSTOP, from a thread) while large allreduces run back to back.
 * Every deadline then runs out together; the rank that waits on rank 1 names
 * it, and each other rank waits on a healthy rank that waits itself.  Those
 * blamed their healthy predecessor ("which started it and then stopped
 * sending") before waiting ranks told the ranks they send to whom they wait
 * on (GW_COLL_STATUS, comm/prims.c).
 *
 * Cases: the ring at 4 ranks on 2 machines (rank 1 the last of machine 0,
 * so rank 2 waits on it over tcp, rank 3 on rank 2 over shm and rank 0 on
 * rank 3 over tcp); the ring at 5 ranks on 5 machines (lines of one, two and
 * three waits behind rank 2's), over tcp and over the ib transport (its verbs
 * emulator); the tree at 8 on 8. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gw_config.h"
#include "harness.h"

void add_stopped_tests(TCase *tc);

struct stopped_case {
  const char *algo;
  int nranks, per_machine; /* ranks per host name, in rank order */
  const char *transport;    /* GW_TRANSPORT (NULL: the default choice) */
};

static int raw_stopped_remote(int rank, int n, const char *master, void *arg) {
  const struct stopped_case *sc = arg;
  char name[32];
  snprintf(name, sizeof name, "stopnode%d", rank / sc->per_machine);
  if (unshare(CLONE_NEWUTS) != 0 || sethostname(name, strlen(name)) != 0) return 1;
  if (sc->transport) setenv("GW_TRANSPORT", sc->transport, 1);
  if (sc->transport && !strcmp(sc->transport, "ib")) setenv("GW_IB_EMULATE", "1", 1);
  gw_comm_t comm;
  EXPECT(gw_comm_init(&comm, n, rank, master) == GW_SUCCESS, "rank %d: init: %s", rank, gw_comm_last_error(NULL));
  double took = 0;
  /* 16 MiB: many chunks per operation */
  const gw_result_t r = test_allreduce_until_rank1_stopped(comm, rank, sc->algo, 2, (size_t)4 << 20, &took);
  EXPECT(r != GW_ERR_INTERNAL, "setup");
  if (rank == 1) {
    gw_comm_destroy(comm);
    return 0;
  }
  const char *e = gw_comm_last_error(comm);
  printf("%s at %d ranks, rank %d: %s\n", sc->algo, n, rank, e);
  EXPECT(r == GW_ERR_TIMEOUT || r == GW_ERR_REMOTE, "%s: rank %d returned %s: %s", sc->algo, rank, gw_strerror(r), e);
  EXPECT(took < 2 + 2 + 5, "%s: rank %d took %.1f s to report (timeout 2 s, grace 2 s)", sc->algo, rank, took);
  /* rank 1 named: by the rank that waits on it directly, or as the end of the
   * line of waits the others' waits lead to */
  EXPECT(has(e, "from rank 1, which") || has(e, "from rank 1, whose process") ||
             (has(e, "waits itself") && has(e, " on rank 1;")) || has(e, "ends at rank 1;"),
         "%s at %d ranks: rank %d does not name rank 1: %s", sc->algo, n, rank, e);
  gw_comm_destroy(comm);
  return 0;
}

static int can_unshare_uts(void *arg) {
  (void)arg;
  return unshare(CLONE_NEWUTS) == 0 ? 0 : 1;
}

START_TEST(test_stopped_remote_named) {
  if (run_in_child(can_unshare_uts, NULL) != 0) {
    printf("test_stopped_remote_named: no UTS namespace here (not root?): not run\n");
    return;
  }
  static const struct stopped_case cases[] = {
      {"ring", 4, 2, NULL}, {"ring", 5, 1, NULL}, {"tree", 8, 1, NULL},
#if GW_HAVE_IBVERBS
      {"ring", 5, 1, "ib"}, /* the verbs emulator */
#endif
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_msg(run_ranks_raw(cases[i].nranks, raw_stopped_remote, (void *)&cases[i], 60) == 0, "%s at %d ranks",
                  cases[i].algo, cases[i].nranks);
}
END_TEST

/* ---- a rank stopped past the others' deadline, within their grace ----
 * Every wait passed its deadline and told its successors whom it waits on;
 * rank 1 then goes on (rank 0 sends SIGCONT 4.5 s after the stop: the
 * deadline is 3 s after it, the grace ends 6 s after), and the operation
 * completes: the statuses left in the FIFOs are skipped, and every
 * allreduce, that one and the ones after, has exactly the sums.  4 ranks on
 * 2 machines (tcp between them, shm within).  Rank 1 stops between 15% and
 * 50% into a large allreduce (by the last one's duration): after its first
 * send, before its last (a stop between two operations, or in the ring's
 * last step, a receive, leaves its successor waiting in the next operation
 * on a rank that has not started it, which takes only a short part of the
 * grace: under ASan the first version stopped there now and then). */
struct slow_case {
  _Atomic int *stopped_ms; /* CLOCK_MONOTONIC ms of rank 1's stop (0: not yet) */
  _Atomic int *resumed;    /* rank 0 sent SIGCONT */
};

struct slow_arg {
  const struct slow_case *sc;
  pid_t victim;
};

/* rank 1's main thread: the large allreduce it is in (0: none) and when it began, the last one's duration */
static _Atomic int big_op;
static _Atomic long big_start_us, big_last_us;

static long now_us(void) { return (long)(test_now() * 1e6); }

static void *stop_and_note(void *argp) {
  const struct slow_case *sc = argp;
  for (;;) {
    usleep(1000);
    const long d = atomic_load(&big_last_us), at = now_us() - atomic_load(&big_start_us);
    if (atomic_load(&big_op) > 3 && d > 0 && at > d * 15 / 100 && at < d / 2) break;
  }
  atomic_store(sc->stopped_ms, (int)(test_now() * 1000));
  kill(getpid(), SIGSTOP);
  return NULL;
}

static void *resume_later(void *argp) {
  const struct slow_arg *a = argp;
  while (!atomic_load(a->sc->stopped_ms)) usleep(10 * 1000);
  while (test_now() * 1000 < atomic_load(a->sc->stopped_ms) + 4500.0) usleep(10 * 1000);
  kill(a->victim, SIGCONT);
  atomic_store(a->sc->resumed, 1);
  return NULL;
}

static int raw_slow_remote(int rank, int n, const char *master, void *arg) {
  const struct slow_case *sc = arg;
  char name[32];
  snprintf(name, sizeof name, "slownode%d", rank / 2);
  if (unshare(CLONE_NEWUTS) != 0 || sethostname(name, strlen(name)) != 0) return 1;
  gw_comm_t comm;
  EXPECT(gw_comm_init(&comm, n, rank, master) == GW_SUCCESS, "rank %d: init: %s", rank, gw_comm_last_error(NULL));
  int64_t pid = getpid(), pids[4];
  EXPECT(n == 4 && gw_allgather(&pid, pids, 1, GW_INT64, comm, NULL) == GW_SUCCESS, "allgather of pids: %s",
         gw_comm_last_error(comm));
  EXPECT(gw_comm_set_algo(comm, "ring", "simple") == GW_SUCCESS, "set_algo: %s", gw_comm_last_error(comm));
  /* and so a grace of 3 s: rank 1 goes on 1.5 s after the deadline, 1.5 s before the grace's end */
  gw_comm_set_timeout(comm, 3);
  const size_t count = (size_t)1 << 20; /* 4 MiB: many chunks per operation */
  int32_t *x = malloc(count * sizeof *x);
  EXPECT(x, "out of memory");
  pthread_t t;
  struct slow_arg a = {sc, (pid_t)pids[1]};
  if (rank == 1) EXPECT(pthread_create(&t, NULL, stop_and_note, (void *)sc) == 0, "pthread_create");
  if (rank == 0) EXPECT(pthread_create(&t, NULL, resume_later, &a) == 0, "pthread_create");
  int after = 0, ops = 0;
  for (int32_t it = 0; after < 3 && it < 100000; it++, ops++) {
    for (size_t i = 0; i < count; i++) x[i] = (int32_t)(rank + 1) * (it + (int32_t)(i & 1023));
    atomic_store(&big_start_us, now_us());
    atomic_store(&big_op, it + 1);
    const gw_result_t r = gw_allreduce(x, x, count, GW_INT32, GW_SUM, comm, NULL);
    atomic_store(&big_op, 0);
    atomic_store(&big_last_us, now_us() - atomic_load(&big_start_us));
    EXPECT(r == GW_SUCCESS, "allreduce %d failed though rank 1 went on within the grace: %s", it,
           gw_comm_last_error(comm));
    for (size_t i = 0; i < count; i++)
      EXPECT(x[i] == 10 * (it + (int32_t)(i & 1023)), "allreduce %d: element %zu is %d, expected %d", it, i, x[i],
             10 * (it + (int32_t)(i & 1023)));
    int32_t go_on = atomic_load(sc->resumed); /* the same decision on every rank */
    EXPECT(gw_allreduce(&go_on, &go_on, 1, GW_INT32, GW_MAX, comm, NULL) == GW_SUCCESS, "flag: %s",
           gw_comm_last_error(comm));
    after += go_on > 0;
  }
  if (rank <= 1) pthread_join(t, NULL);
  EXPECT(atomic_load(sc->resumed), "rank 1 was never resumed (%d operations)", ops);
  free(x);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_slow_remote_kept) {
  if (run_in_child(can_unshare_uts, NULL) != 0) {
    printf("test_slow_remote_kept: no UTS namespace here (not root?): not run\n");
    return;
  }
  struct slow_case sc = {test_shared_int(), test_shared_int()};
  const int failed = run_ranks_raw(4, raw_slow_remote, &sc, 90);
  test_shared_free(sc.stopped_ms);
  test_shared_free(sc.resumed);
  ck_assert_int_eq(failed, 0);
}
END_TEST

void add_stopped_tests(TCase *tc) {
  tcase_add_test(tc, test_stopped_remote_named);
  tcase_add_test(tc, test_slow_remote_kept);
}
