/* test_api_straggler.c - timeouts name the straggler: a rank that never
 * calls is named on every other rank (directly by the rank that waits on it,
 * through its abort notice on the others), for the ring allreduce over shm and
 * tcp, the tree (two trees; tree 0 alone with the straggler interior, deep, or
 * the root; odd rank counts), the ring broadcast and recursive doubling; and
 * the message gives the whole wait; and gw_comm_abort, in a call and between
 * calls (the peers hear of it).  Part of test_api's "waits" case. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

void add_straggler_tests(TCase *tc);
int count_segments(void); /* test_api.c: this job's segments in /dev/shm */


/* ---- a rank that never calls: the other times out naming it ---- */
static int body_straggler(gw_comm_t comm, int rank, int n, void *arg) {
  _Atomic int *done = arg; /* shared: rank 0 has its answer */
  (void)n;
  if (rank == 1) { /* never calls; stays alive (at most 30 s) so the peer must rely on its deadline */
    for (double t0 = test_now(); !atomic_load(done) && test_now() - t0 < 30;) usleep(10000);
    return 0;
  }
  gw_comm_set_timeout(comm, 1.5);
  const double t0 = test_now();
  float x = 1;
  gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL);
  const double took = test_now() - t0;
  atomic_store(done, 1);
  EXPECT(r == GW_ERR_TIMEOUT, "returned %s", gw_strerror(r));
  EXPECT(took < 10, "took %.1f s to time out (timeout 1.5 s)", took);
  EXPECT(has(gw_comm_last_error(comm), "rank 1") && has(gw_comm_last_error(comm), "allreduce"),
         "message does not name the straggler and the operation: %s", gw_comm_last_error(comm));
  return 0;
}

START_TEST(test_timeout_names_straggler) {
  _Atomic int *done = test_shared_int();
  ck_assert_int_eq(run_ranks(2, body_straggler, (void *)done, 60), 0);
  test_shared_free(done);
}
END_TEST

/* ---- a peer that stops inside an operation ----
 * Rank 1 stops itself (SIGSTOP, from a thread) while the ranks run large
 * allreduces back to back, so mostly after it has sent chunks of the operation
 * the others wait in.  Every other rank must still fail within the timeout and
 * the grace (a wait on a peer that had sent, where the algorithm staggers no
 * grace, once waited forever), by its own timeout or by the notice of one
 * that timed out; rank 0 then lets rank 1 go on (SIGCONT).  Every rank
 * names rank 1 as stopped (its process's state says so).  The ring at 2 and
 * 4 ranks (at 4, ranks 3 and 0 blamed their healthy predecessors before the
 * state was read); recursive doubling and the trees at 4, whose waits the
 * algorithms stagger. */
struct midop_case {
  const char *algo;
  int nranks;
};

static int body_stopped_midop(gw_comm_t comm, int rank, int n, void *arg) {
  const struct midop_case *mc = arg;
  double took = 0;
  /* 32 MiB: many chunks per operation */
  const gw_result_t r = test_allreduce_until_rank1_stopped(comm, rank, mc->algo, 2.5, (size_t)8 << 20, &took);
  EXPECT(r != GW_ERR_INTERNAL, "setup");
  if (rank == 1) return 0; /* it hears of the others' failure, or times out itself */
  char path[32];
  EXPECT(gw_comm_last_path(comm, path, sizeof path) == GW_SUCCESS && !strncmp(path, mc->algo, strlen(mc->algo)),
         "%s asked for, %s ran", mc->algo, path);
  EXPECT(n == mc->nranks && (r == GW_ERR_TIMEOUT || (n > 2 && r == GW_ERR_REMOTE)), "%s: returned %s: %s", mc->algo,
         gw_strerror(r), gw_comm_last_error(comm));
  EXPECT(took < 2.5 + 2.5 + 5, "%s: took %.1f s to report (timeout 2.5 s, grace 2.5 s)", mc->algo, took);
  /* rank 1's process is stopped: the rank waiting on it says so at its
   * deadline, and its notice reaches every other rank within their grace
   * (they blamed their own healthy predecessor, whose deadline ran out with
   * theirs, when the rank waiting on rank 1 took the grace too) */
  EXPECT(has(gw_comm_last_error(comm), "rank 1, whose process (pid ") &&
             has(gw_comm_last_error(comm), "is stopped (SIGSTOP"),
         "%s: rank %d does not name rank 1 as stopped: %s", mc->algo, rank, gw_comm_last_error(comm));
  return 0;
}

START_TEST(test_stopped_midop_times_out) {
  static const struct midop_case cases[] = {{"ring", 2}, {"ring", 4}, {"exchange", 4}, {"tree", 4}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_int_eq(run_ranks(cases[i].nranks, body_stopped_midop, (void *)&cases[i], 60), 0);
}
END_TEST

/* ---- 4 ranks, one never calls: EVERY other rank names it ----
 * Allreduce (ring): only rank 3 waits on rank 2 directly; ranks 0 and 1 wait
 * on neighbours that started the operation and are stuck themselves.  Their
 * deadlines expire at the same moment as rank 3's, so they must wait a little
 * longer for rank 3's notice rather than blame their innocent neighbour.
 * Broadcast from rank 0 (ring), rank 1 the straggler: ranks 2 and 3 both see
 * nothing from their predecessor, which only rank 2's is to blame for.  Tree
 * allreduce, rank 2 the straggler: a parent waits on an interior child, and a
 * child on its parent, which are inside the operation waiting themselves;
 * with 1000 floats rank 2 is a leaf of tree 1, whose parent names it at once;
 * with 1 float only tree 0 runs (0 -> 2 -> {1, 3}), where rank 2 is interior.
 * At 8 ranks (tree 0: 0 -> 4 -> {2, 6}, 2 -> {1, 3}, 6 -> {5, 7}) rank 2
 * interior and deep: only rank 4 waits on it from above; ranks 0, 6, 5 and 7
 * wait on ranks that wait themselves.  A wait on a deeper child holds off
 * less, so rank 4 reports first and its notice reaches the others first.
 * A broadcast of 16 MiB (64 chunks; a FIFO holds 8), rank 2 the straggler:
 * rank 1 fills rank 2's FIFO and waits for room there; the root fills rank
 * 1's and waits for room at rank 1, which took data of the operation and
 * waits itself: the root waits the grace for the notice that names rank 2
 * (it blamed rank 1). */
enum straggle {
  STRAGGLE_ALLREDUCE,
  STRAGGLE_BROADCAST,
  STRAGGLE_TREE,
  STRAGGLE_TREE0,
  STRAGGLE_TREE_CHUNKS,
  STRAGGLE_EXCHANGE,
  STRAGGLE_BROADCAST_BIG,
  STRAGGLE_RING /* the ring allreduce (GW_ALGO=ring), 1000 floats */
};

struct straggler_case {
  enum straggle how;
  int late;             /* the rank that never calls */
  _Atomic int *reported; /* shared by the ranks' processes: how many have reported */
};

static int body_straggler4(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n;
  const struct straggler_case *sc = arg;
  const enum straggle how = sc->how;
  const int late = sc->late;
  /* Every rank, the straggler too, leaves a barrier together: the others'
   * deadlines start from one moment, not from their processes' starts, which
   * a loaded machine spreads. */
  EXPECT(gw_barrier(comm) == GW_SUCCESS, "barrier: %s", gw_comm_last_error(comm));
  if (rank == late) {
    /* Alive until every other rank has reported (at most 20 s; the others
     * must report within 10), so none can rely on its connections closing. */
    for (double t0 = test_now(); atomic_load(sc->reported) < n - 1 && test_now() - t0 < 20;) usleep(20 * 1000);
    return 0;
  }
  gw_comm_set_timeout(comm, 2);
  double t0 = test_now();
  /* STRAGGLE_TREE_CHUNKS: 4 MiB, 8 chunks per half, so a leaf sends several
   * chunks up before it blocks: a parent waiting on a leaf that sent must not
   * report first (its vague notice pre-empted the straggler's naming) */
  const size_t count = how == STRAGGLE_BROADCAST_BIG                        ? (size_t)4 << 20
                       : how == STRAGGLE_TREE_CHUNKS                        ? (size_t)1 << 20
                       : how == STRAGGLE_TREE || how == STRAGGLE_BROADCAST || how == STRAGGLE_RING ? 1000
                                                                                                   : 1;
  float *x = calloc(count, sizeof *x);
  EXPECT(x, "out of memory");
  const bool bcast = how == STRAGGLE_BROADCAST || how == STRAGGLE_BROADCAST_BIG;
  gw_result_t r = bcast ? gw_broadcast(x, x, count, GW_FLOAT32, 0, comm, NULL)
                                            : gw_allreduce(x, x, count, GW_FLOAT32, GW_SUM, comm, NULL);
  free(x);
  /* A straggler no one waits on directly from a leaf's side is named by the
   * rank waiting on it, which cannot tell whether it started. */
  /* (Recursive doubling, which 1 float at 4 ranks takes: rank 0 waits on rank
   * 2 directly in the second step, and reports it in those words when its
   * grace ends before rank 3's notice comes round.) */
  /* (At 2 ranks the broadcast's root waits on rank 1 alone, which receives
   * from it: named at the limit, not after a grace.) */
  const bool hedged = (bcast && n > 2) || how == STRAGGLE_TREE0 || how == STRAGGLE_EXCHANGE ||
                      how == STRAGGLE_ALLREDUCE || ((how == STRAGGLE_TREE || how == STRAGGLE_TREE_CHUNKS) && late == 0);
  double took = test_now() - t0;
  EXPECT(r == GW_ERR_TIMEOUT || r == GW_ERR_REMOTE, "returned %s", gw_strerror(r));
  EXPECT(took < 10, "took %.1f s to report (timeout 2 s)", took);
  /* (A wait for room at the straggler says it "has freed no slot": the big
   * broadcast's rank 1, whose notice the others forward.) */
  char want[64], room[64];
  snprintf(want, sizeof want, hedged ? "from rank %d, which has not" : "from rank %d, which has not started", late);
  snprintf(room, sizeof room, "room at rank %d, which has freed no slot", late);
  EXPECT(has(gw_comm_last_error(comm), want) || (hedged && has(gw_comm_last_error(comm), room)),
         "message does not name the straggler rank %d: %s", late, gw_comm_last_error(comm));
  /* The reporter waited past its deadline for part of the grace, and says
   * how long in all (it said the timeout alone). */
  const char *w = strstr(gw_comm_last_error(comm), "waited ");
  EXPECT(!hedged || !has(gw_comm_last_error(comm), "has not sent it") || (w && atof(w + 7) > 2.1),
         "the wait it reports: %s", gw_comm_last_error(comm));
  atomic_fetch_add(sc->reported, 1);
  return 0;
}

static void straggler_at(const char *transport, enum straggle how, int nranks, int late) {
  setenv("GW_TRANSPORT", transport, 1);
  if (how == STRAGGLE_TREE || how == STRAGGLE_TREE0 || how == STRAGGLE_TREE_CHUNKS) setenv("GW_ALGO", "tree", 1);
  if (how == STRAGGLE_EXCHANGE) setenv("GW_ALGO", "exchange", 1);
  if (how == STRAGGLE_RING) setenv("GW_ALGO", "ring", 1);
  _Atomic int *reported = test_shared_int();
  struct straggler_case sc = {how, late, reported};
  ck_assert_int_eq(run_ranks(nranks, body_straggler4, &sc, 60), 0);
  test_shared_free(reported);
  unsetenv("GW_TRANSPORT");
  unsetenv("GW_ALGO");
}

static void straggler_n(const char *transport, enum straggle how, int nranks) {
  straggler_at(transport, how, nranks, how == STRAGGLE_BROADCAST ? 1 : 2);
}

START_TEST(test_timeout_every_rank_names_straggler_shm) {
  straggler_n("shm", STRAGGLE_ALLREDUCE, 4);
  straggler_n("shm", STRAGGLE_TREE, 4);
  straggler_n("shm", STRAGGLE_TREE0, 4);
  straggler_n("shm", STRAGGLE_TREE0, 8);
  straggler_at("shm", STRAGGLE_TREE0, 8, 0); /* the root: waited on from below only */
  /* Odd rank counts: position 0 is interior in both trees. */
  straggler_at("shm", STRAGGLE_TREE, 5, 0);
  straggler_at("shm", STRAGGLE_TREE, 7, 0);
  straggler_at("shm", STRAGGLE_TREE_CHUNKS, 5, 0);
  /* Recursive doubling at 5 ranks (position 4 folded into 0; steps 0-1, 2-3
   * then 0-2, 1-3): a core rank, and the folded one. */
  for (int late = 1; late <= 4; late += 3) straggler_at("shm", STRAGGLE_EXCHANGE, 5, late);
  /* The ring allreduce itself (1 float at 4 ranks takes recursive doubling):
   * the straggler's successor names it after a quarter of the grace (its
   * predecessor might be finishing the operation before), every other rank
   * waits on one that sent and hears it within its whole grace; at 7 ranks
   * the notice goes most of the way round. */
  straggler_at("shm", STRAGGLE_RING, 4, 2);
  straggler_at("shm", STRAGGLE_RING, 7, 1);
}
END_TEST
START_TEST(test_timeout_every_rank_names_straggler_tcp) { straggler_n("tcp", STRAGGLE_ALLREDUCE, 4); }
END_TEST
/* 1000 floats: rank 0, the root, sends at once and then waits for the last
 * rank's empty chunk: it hears of the failure through rank 3, which hears of
 * it from rank 2.  16 MiB, rank 2 late: the root waits for room at rank 1 and
 * hears rank 1 (which waits for room at rank 2) on a link it watches. */
START_TEST(test_timeout_broadcast_names_straggler) {
  straggler_n("shm", STRAGGLE_BROADCAST, 4);
  straggler_at("shm", STRAGGLE_BROADCAST_BIG, 4, 2);
  straggler_n("shm", STRAGGLE_BROADCAST, 2);
}
END_TEST

/* ---- a wait under way keeps the limit it started with ----
 * 3 ranks on the ring, rank 2 never calls; the others start an allreduce
 * with a 2 s limit and set 0 (no limit) while it waits: it still fails
 * within its limit and grace (the grace was taken from the communicator's
 * limit at its deadline, 0 then, and the wait went on until rank 2 left). */
static void *unlimit_later(void *comm) {
  usleep(500 * 1000);
  gw_comm_set_timeout(comm, 0);
  return NULL;
}

static int body_limit_kept(gw_comm_t comm, int rank, int n, void *arg) {
  _Atomic int *reported = arg;
  if (rank == 2) { /* alive until both have reported (at most 20 s) */
    for (double t0 = test_now(); atomic_load(reported) < n - 1 && test_now() - t0 < 20;) usleep(20 * 1000);
    return 0;
  }
  EXPECT(gw_comm_set_algo(comm, "ring", "simple") == GW_SUCCESS, "set_algo: %s", gw_comm_last_error(comm));
  gw_comm_set_timeout(comm, 2);
  float x[1024] = {0};
  /* a blocking call runs on this thread at once, so its wait starts under
   * the 2 s limit; another thread lifts the limit while it waits */
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, unlimit_later, comm) == 0, "pthread_create");
  const double t0 = test_now();
  const gw_result_t r = gw_allreduce(x, x, 1024, GW_FLOAT32, GW_SUM, comm, NULL);
  const double took = test_now() - t0;
  pthread_join(t, NULL);
  atomic_fetch_add(reported, 1);
  EXPECT(r == GW_ERR_TIMEOUT || r == GW_ERR_REMOTE, "returned %s", gw_strerror(r));
  EXPECT(took < 10, "took %.1f s (the limit 2 s and its grace, set to 0 while the wait was under way)", took);
  return 0;
}

START_TEST(test_timeout_kept_by_wait_under_way) {
  _Atomic int *reported = test_shared_int();
  ck_assert_int_eq(run_ranks(3, body_limit_kept, (void *)reported, 60), 0);
  test_shared_free(reported);
}
END_TEST

/* ---- a failed request's wait says its own failure ----
 * Rank 0 queues 5 allreduces, rank 1 never calls: the first times out, the
 * progress thread refuses the other 4, and each refusal became the
 * communicator's last error before the first's wait read it ("failed in an
 * earlier operation", for the operation that failed first). */
static int body_own_message(gw_comm_t comm, int rank, int n, void *arg) {
  _Atomic int *reported = arg;
  (void)n;
  if (rank == 1) {
    for (double t0 = test_now(); !atomic_load(reported) && test_now() - t0 < 20;) usleep(20 * 1000);
    return 0;
  }
  gw_comm_set_timeout(comm, 1);
  float x[5] = {0};
  gw_request_t q[5];
  for (int i = 0; i < 5; i++)
    EXPECT(gw_iallreduce(&x[i], &x[i], 1, GW_FLOAT32, GW_SUM, comm, NULL, &q[i]) == GW_SUCCESS, "iallreduce %d", i);
  /* all 5 done with (the queue runs in order): the first timed out, the
   * rest refused */
  for (int d = 0; !d;) {
    EXPECT(q[4] == NULL || gw_test(&q[4], &d) != GW_ERR_INVALID_ARGUMENT, "gw_test");
    if (!d) usleep(10 * 1000);
  }
  gw_result_t r = gw_wait(&q[0]);
  EXPECT(r == GW_ERR_TIMEOUT && has(gw_comm_last_error(comm), "waited") &&
             !has(gw_comm_last_error(comm), "failed in an earlier operation"),
         "the first request's wait: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  r = gw_wait(&q[3]);
  EXPECT(r == GW_ERR_TIMEOUT && has(gw_comm_last_error(comm), "failed in an earlier operation"),
         "a later request's wait: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  for (int i = 1; i < 5; i++) gw_wait(&q[i]);
  atomic_store(reported, 1);
  return 0;
}

START_TEST(test_request_says_own_failure) {
  _Atomic int *reported = test_shared_int();
  ck_assert_int_eq(run_ranks(2, body_own_message, (void *)reported, 60), 0);
  test_shared_free(reported);
}
END_TEST

/* ---- gw_comm_abort from another thread unblocks a waiting call ---- */
struct abort_arg {
  gw_comm_t comm;
};

static void *abort_later(void *argp) {
  struct abort_arg *a = argp;
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  gw_comm_abort(a->comm);
  return NULL;
}

/* Rank 0 is done (shared by the ranks' processes, set up by the test): the
 * other rank stays alive until then, not for a fixed time, so no dead-peer
 * detection can be what told rank 0. */
static _Atomic int *rank0_done;
static void rank0_done_reset(void) {
  if (!rank0_done) {
    rank0_done = mmap(NULL, sizeof *rank0_done, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(rank0_done, MAP_FAILED);
  }
  atomic_store(rank0_done, 0);
}
static void wait_rank0_done(double cap) {
  for (double t0 = test_now(); !atomic_load(rank0_done) && test_now() - t0 < cap;) usleep(20000);
}

static int body_abort(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 60);
  if (rank == 1) { /* stays alive and never calls until rank 0 has aborted */
    wait_rank0_done(10);
    return 0;
  }
  struct abort_arg a = {comm};
  pthread_t t;
  pthread_create(&t, NULL, abort_later, &a);
  double t0 = test_now();
  float x = 1;
  gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL);
  double took = test_now() - t0;
  pthread_join(t, NULL);
  atomic_store(rank0_done, 1);
  EXPECT(r == GW_ERR_ABORTED && took < 5, "returned %s after %.1f s", gw_strerror(r), took);
  EXPECT(has(gw_comm_last_error(comm), "aborted"), "message: %s", gw_comm_last_error(comm));
  EXPECT(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL) == GW_ERR_ABORTED, "later call not refused");
  /* a fresh communicator works afterwards */
  gw_comm_t solo;
  EXPECT(gw_comm_init(&solo, 1, 0, NULL) == GW_SUCCESS, "new communicator");
  EXPECT(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, solo, NULL) == GW_SUCCESS, "new communicator's call");
  gw_comm_destroy(solo);
  return 0;
}

START_TEST(test_abort_unblocks) {
  rank0_done_reset();
  ck_assert_int_eq(run_ranks(2, body_abort, NULL, 60), 0);
  ck_assert_int_eq(count_segments(), 0);
}
END_TEST

/* ---- gw_comm_abort between operations: the peers hear of it ----
 * Rank 1 aborts with nothing in flight and stays alive (no dead-peer
 * detection to help): its next call, or its gw_comm_destroy, tells rank 0,
 * which is waiting in an allreduce, at once instead of after GW_TIMEOUT. */
/* Rank 0's side: its allreduce fails with rank 1's notice within 5 s. */
static int waits_for_abort_notice(gw_comm_t comm) {
  const int rank = 0; /* for EXPECT's message */
  float x = 1;
  double t0 = test_now();
  gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL);
  double took = test_now() - t0;
  atomic_store(rank0_done, 1);
  EXPECT(r == GW_ERR_REMOTE && took < 5 && has(gw_comm_last_error(comm), "aborted by gw_comm_abort"),
         "returned %s after %.1f s: %s", gw_strerror(r), took, gw_comm_last_error(comm));
  return 0;
}

static int body_abort_idle(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 60);
  float x = 1;
  if (rank == 1) {
    sleep(1); /* rank 0 is waiting by now */
    gw_comm_abort(comm);
    gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL);
    EXPECT(r == GW_ERR_ABORTED, "the aborting rank's call returned %s", gw_strerror(r));
    wait_rank0_done(10); /* dead-peer detection would tell rank 0 only after this */
    return 0;
  }
  return waits_for_abort_notice(comm);
}

static int raw_abort_destroy(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  EXPECT(gw_comm_init(&comm, n, rank, master) == GW_SUCCESS, "init: %s", gw_comm_last_error(NULL));
  gw_comm_set_timeout(comm, 60);
  if (rank == 1) {
    sleep(1);
    gw_comm_abort(comm);
    gw_comm_destroy(comm);
    wait_rank0_done(10);
    return 0;
  }
  int rc = waits_for_abort_notice(comm);
  gw_comm_destroy(comm);
  return rc;
}

START_TEST(test_abort_between_operations_told) {
  rank0_done_reset();
  ck_assert_int_eq(run_ranks(2, body_abort_idle, NULL, 60), 0);
  rank0_done_reset();
  ck_assert_int_eq(run_ranks_raw(2, raw_abort_destroy, NULL, 60), 0);
}
END_TEST

/* ---- a late rank whose operation completes after the peer failed it ----
 * Rank 0 times out waiting for rank 1 (its data already sent) and fails;
 * rank 1 comes later, finds the data and completes (a correct sum), with
 * rank 0's notice waiting behind it.  Its destroy, with no call after, says
 * so (it ended without a word). */
static int raw_late_completes(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  EXPECT(gw_comm_init(&comm, n, rank, master) == GW_SUCCESS, "init: %s", gw_comm_last_error(NULL));
  float x = 1;
  if (rank == 0) {
    gw_comm_set_timeout(comm, 0.5);
    gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL);
    EXPECT(r == GW_ERR_TIMEOUT, "rank 0's allreduce returned %s: %s", gw_strerror(r), gw_comm_last_error(comm));
    gw_comm_destroy(comm);
    atomic_store(rank0_done, 1);
    return 0;
  }
  wait_rank0_done(30);
  gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL);
  EXPECT(r == GW_SUCCESS && x == 2.0f, "the late rank's allreduce: %s, %g", gw_strerror(r), (double)x);
  char path[] = "/tmp/gw-late-XXXXXX";
  const int fd = mkstemp(path), saved = dup(2);
  EXPECT(fd >= 0 && saved >= 0, "a file for stderr");
  fflush(stderr), dup2(fd, 2);
  gw_comm_destroy(comm);
  fflush(stderr), dup2(saved, 2), close(saved);
  char text[4096] = "";
  const ssize_t got = pread(fd, text, sizeof text - 1, 0);
  close(fd), unlink(path);
  text[got > 0 ? got : 0] = 0;
  EXPECT(has(text, "rank 1: destroyed with that peer's failure notice (above) unread: the peer failed in or after") &&
             has(text, "stopped because another rank failed: rank 0:"),
         "destroy said: %s", text);
  return 0;
}

START_TEST(test_late_rank_told_at_destroy) {
  rank0_done_reset();
  ck_assert_int_eq(run_ranks_raw(2, raw_late_completes, NULL, 60), 0);
}
END_TEST

void add_straggler_tests(TCase *tc) {
  tcase_add_test(tc, test_late_rank_told_at_destroy);
  tcase_add_test(tc, test_timeout_names_straggler);
  tcase_add_test(tc, test_timeout_every_rank_names_straggler_shm);
  tcase_add_test(tc, test_timeout_every_rank_names_straggler_tcp);
  tcase_add_test(tc, test_timeout_broadcast_names_straggler);
  tcase_add_test(tc, test_stopped_midop_times_out);
  tcase_add_test(tc, test_timeout_kept_by_wait_under_way);
  tcase_add_test(tc, test_request_says_own_failure);
  tcase_add_test(tc, test_abort_unblocks);
  tcase_add_test(tc, test_abort_between_operations_told);
}
