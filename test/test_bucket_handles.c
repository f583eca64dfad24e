/* test_bucket_handles.c - the bucketer's handles and numbers (test_bucket.c
 * runs these cases):
 * - numbers: 16383 bucketers made and destroyed while one lives, then a
 *   bucketer whose buckets start in another order than the live one's on
 *   the other rank: both ranks fail naming both (numbered by creation, the
 *   new one's tag wrapped onto the live one's and their gradients were
 *   summed together, every call successful); ranks whose live bucketers
 *   differ (one destroyed one the other keeps) agree on the next number (a
 *   step of it runs); past 16383 live bucketers create is refused on every
 *   rank;
 * - a handle used after its destroy once malloc could have given its memory
 *   to a new bucketer (destroy, create, the old handle again): refused, and
 *   the new bucketer is untouched (a second destroy destroyed it); a
 *   communicator given as a bucketer is refused (it crashed);
 * - a step whose every bucket was reduced before the communicator failed:
 *   the wait says so (it said "bucket -1 of 1 ... not reduced");
 * - a create whose peer never calls it: the timeout is said as create's (it
 *   named only an internal broadcast);
 * - gw_bucketer_set_divide_first on one rank only: both ranks fail naming it
 *   (they said sum against avg). */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static gw_result_t make1(gw_comm_t comm, float *g, size_t count, gw_bucketer_t *bk) {
  const size_t one[] = {0, count};
  return gw_bucketer_create(comm, g, count, GW_FLOAT32, GW_SUM, one, 1, bk);
}

static int body_numbers(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  EXPECT(gw_comm_set_timeout(comm, 30) == GW_SUCCESS, "timeout");
  float a[64], b[64], c[1];
  gw_bucketer_t ba, bb, bc;
  EXPECT(make1(comm, a, 64, &ba) == GW_SUCCESS, "create A: %s", gw_comm_last_error(comm));
  for (int i = 0; i < 16383; i++) {
    EXPECT(make1(comm, c, 1, &bc) == GW_SUCCESS, "create %d: %s", i, gw_comm_last_error(comm));
    gw_bucketer_destroy(bc);
  }
  EXPECT(make1(comm, b, 64, &bb) == GW_SUCCESS, "create B: %s", gw_comm_last_error(comm));
  for (int i = 0; i < 64; i++) a[i] = (float)(1 + rank), b[i] = (float)(100 * (1 + rank));
  gw_bucketer_t first = rank == 0 ? ba : bb, second = first == ba ? bb : ba;
  gw_result_t r = gw_bucketer_ready(first, 0, 64);
  if (r == GW_SUCCESS) r = gw_bucketer_ready(second, 0, 64);
  const gw_result_t ra = gw_bucketer_wait(ba), rb = gw_bucketer_wait(bb);
  char why[1024];
  snprintf(why, sizeof why, "%s", gw_comm_last_error(comm));
  EXPECT(ra != GW_SUCCESS && rb != GW_SUCCESS, "rank %d: orders differ after 16383 bucketers, all passed: a[0] %g "
         "(want %d), b[0] %g (want %d)", rank, (double)a[0], n * (n + 1) / 2, (double)b[0], 100 * n * (n + 1) / 2);
  EXPECT(strstr(why, "of bucketer 1") && strstr(why, "of bucketer 2"), "rank %d: the message: %s", rank, why);
  gw_bucketer_destroy(ba);
  gw_bucketer_destroy(bb);
  return 0;
}

START_TEST(test_numbers_never_shared) { ck_assert_int_eq(run_ranks(2, body_numbers, NULL, 120), 0); }
END_TEST

/* Rank 0 destroys X (number 1) while rank 1 keeps it; the next bucketer
 * must take a number free on both (2), or its allreduces' tags differ and
 * its first step fails.  Then 16383 live bucketers: the next is refused. */
static int body_numbers_agreed(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  EXPECT(gw_comm_set_timeout(comm, 30) == GW_SUCCESS, "timeout");
  float x[8], y[8];
  gw_bucketer_t bx, by;
  EXPECT(make1(comm, x, 8, &bx) == GW_SUCCESS, "create X: %s", gw_comm_last_error(comm));
  if (rank == 0) gw_bucketer_destroy(bx);
  EXPECT(make1(comm, y, 8, &by) == GW_SUCCESS, "create Y: %s", gw_comm_last_error(comm));
  for (int i = 0; i < 8; i++) y[i] = (float)(rank + 1);
  EXPECT(gw_bucketer_ready(by, 0, 8) == GW_SUCCESS && gw_bucketer_wait(by) == GW_SUCCESS,
         "rank %d: a step of Y: %s", rank, gw_comm_last_error(comm));
  for (int i = 0; i < 8; i++) EXPECT(y[i] == (float)(n * (n + 1) / 2), "element %d: %g", i, (double)y[i]);
  if (rank == 1) gw_bucketer_destroy(bx);
  gw_bucketer_destroy(by);
  /* every number held: 16383 live bucketers over one float each */
  enum { NUMBERS = 16383 };
  gw_bucketer_t *live = calloc(NUMBERS, sizeof *live);
  float *g = calloc(NUMBERS + 1, sizeof *g);
  EXPECT(live && g, "out of memory");
  for (int i = 0; i < NUMBERS; i++)
    EXPECT(make1(comm, g + i, 1, &live[i]) == GW_SUCCESS, "create %d: %s", i, gw_comm_last_error(comm));
  gw_bucketer_t over = NULL;
  const gw_result_t r = make1(comm, g + NUMBERS, 1, &over);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(comm), "every bucketer number (1 to 16383) is held"),
         "rank %d: the 16384th live bucketer: %s: %s", rank, gw_strerror(r), gw_comm_last_error(comm));
  gw_bucketer_destroy(live[100]);
  EXPECT(make1(comm, g + NUMBERS, 1, &over) == GW_SUCCESS, "rank %d: a number given back: %s", rank,
         gw_comm_last_error(comm));
  live[100] = over;
  for (int i = 0; i < NUMBERS; i++) gw_bucketer_destroy(live[i]);
  free(live), free(g);
  return 0;
}

START_TEST(test_numbers_agreed) { ck_assert_int_eq(run_ranks(2, body_numbers_agreed, NULL, 120), 0); }
END_TEST

static int body_stale_handle(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n, (void)rank;
  float a[16], b[16];
  gw_bucketer_t ba, bb;
  EXPECT(make1(comm, a, 16, &ba) == GW_SUCCESS, "create A: %s", gw_comm_last_error(comm));
  gw_bucketer_destroy(ba);
  EXPECT(make1(comm, b, 16, &bb) == GW_SUCCESS, "create B: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_ready(ba, 0, 16) == GW_ERR_INVALID_ARGUMENT &&
             strstr(gw_comm_last_error(NULL), "is not a live bucketer"),
         "a destroyed handle (%s B's address) took a mark: %s", ba == bb ? "at" : "not at", gw_comm_last_error(NULL));
  gw_bucketer_destroy(ba); /* refused: B stays */
  for (int i = 0; i < 16; i++) b[i] = 3;
  EXPECT(gw_bucketer_ready(bb, 0, 16) == GW_SUCCESS && gw_bucketer_wait(bb) == GW_SUCCESS && b[0] == 3,
         "B after the old handle's second destroy: %s", gw_comm_last_error(comm));
  gw_bucketer_destroy(bb);
  /* a communicator is no bucketer */
  EXPECT(gw_bucketer_ready((gw_bucketer_t)(void *)comm, 0, 1) == GW_ERR_INVALID_ARGUMENT &&
             strstr(gw_comm_last_error(NULL), "is a live communicator, not a bucketer"),
         "a communicator as a bucketer: %s", gw_comm_last_error(NULL));
  struct gw_bucketer_times t;
  EXPECT(gw_bucketer_times((gw_bucketer_t)(void *)comm, &t) == GW_ERR_INVALID_ARGUMENT, "times on a communicator");
  return 0;
}

START_TEST(test_stale_handle_refused) { ck_assert_int_eq(run_ranks(1, body_stale_handle, NULL, 60), 0); }
END_TEST

/* Both ranks reduce the whole step; rank 1 aborts, rank 0 hears it in a
 * barrier, marks nothing (an empty range) and waits. */
static int body_failed_after_reduced(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  EXPECT(gw_comm_set_timeout(comm, 30) == GW_SUCCESS, "timeout");
  float g[32];
  gw_bucketer_t bk;
  EXPECT(make1(comm, g, 32, &bk) == GW_SUCCESS, "create: %s", gw_comm_last_error(comm));
  for (int i = 0; i < 32; i++) g[i] = 1;
  EXPECT(gw_bucketer_ready(bk, 0, 32) == GW_SUCCESS, "ready: %s", gw_comm_last_error(comm));
  if (rank == 1) {
    EXPECT(gw_bucketer_wait(bk) == GW_SUCCESS, "rank 1's wait: %s", gw_comm_last_error(comm));
    gw_comm_abort(comm);
  }
  EXPECT(gw_barrier(comm) != GW_SUCCESS, "rank %d: the barrier passed", rank);
  if (rank == 0) {
    (void)gw_bucketer_ready(bk, 0, 0);
    EXPECT(gw_bucketer_wait(bk) == GW_ERR_REMOTE &&
               strstr(gw_comm_last_error(comm), "every bucket of the step was reduced, but the communicator has "
                      "failed since") && !strstr(gw_comm_last_error(comm), "bucket -1") && g[0] == 2,
           "rank 0's wait: %s (g[0] %g)", gw_comm_last_error(comm), (double)g[0]);
  }
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_failed_after_reduced) { ck_assert_int_eq(run_ranks(2, body_failed_after_reduced, NULL, 60), 0); }
END_TEST

/* Rank 1 never calls create (it sleeps past rank 0's 0.5 s timeout). */
static int body_create_alone(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  if (rank == 1) {
    usleep(1500 * 1000);
    return 0;
  }
  EXPECT(gw_comm_set_timeout(comm, 0.5) == GW_SUCCESS, "timeout");
  float g[4];
  gw_bucketer_t bk = NULL;
  const gw_result_t r = make1(comm, g, 4, &bk);
  EXPECT(r != GW_SUCCESS && !bk &&
             strstr(gw_comm_last_error(comm), "gw_bucketer_create: agreeing with the other ranks failed (every rank "
                    "must call it): ") && strstr(gw_comm_last_error(comm), "rank 1"),
         "create without rank 1: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  return 0;
}

START_TEST(test_create_alone_said) { ck_assert_int_eq(run_ranks(2, body_create_alone, NULL, 60), 0); }
END_TEST

/* A float32 average on a bfloat16 wire divided first on rank 0 only: its
 * buckets' allreduces are sums of divided values, rank 1's averages.  Both
 * ranks fail; the message says which setting differs (it named only sum
 * against avg, two ops the caller never chose between). */
static int body_divide_first_one_rank(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg, (void)n;
  EXPECT(gw_comm_set_timeout(comm, 30) == GW_SUCCESS, "timeout");
  enum { M = 256 };
  float g[M];
  const size_t bounds[] = {0, M / 2, M};
  gw_bucketer_t bk;
  EXPECT(gw_bucketer_create(comm, g, M, GW_FLOAT32, GW_AVG, bounds, 2, &bk) == GW_SUCCESS, "create: %s",
         gw_comm_last_error(comm));
  EXPECT(gw_bucketer_set_wire(bk, GW_BFLOAT16) == GW_SUCCESS, "wire: %s", gw_comm_last_error(comm));
  EXPECT(gw_bucketer_set_divide_first(bk, rank == 0) == GW_SUCCESS, "divide first: %s", gw_comm_last_error(comm));
  for (int i = 0; i < M; i++) g[i] = (float)(rank + 1);
  (void)gw_bucketer_ready(bk, 0, M);
  const gw_result_t w = gw_bucketer_wait(bk);
  EXPECT(w != GW_SUCCESS, "rank %d: divide-first on one rank only, the step passed (g[0] %g)", rank, (double)g[0]);
  EXPECT(strstr(gw_comm_last_error(comm), "an average divided on each rank first (gw_bucketer_set_divide_first)"),
         "rank %d: the message: %s", rank, gw_comm_last_error(comm));
  gw_bucketer_destroy(bk);
  return 0;
}

START_TEST(test_divide_first_one_rank_said) {
  ck_assert_int_eq(run_ranks(2, body_divide_first_one_rank, NULL, 60), 0);
}
END_TEST

void add_handle_tests(TCase *tc);
void add_handle_tests(TCase *tc) {
  tcase_add_test(tc, test_numbers_never_shared);
  tcase_add_test(tc, test_numbers_agreed);
  tcase_add_test(tc, test_stale_handle_refused);
  tcase_add_test(tc, test_failed_after_reduced);
  tcase_add_test(tc, test_create_alone_said);
  tcase_add_test(tc, test_divide_first_one_rank_said);
}
