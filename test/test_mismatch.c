/* test_mismatch.c - calls that differ across ranks: every rank fails in that
 * call with both calls named (the one that sees the difference with
 * GW_ERR_INVALID_ARGUMENT, the others by its abort notice), and the
 * communicator refuses later work instead of hanging.  A broadcast's root,
 * which only sends, checks the last rank's call by the empty chunk that comes
 * back round the ring (it returned success and left its chunk behind).  Two
 * threads of a rank: its calls run in the order they are numbered. */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h" /* comm->test_paused */
#include "harness.h"

/* ---- calls that differ across ranks ---- */
static int body_mismatch(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 20);
  float buf[64] = {0};
  size_t count = rank == 0 ? 10 : 20;
  gw_result_t r = gw_allreduce(buf, buf, count, GW_FLOAT32, GW_SUM, comm, NULL);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT, "mismatched allreduce returned %s", gw_strerror(r));
  const char *msg = gw_comm_last_error(comm);
  EXPECT(has(msg, "count=10") && has(msg, "count=20") && has(msg, "differ"), "message does not name both calls: %s", msg);
  /* the communicator refuses further work instead of hanging */
  r = gw_allreduce(buf, buf, 1, GW_FLOAT32, GW_SUM, comm, NULL);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "earlier"), "later call returned %s", gw_strerror(r));
  return 0;
}

START_TEST(test_mismatched_calls) { ck_assert_int_eq(run_ranks(2, body_mismatch, NULL, 60), 0); }
END_TEST

static int body_mismatch_coll(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 20);
  int32_t buf[8] = {0};
  gw_result_t r = rank == 1 ? gw_broadcast(buf, buf, 8, GW_INT32, 0, comm, NULL)
                            : gw_allreduce(buf, buf, 8, GW_INT32, GW_MAX, comm, NULL);
  /* rank 1 sees the mismatch; rank 0 learns it from rank 1's abort notice */
  EXPECT(r == (rank == 1 ? GW_ERR_INVALID_ARGUMENT : GW_ERR_REMOTE), "returned %s", gw_strerror(r));
  const char *msg = gw_comm_last_error(comm);
  EXPECT(has(msg, "broadcast") && has(msg, "allreduce"), "message does not name both collectives: %s", msg);
  return 0;
}

START_TEST(test_mismatched_collectives) { ck_assert_int_eq(run_ranks(2, body_mismatch_coll, NULL, 60), 0); }
END_TEST

/* Two ranks that both think they are the root: each returned success and
 * kept its own data. */
static int body_two_roots(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  const size_t count = *(const size_t *)arg;
  gw_comm_set_timeout(comm, 20);
  int32_t *buf = malloc(count * sizeof *buf);
  for (size_t i = 0; i < count; i++) buf[i] = rank;
  const double t0 = test_now();
  gw_result_t r = gw_broadcast(buf, buf, count, GW_INT32, rank, comm, NULL);
  EXPECT(r != GW_SUCCESS, "rank %d: a broadcast from root %d beside one from the other root returned success", rank,
         rank);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(has(msg, "root=0") && has(msg, "root=1"), "rank %d: the message does not name both roots: %s", rank, msg);
  EXPECT(test_now() - t0 < 10, "rank %d: %zu values: the difference found after %.1f s", rank, count, test_now() - t0);
  free(buf);
  return 0;
}

/* 8 values, and 4 MiB: past what the FIFOs hold, each root waited for room
 * until the deadline ("waited 20 s for room"), the other's chunk at the head
 * of its receiving side unread. */
START_TEST(test_broadcast_two_roots) {
  static const size_t counts[] = {8, 1 << 20};
  for (int k = 0; k < 2; k++) ck_assert_int_eq(run_ranks(2, body_two_roots, (void *)&counts[k], 60), 0);
}
END_TEST

/* The root's count differs from the others': rank 1 sees it, rank 2 and the
 * root hear it by the notice (the root: round the ring, in the same call). */
static int body_root_count(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 20);
  float buf[256] = {0};
  gw_result_t r = gw_broadcast(buf, buf, rank == 0 ? 100 : 200, GW_FLOAT32, 0, comm, NULL);
  EXPECT(r == (rank == 1 ? GW_ERR_INVALID_ARGUMENT : GW_ERR_REMOTE), "rank %d: returned %s", rank, gw_strerror(r));
  const char *msg = gw_comm_last_error(comm);
  EXPECT(has(msg, "count=100") && has(msg, "count=200"), "rank %d: the message does not name both calls: %s", rank,
         msg);
  /* and the root's next call does not pair with anything left of this one */
  r = gw_broadcast(buf, buf, 100, GW_FLOAT32, 0, comm, NULL);
  EXPECT(r != GW_SUCCESS && has(gw_comm_last_error(comm), "earlier"), "rank %d: a later call returned %s: %s", rank,
         gw_strerror(r), gw_comm_last_error(comm));
  return 0;
}

START_TEST(test_broadcast_root_count) { ck_assert_int_eq(run_ranks(3, body_root_count, NULL, 60), 0); }
END_TEST

/* Calls where every rank waits before its first send: rank 0's allreduce
 * (recursive doubling at 3 ranks, or the tree) waits for its partner or its
 * children, the others' broadcast from root 0 for rank 0's data.  No chunk
 * shows the difference; every rank waited until the deadline, which blamed
 * a rank "stuck before it, or called something else".  Now the ranks tell
 * each other what they wait in (over shm at once, over tcp after a second),
 * and every rank fails with both calls named, not with a timeout.  arg: the
 * algorithm every rank sets (NULL: auto), the count, the transport. */
struct silent_case { const char *algo; size_t count; const char *transport; };
static int body_silent_mismatch(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  const struct silent_case *k = arg;
  gw_comm_set_timeout(comm, 40);
  if (k->algo) EXPECT(gw_comm_set_algo(comm, k->algo, "auto") == GW_SUCCESS, "set_algo %s", k->algo);
  int32_t buf[16] = {0};
  const double t0 = test_now();
  const gw_result_t r = rank == 0 ? gw_allreduce(buf, buf, k->count, GW_INT32, GW_SUM, comm, NULL)
                                  : gw_broadcast(buf, buf, k->count, GW_INT32, 0, comm, NULL);
  const char *msg = gw_comm_last_error(comm);
  EXPECT((r == GW_ERR_INVALID_ARGUMENT || r == GW_ERR_REMOTE) && has(msg, "broadcast") && has(msg, "allreduce"),
         "rank %d (%s, count %zu): returned %s after %.1f s: %s", rank, k->algo ? k->algo : "auto", k->count,
         gw_strerror(r), test_now() - t0, msg);
  return 0;
}

START_TEST(test_silent_mismatch_named) {
  /* ib over the verbs emulator: the records go back on each connection's
   * liveness socket (they waited the deadline there, 40 s here) */
  static const struct silent_case cases[] = {{NULL, 8, NULL},  {"tree", 8, NULL},   {NULL, 0, NULL},
                                             {NULL, 8, "tcp"}, {"tree", 0, "tcp"},
#if GW_HAVE_IBVERBS
                                             {NULL, 8, "ib"},  {"tree", 0, "ib"}
#endif
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].transport) setenv("GW_TRANSPORT", cases[i].transport, 1);
    if (cases[i].transport && !strcmp(cases[i].transport, "ib")) setenv("GW_IB_EMULATE", "1", 1);
    ck_assert_msg(run_ranks(3, body_silent_mismatch, (void *)&cases[i], 90) == 0, "case %zu", i);
    unsetenv("GW_TRANSPORT");
    unsetenv("GW_IB_EMULATE");
  }
}
END_TEST

/* A ring longer than its FIFOs are deep (10 ranks, 2 slots of 4 KiB): rank
 * 1's count differs, so it fails at rank 0's first chunk and stops taking
 * them; rank 0 fills its FIFO to rank 1 and may wait for a slot while the
 * abort notice comes round the ring behind a chunk it holds.  Every rank must
 * still fail within the call, with both calls named, not at its deadline. */
static int body_notice_behind_held_chunk(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 30);
  static float buf[1 << 18];
  double t0 = test_now();
  gw_result_t r = gw_allreduce(buf, buf, rank == 1 ? 100000 : 200000, GW_FLOAT32, GW_SUM, comm, NULL);
  double took = test_now() - t0;
  EXPECT(r != GW_SUCCESS, "rank %d: returned success", rank);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(has(msg, "count=100000") && has(msg, "count=200000"), "rank %d after %.1f s: %s", rank, took, msg);
  EXPECT(took < 25, "rank %d took %.1f s: %s", rank, took, msg); /* the deadline is 30 s; 10 ranks on 2 cores */
  return 0;
}

START_TEST(test_notice_behind_held_chunk) {
  setenv("GW_SHM_SLOTS", "2", 1);
  setenv("GW_SHM_SLOT_BYTES", "4096", 1);
  ck_assert_int_eq(run_ranks(10, body_notice_behind_held_chunk, NULL, 90), 0);
  unsetenv("GW_SHM_SLOT_BYTES");
  unsetenv("GW_SHM_SLOTS");
}
END_TEST

/* Ranks pair calls by their sequence numbers, so a rank must run its calls
 * in the order it numbers them.  Rank 0's blocking call claims the inline
 * path and pauses (GW_TEST_INLINE_PAUSE_US) while its other thread queues a
 * non-blocking one: that one took the earlier number, the blocking call the
 * later one but ran first, and rank 1's first call met it ("calls differ"). */
struct queued_meanwhile {
  gw_comm_t comm;
  gw_result_t r;
  int32_t buf[512];
};

static void *blocking_call(void *arg) {
  struct queued_meanwhile *q = arg;
  q->r = gw_allreduce(q->buf, q->buf, 512, GW_INT32, GW_SUM, q->comm, NULL);
  return NULL;
}

static int body_queued_meanwhile(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  gw_comm_set_timeout(comm, 20);
  struct queued_meanwhile a = {comm, GW_SUCCESS, {0}}, b = {comm, GW_SUCCESS, {0}};
  for (int i = 0; i < 512; i++) a.buf[i] = 1, b.buf[i] = 1;
  if (rank == 0) {
    pthread_t th;
    setenv("GW_TEST_INLINE_PAUSE_US", "30000000", 1); /* this rank's call; over once the other queued */
    EXPECT(pthread_create(&th, NULL, blocking_call, &a) == 0, "pthread_create");
    /* the blocking call is in its pause (at most 20 s), which this call's queueing ends */
    for (double t0 = test_now(); !atomic_load(&comm->test_paused) && test_now() - t0 < 20;) usleep(1000);
    EXPECT(atomic_load(&comm->test_paused), "the blocking call never paused: nothing to queue beside");
    gw_request_t req;
    b.r = gw_iallreduce(b.buf, b.buf, 512, GW_INT32, GW_SUM, comm, NULL, &req);
    if (b.r == GW_SUCCESS) b.r = gw_wait(&req);
    pthread_join(th, NULL);
    setenv("GW_TEST_INLINE_PAUSE_US", "0", 1); /* (not while the other thread runs: getenv there) */
  } else {
    blocking_call(&a);
    blocking_call(&b);
  }
  EXPECT(a.r == GW_SUCCESS && b.r == GW_SUCCESS, "rank %d: %s / %s: %s", rank, gw_strerror(a.r), gw_strerror(b.r),
         gw_comm_last_error(comm));
  for (int i = 0; i < 512; i++)
    if (a.buf[i] != n || b.buf[i] != n) {
      EXPECT(0, "rank %d: element %d is %d and %d", rank, i, a.buf[i], b.buf[i]);
      break;
    }
  return 0;
}

START_TEST(test_queued_meanwhile) {
  setenv("GW_TEST_INLINE_PAUSE_US", "0", 1); /* armed: rank 0 sets it for one call */
  ck_assert_int_eq(run_ranks(2, body_queued_meanwhile, NULL, 60), 0);
  unsetenv("GW_TEST_INLINE_PAUSE_US");
}
END_TEST

int main(void) {
  Suite *s = suite_create("mismatch");
  TCase *tc = tcase_create("mismatch");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_mismatched_calls);
  tcase_add_test(tc, test_mismatched_collectives);
  tcase_add_test(tc, test_broadcast_two_roots);
  tcase_add_test(tc, test_broadcast_root_count);
  tcase_add_test(tc, test_silent_mismatch_named);
  tcase_add_test(tc, test_notice_behind_held_chunk);
  tcase_add_test(tc, test_queued_meanwhile);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
