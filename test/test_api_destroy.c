/* test_api_destroy.c - what gw_comm_destroy refuses, and other misuse of a
 * communicator's lifetime: another thread inside a call, a bucketer, a
 * request not waited for, a registration dropped twice, a child forked
 * without exec using its parent's communicators.  Part of test_api's "api"
 * case. */
#include <check.h>
#include <stdint.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "harness.h"

void add_destroy_tests(TCase *tc);

/* gw_comm_destroy while another thread is inside a call on the communicator,
 * while a bucketer uses it, or with a request not waited for, is refused by
 * name and leaves it as it was (it freed it under them: a crash); once they
 * are done it goes.  A registration dropped twice is refused (it was freed
 * twice), and so is every call of a forked child on its parent's
 * communicator. */
static void *blocked_allreduce(void *arg) {
  static gw_result_t r;
  float x = 1;
  r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, arg, NULL);
  return &r;
}

static void *wait_copy(void *arg) {
  static gw_result_t r;
  r = gw_wait(arg);
  return &r;
}

static void *join(pthread_t t) {
  void *res = NULL;
  pthread_join(t, &res);
  return res;
}

/* A watchdog reading a communicator's error while the training thread
 * destroys it (PyTorch polls ncclCommGetAsyncError so): destroy waits for the
 * read instead of freeing under it.  The read is held inside by the error
 * lock, taken here first. */
static _Atomic int destroyed;
static void *read_error(void *arg) { return (void *)gw_comm_last_error(arg); }
static void *destroy_it(void *arg) {
  static gw_result_t r;
  r = gw_comm_destroy(arg);
  atomic_store(&destroyed, 1);
  return &r;
}

static int destroy_waits_for_reader(int rank) {
  gw_comm_t solo;
  EXPECT(gw_comm_init(&solo, 1, 0, NULL) == GW_SUCCESS, "a 1-rank communicator: %s", gw_comm_last_error(NULL));
  pthread_mutex_lock(&solo->err_mu);
  pthread_t reader, destroyer;
  EXPECT(pthread_create(&reader, NULL, read_error, solo) == 0, "pthread_create");
  while (atomic_load(&solo->peeking) == 0) usleep(1000); /* in gw_comm_last_error, at the lock */
  EXPECT(pthread_create(&destroyer, NULL, destroy_it, solo) == 0, "pthread_create");
  usleep(200 * 1000);
  const int early = atomic_load(&destroyed);
  pthread_mutex_unlock(&solo->err_mu); /* (freed already, were the reader not waited for) */
  join(reader);
  gw_result_t r = *(gw_result_t *)join(destroyer);
  EXPECT(!early && r == GW_SUCCESS, "destroy %s while a reader was inside gw_comm_last_error (%s)",
         early ? "went ahead" : "waited", gw_strerror(r));
  return 0;
}

/* Rank 0's thread blocks in an allreduce that rank 1 joins only after rank
 * 0's destroy was refused (*refused, shared; at most 20 s): handshakes, not
 * sleeps, which a loaded machine outran. */
static int body_destroy_in_use(gw_comm_t comm, int rank, int n, void *arg) {
  _Atomic int *refused = arg;
  if (destroy_waits_for_reader(rank)) return 1;
  (void)n;
  if (rank == 1) {
    for (double t0 = test_now(); !atomic_load(refused) && test_now() - t0 < 20;) usleep(1000);
    float x = 1;
    EXPECT(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL) == GW_SUCCESS, "allreduce");
  } else {
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, blocked_allreduce, comm) == 0, "pthread_create");
    for (double t0 = test_now(); atomic_load(&comm->inside) == 0 && test_now() - t0 < 20;) usleep(1000);
    gw_result_t r = gw_comm_destroy(comm);
    atomic_store(refused, 1);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "gw_comm_destroy refused: 1 call") &&
               has(gw_comm_last_error(comm), "still running on another thread"),
           "destroy under a blocked allreduce: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
    void *res;
    pthread_join(t, &res);
    EXPECT(*(gw_result_t *)res == GW_SUCCESS, "the blocked allreduce: %s", gw_strerror(*(gw_result_t *)res));
  }
  float buf[4] = {0};
  const size_t bounds[] = {0, 4};
  gw_bucketer_t b;
  EXPECT(gw_bucketer_create(comm, buf, 4, GW_FLOAT32, GW_SUM, bounds, 1, &b) == GW_SUCCESS, "bucketer");
  gw_result_t r = gw_comm_destroy(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "1 bucketer still uses it"),
         "destroy under a bucketer: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  gw_bucketer_destroy(b);
  /* A request not waited for: refused until it is. */
  gw_request_t req;
  float y = 1;
  EXPECT(gw_iallreduce(&y, &y, 1, GW_FLOAT32, GW_SUM, comm, NULL, &req) == GW_SUCCESS, "iallreduce");
  r = gw_comm_destroy(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "1 request of non-blocking calls has not"),
         "destroy with a request out: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  gw_request_t copy = req;
  /* small numbers (an uninitialised handle's likeliest values) are no
   * request: refused, not taken for this one (handles were 1, 2, 3, ...) */
  for (uintptr_t v = 1; v <= 4096; v++) {
    gw_request_t garbage = (gw_request_t)v;
    r = gw_wait(&garbage);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), "is not a live request"),
           "gw_wait on %p: %s: %s", (void *)garbage, gw_strerror(r), gw_comm_last_error(NULL));
  }
  EXPECT(gw_wait(&req) == GW_SUCCESS && y == 2, "the request, waited for after the refusal");
  /* A copy of a completed handle: refused by name, not freed again (ASan
   * saw a double free); gw_test's too. */
  int done = 0;
  r = gw_wait(&copy);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), "is not a live request"),
         "gw_wait on a copy of a completed request: %s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  r = gw_test(&copy, &done);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && !done && has(gw_comm_last_error(NULL), "gw_test: request"),
         "gw_test on it: %s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  /* ... also once a new request took the completed one's memory (the
   * allocator hands a freed block back sooner or later): the copy is still not
   * a live request, and the new one is its own caller's. */
  int32_t zero = 0;
  static gw_request_t seen[300];
  for (int k = 0; k < 300; k++) {
    gw_request_t fresh;
    EXPECT(gw_iallreduce(&zero, &zero, 1, GW_INT32, GW_SUM, comm, NULL, &fresh) == GW_SUCCESS, "iallreduce");
    seen[k] = fresh;
    for (int j = 0; j < k; j++) /* a handle never names an earlier request (addresses did, once freed) */
      EXPECT(seen[j] != fresh, "round %d: request handle %p was round %d's too", k, (void *)fresh, j);
    r = gw_wait(&copy);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT, "round %d: a stale copy waited for a new request: %s", k, gw_strerror(r));
    EXPECT(gw_wait(&fresh) == GW_SUCCESS, "the new request, after the stale copy: %s", gw_comm_last_error(comm));
  }
  /* Two threads waiting on one request: one completes it, the other is refused. */
  EXPECT(gw_iallreduce(&y, &y, 1, GW_FLOAT32, GW_SUM, comm, NULL, &req) == GW_SUCCESS, "iallreduce 2");
  copy = req;
  pthread_t waiter;
  EXPECT(pthread_create(&waiter, NULL, wait_copy, &copy) == 0, "pthread_create");
  gw_result_t mine = gw_wait(&req), theirs = *(gw_result_t *)join(waiter);
  EXPECT((mine == GW_SUCCESS) + (theirs == GW_SUCCESS) == 1 &&
             (mine == GW_ERR_INVALID_ARGUMENT) + (theirs == GW_ERR_INVALID_ARGUMENT) == 1 && y == 4,
         "two waits on one request: %s and %s (y %g)", gw_strerror(mine), gw_strerror(theirs), (double)y);
  /* A registration dropped twice: refused, not freed again. */
  void *h;
  EXPECT(gw_comm_register(comm, buf, sizeof buf, &h) == GW_SUCCESS, "register: %s", gw_comm_last_error(comm));
  EXPECT(gw_comm_deregister(comm, h) == GW_SUCCESS, "deregister");
  r = gw_comm_deregister(comm, h);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "is not a live registration"),
         "deregister twice: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  /* A range whose end wraps past the address space: refused (it was taken,
   * cached with its end below its start) */
  EXPECT(gw_comm_register(comm, buf, SIZE_MAX, &h) == GW_ERR_INVALID_ARGUMENT && !h &&
             has(gw_comm_last_error(comm), "runs past the end of the address space"),
         "register of SIZE_MAX bytes: %s", gw_comm_last_error(comm));
  EXPECT(gw_comm_register(comm, (void *)(UINTPTR_MAX - 4095), 8192, &h) == GW_ERR_INVALID_ARGUMENT,
         "register of 8 KiB from 4 KiB below the top: %s", gw_comm_last_error(comm));
  /* Registrations are the process's: dropped without a communicator (one that
   * outlived its communicator could not be dropped at all). */
  EXPECT(gw_comm_register(comm, buf, sizeof buf, &h) == GW_SUCCESS, "register again");
  EXPECT(gw_comm_deregister(NULL, h) == GW_SUCCESS, "deregister without a communicator: %s", gw_comm_last_error(NULL));
  r = gw_comm_deregister(NULL, h);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), "is not a live registration"),
         "deregister twice without a communicator: %s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  /* A destroy racing one under way (the state set as the winner's): refused
   * without touching the communicator's error (the winner frees it as soon
   * as the loser leaves; the loser locked its mutex under the free), and
   * counted out again. */
  atomic_store(&comm->destroying, GW_DESTROY_GOING);
  gw__set_thread_error("");
  r = gw_comm_destroy(comm);
  const int inside_after = atomic_load(&comm->inside);
  atomic_store(&comm->destroying, GW_DESTROY_NO);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), "another thread is destroying") &&
             !has(gw_comm_last_error(comm), "another thread is destroying") && inside_after == 0,
         "a racing destroy: %s: thread's '%s', communicator's '%s', inside %d", gw_strerror(r),
         gw_comm_last_error(NULL), gw_comm_last_error(comm), inside_after);
  /* A child forked without exec: every call on the parent's communicator,
   * and its destroy, refused by name (its collectives ran on the parent's
   * connections: chunks taken from under the parent). */
  gw_comm_t solo; /* one rank: no liveness lock, marked all the same */
  EXPECT(gw_comm_init(&solo, 1, 0, NULL) == GW_SUCCESS, "a 1-rank communicator: %s", gw_comm_last_error(NULL));
  /* A bucketer of the parent's, alive at the fork (with its lock held): the
   * child's marks and waits are refused before touching it (a wait with
   * nothing marked failed the step and told the parent's peers to stop). */
  float pg[4] = {0};
  const size_t pgb[2] = {0, 4};
  gw_bucketer_t pbk = NULL;
  EXPECT(gw_bucketer_create(comm, pg, 4, GW_FLOAT32, GW_SUM, pgb, 1, &pbk) == GW_SUCCESS, "the parent's bucketer");
  /* The parent's error lock held at the fork (as by its progress thread
   * failing an operation then): the child's refusals must not need it. */
  pthread_mutex_lock(&comm->err_mu);
  pid_t child = fork();
  if (child != 0) pthread_mutex_unlock(&comm->err_mu);
  if (child == 0) {
    alarm(20); /* a hang is a failure, not a stuck test */
    float z = 1;
    gw_result_t c = gw_allreduce(&z, &z, 1, GW_FLOAT32, GW_SUM, comm, NULL);
    int bad = c != GW_ERR_INVALID_ARGUMENT || !has(gw_comm_last_error(comm), "a child cannot use it");
    /* a bucketer too (it went past the gate, counted on the parent's copy) */
    float g[4] = {0};
    const size_t gb[2] = {0, 4};
    gw_bucketer_t bk = NULL;
    bad |= gw_bucketer_create(comm, g, 4, GW_FLOAT32, GW_SUM, gb, 1, &bk) != GW_ERR_INVALID_ARGUMENT || bk != NULL;
    /* and the setters (they wrote the parent's copy as if it were the child's) */
    bad |= gw_comm_set_timeout(comm, 5) != GW_ERR_INVALID_ARGUMENT || comm->timeout_s == 5;
    bad |= gw_comm_set_algo(comm, "ring", "simple") != GW_ERR_INVALID_ARGUMENT;
    /* bad arguments too: refused at the gate, not written into the parent's
     * copy of the communicator's error under its lock (held: a hang) */
    bad |= gw_allreduce(&z, &z, 1, (gw_dtype_t)42, GW_SUM, comm, NULL) != GW_ERR_INVALID_ARGUMENT ||
           !has(gw_comm_last_error(comm), "a child cannot use it");
    bad |= gw_iallreduce(&z, &z, 1, GW_FLOAT32, GW_SUM, comm, NULL, NULL) != GW_ERR_INVALID_ARGUMENT ||
           !has(gw_comm_last_error(comm), "a child cannot use it");
    bad |= gw_comm_destroy(comm) != GW_ERR_INVALID_ARGUMENT;
    bad |= gw_comm_abort(comm) != GW_ERR_INVALID_ARGUMENT; /* it said success, the header says refused */
    bad |= gw_allreduce(&z, &z, 1, GW_FLOAT32, GW_SUM, solo, NULL) != GW_ERR_INVALID_ARGUMENT;
    bad |= gw_bucketer_wait(pbk) != GW_ERR_INVALID_ARGUMENT || !has(gw_comm_last_error(NULL), "a child cannot use it");
    bad |= gw_bucketer_ready(pbk, 100, 1) != GW_ERR_INVALID_ARGUMENT;
    bad |= gw_bucketer_set_divide_first(pbk, 1) != GW_ERR_INVALID_ARGUMENT;
    gw_bucketer_destroy(pbk); /* nothing of the parent's freed or counted */
    if (bad) fprintf(stderr, "child: allreduce %s: %s\n", gw_strerror(c), gw_comm_last_error(comm));
    _exit(bad);
  }
  int status = 0;
  EXPECT(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
         "the forked child's calls were not refused (status %d)", status);
  EXPECT(gw_comm_destroy(solo) == GW_SUCCESS, "the 1-rank communicator, in its own process");
  float x = 1; /* the communicator still works: no rank was told to stop */
  EXPECT(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, comm, NULL) == GW_SUCCESS && x == 2, "allreduce after: %s",
         gw_comm_last_error(comm));
  /* and so does the parent's bucketer */
  pg[0] = 1;
  EXPECT(gw_bucketer_ready(pbk, 0, 4) == GW_SUCCESS && gw_bucketer_wait(pbk) == GW_SUCCESS && pg[0] == 2,
         "the parent's bucketer after the child's calls: %s", gw_comm_last_error(comm));
  gw_bucketer_destroy(pbk);
  /* destroyed twice: the second refused (it freed the bucketer twice: an abort) */
  gw_bucketer_destroy(pbk);
  EXPECT(has(gw_comm_last_error(NULL), "is not a live bucketer"), "a second bucketer destroy: %s",
         gw_comm_last_error(NULL));
  /* and every other call on it (ready read the freed bucketer) */
  struct gw_bucketer_times tt;
  EXPECT(gw_bucketer_ready(pbk, 0, 4) == GW_ERR_INVALID_ARGUMENT &&
             has(gw_comm_last_error(NULL), "gw_bucketer_ready: ") &&
             has(gw_comm_last_error(NULL), "is not a live bucketer"),
         "ready after destroy: %s", gw_comm_last_error(NULL));
  EXPECT(gw_bucketer_wait(pbk) == GW_ERR_INVALID_ARGUMENT && gw_bucketer_times(pbk, &tt) == GW_ERR_INVALID_ARGUMENT &&
             gw_bucketer_set_wire(pbk, GW_FLOAT32) == GW_ERR_INVALID_ARGUMENT &&
             gw_bucketer_set_divide_first(pbk, 1) == GW_ERR_INVALID_ARGUMENT &&
             gw_bucketer_set_stream(pbk, NULL) == GW_ERR_INVALID_ARGUMENT &&
             gw_bucketer_set_compute_stream(pbk, NULL) == GW_ERR_INVALID_ARGUMENT,
         "calls after destroy: %s", gw_comm_last_error(NULL));
  /* and a communicator (the second wrote into freed memory; the next init crashed) */
  gw_comm_t once;
  EXPECT(gw_comm_init(&once, 1, 0, NULL) == GW_SUCCESS && gw_comm_destroy(once) == GW_SUCCESS, "a 1-rank communicator");
  EXPECT(gw_comm_destroy(once) == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), "is not a live communicator"),
         "a second destroy: %s", gw_comm_last_error(NULL));
  /* calls on it, with no other thread: not "being destroyed on another
   * thread"; gw_comm_last_error on it keeps the refused call's message (it
   * put its own refusal there); gw_comm_abort is no success */
  int rk = -1;
  float v = 1;
  EXPECT(gw_comm_rank(once, &rk) == GW_ERR_INVALID_ARGUMENT &&
             has(gw_comm_last_error(NULL), "gw_comm_rank: ") &&
             has(gw_comm_last_error(NULL), "is not a live communicator (gw_comm_destroy freed it)"),
         "gw_comm_rank after destroy: %s", gw_comm_last_error(NULL));
  EXPECT(gw_allreduce(&v, &v, 1, GW_FLOAT32, GW_SUM, once, NULL) == GW_ERR_INVALID_ARGUMENT &&
             has(gw_comm_last_error(once), "gw_allreduce: ") && has(gw_comm_last_error(once), "is not a live"),
         "gw_allreduce after destroy, its error read through the handle: %s", gw_comm_last_error(NULL));
  EXPECT(gw_comm_abort(once) == GW_ERR_INVALID_ARGUMENT, "gw_comm_abort after destroy succeeded");
  EXPECT(gw_comm_init(&once, 1, 0, NULL) == GW_SUCCESS && gw_comm_destroy(once) == GW_SUCCESS,
         "a communicator made after it: %s", gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_destroy_refused_in_use) {
  _Atomic int *refused = test_shared_int();
  ck_assert_int_eq(run_ranks(2, body_destroy_in_use, (void *)refused, 60), 0);
  test_shared_free(refused);
}
END_TEST

/* Two destroys at once, and an accessor polling meanwhile (a watchdog
 * thread): exactly one destroy frees the communicator, the other and the
 * accessor are refused.  The loser counted itself in and out of freed memory
 * once the winner's wait was over (ASan: a write after free), an accessor
 * read it, and now and then both destroys were refused ("1 call ... is still
 * running": the other destroy), the communicator left alive. */
struct destroy_race {
  gw_comm_t comm;
  pthread_barrier_t go;
  _Atomic bool done;
  gw_result_t r[2];
};

static void *race_destroyer(void *arg) {
  struct destroy_race *d = ((struct destroy_race **)arg)[0];
  const int k = (int)(intptr_t)((void **)arg)[1];
  pthread_barrier_wait(&d->go);
  d->r[k] = gw_comm_destroy(d->comm);
  return NULL;
}

static void *race_accessor(void *arg) {
  struct destroy_race *d = arg;
  pthread_barrier_wait(&d->go);
  int rank;
  gw_result_t async;
  while (!atomic_load(&d->done)) {
    (void)gw_comm_rank(d->comm, &rank);
    (void)gw_comm_get_async_error(d->comm, &async);
  }
  return NULL;
}

START_TEST(test_destroy_races) {
  struct destroy_race d;
  for (int i = 0; i < 2000; i++) {
    ck_assert_int_eq(gw_comm_init(&d.comm, 1, 0, NULL), GW_SUCCESS);
    pthread_barrier_init(&d.go, NULL, 3);
    atomic_store(&d.done, false);
    void *args[2][2] = {{&d, (void *)0}, {&d, (void *)1}};
    pthread_t t[3];
    pthread_create(&t[0], NULL, race_destroyer, args[0]);
    pthread_create(&t[1], NULL, race_destroyer, args[1]);
    pthread_create(&t[2], NULL, race_accessor, &d);
    pthread_join(t[0], NULL), pthread_join(t[1], NULL);
    atomic_store(&d.done, true);
    pthread_join(t[2], NULL);
    pthread_barrier_destroy(&d.go);
    const int freed = (d.r[0] == GW_SUCCESS) + (d.r[1] == GW_SUCCESS);
    if (freed != 1) {
      const gw_result_t again = gw_comm_destroy(d.comm); /* left alive: freed here */
      ck_assert_msg(0, "iteration %d: %d destroys succeeded (%s, %s); a third: %s", i, freed, gw_strerror(d.r[0]),
                    gw_strerror(d.r[1]), gw_strerror(again));
    }
  }
}
END_TEST

/* gw_comm_abort through a destroyed communicator's handle (a watchdog's,
 * stale) while the next gw_comm_init makes a communicator in the same memory
 * (the pool gives it back): refused, and the new communicator is not aborted.
 * It was refused but set the flag all the same, which stuck to the one being
 * made: its first allreduce failed as "aborted" on rank 0 and as a peer's
 * failure on rank 1.  Rank 1 comes to the second init once the abort was
 * made, so rank 0 is inside init when it comes. */
struct stale_abort {
  gw_comm_t old;
  gw_result_t r;
  _Atomic int *done; /* shared with rank 1, which joins the second init after it */
};

static void *abort_stale(void *arg) {
  struct stale_abort *a = arg;
  usleep(50 * 1000);
  a->r = gw_comm_abort(a->old);
  atomic_store(a->done, 1);
  return NULL;
}

static char stale_master2[64]; /* the second job's: the first's may still be in TIME_WAIT */

static int body_stale_abort(int rank, int n, const char *master, void *arg) {
  _Atomic int *aborted = arg;
  gw_comm_t a, b;
  EXPECT(gw_comm_init(&a, n, rank, master) == GW_SUCCESS, "init: %s", gw_comm_last_error(NULL));
  float x = 1;
  EXPECT(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, a, NULL) == GW_SUCCESS && gw_comm_destroy(a) == GW_SUCCESS,
         "the first communicator: %s", gw_comm_last_error(a));
  struct stale_abort st = {a, GW_SUCCESS, aborted};
  pthread_t t;
  if (rank == 0) EXPECT(pthread_create(&t, NULL, abort_stale, &st) == 0, "pthread_create");
  if (rank == 1) /* rank 0 is inside init until then (a handshake: a late abort hit the new one by right) */
    for (double t0 = test_now(); !atomic_load(aborted) && test_now() - t0 < 20;) usleep(1000);
  const gw_result_t r = gw_comm_init(&b, n, rank, stale_master2);
  if (rank == 0) pthread_join(t, NULL);
  EXPECT(r == GW_SUCCESS, "the second init: %s", gw_comm_last_error(NULL));
  if (rank == 0) {
    EXPECT(b == a, "the pool gave other memory (%p, %p): the test tests nothing", (void *)b, (void *)a);
    EXPECT(st.r == GW_ERR_INVALID_ARGUMENT, "the stale abort: %s", gw_strerror(st.r));
  }
  x = 1;
  EXPECT(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, b, NULL) == GW_SUCCESS && x == 2,
         "rank %d: the new communicator's allreduce: %s", rank, gw_comm_last_error(b));
  EXPECT(gw_comm_destroy(b) == GW_SUCCESS, "destroy");
  return 0;
}

START_TEST(test_stale_abort_leaves_next_comm) {
  snprintf(stale_master2, sizeof stale_master2, "127.0.0.1:%d", free_port());
  _Atomic int *aborted = test_shared_int();
  ck_assert_int_eq(run_ranks_raw(2, body_stale_abort, (void *)aborted, 60), 0);
  test_shared_free(aborted);
}
END_TEST

/* The same, the abort held up longer: it looked at the gate while the old
 * communicator was alive, then its thread was preempted past the destroy and
 * the whole next init in the same memory; its flag then landed on the new
 * communicator, whose first call failed as aborted.  The next communicator
 * now opens only once no abort is between its look and its store. */
static sem_t gap_in, gap_go;
static void hold_abort(void) {
  sem_post(&gap_in);
  sem_wait(&gap_go);
}

static void *abort_held(void *arg) {
  gw_comm_t c = arg;
  static gw_result_t r;
  r = gw_comm_abort(c);
  return &r;
}

static void *init_next(void *arg) {
  gw_comm_t *out = arg;
  static gw_result_t r;
  r = gw_comm_init(out, 1, 0, NULL);
  return &r;
}

START_TEST(test_stale_abort_held_up) {
  ck_assert(sem_init(&gap_in, 0, 0) == 0 && sem_init(&gap_go, 0, 0) == 0);
  gw_comm_t a, b = NULL;
  ck_assert_int_eq(gw_comm_init(&a, 1, 0, NULL), GW_SUCCESS);
  atomic_store(&gw__abort_gap_hook, hold_abort);
  pthread_t ab, in;
  ck_assert_int_eq(pthread_create(&ab, NULL, abort_held, a), 0);
  sem_wait(&gap_in); /* the abort saw the old communicator alive */
  atomic_store(&gw__abort_gap_hook, NULL);
  ck_assert_int_eq(gw_comm_destroy(a), GW_SUCCESS);
  ck_assert_int_eq(pthread_create(&in, NULL, init_next, &b), 0);
  usleep(200 * 1000); /* the next init has long been done, or waits for the abort */
  sem_post(&gap_go);
  void *ra, *ri;
  pthread_join(ab, &ra);
  pthread_join(in, &ri);
  ck_assert_msg(*(gw_result_t *)ri == GW_SUCCESS, "the next init: %s", gw_comm_last_error(NULL));
  ck_assert_msg(b == a, "the pool gave other memory: the test tests nothing");
  float x = 3;
  const gw_result_t r = gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, b, NULL);
  ck_assert_msg(r == GW_SUCCESS && x == 3, "the next communicator's allreduce: %s (%s)", gw_strerror(r),
                gw_comm_last_error(b));
  ck_assert_int_eq(gw_comm_destroy(b), GW_SUCCESS);
  sem_destroy(&gap_in);
  sem_destroy(&gap_go);
  (void)ra;
}
END_TEST

/* An abort that never finishes (a signal handler that jumps out of it, here
 * the test hook): the next init in the same memory waited for it for good,
 * spinning; now at most a second, with a warning. */
static jmp_buf abort_jump;
static void jump_out(void) { longjmp(abort_jump, 1); }

START_TEST(test_abort_left_midway) {
  gw_comm_t a, b = NULL;
  ck_assert_int_eq(gw_comm_init(&a, 1, 0, NULL), GW_SUCCESS);
  atomic_store(&gw__abort_gap_hook, jump_out);
  if (!setjmp(abort_jump)) gw_comm_abort(a); /* left in its gap: its count never taken back */
  atomic_store(&gw__abort_gap_hook, NULL);
  ck_assert_int_eq(gw_comm_destroy(a), GW_SUCCESS);
  pthread_t in;
  ck_assert_int_eq(pthread_create(&in, NULL, init_next, &b), 0);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 20;
  void *ri;
  ck_assert_msg(pthread_timedjoin_np(in, &ri, &until) == 0, "the next init waited 20 s for an abort that never ends");
  ck_assert_msg(*(gw_result_t *)ri == GW_SUCCESS && b == a, "the next init: %s", gw_comm_last_error(NULL));
  float x = 2;
  ck_assert_msg(gw_allreduce(&x, &x, 1, GW_FLOAT32, GW_SUM, b, NULL) == GW_SUCCESS && x == 2, "%s",
                gw_comm_last_error(b));
  ck_assert_int_eq(gw_comm_destroy(b), GW_SUCCESS);
}
END_TEST

/* fork while a parent's thread registers buffers and makes and destroys
 * bucketers: the child's own communicator does the same, and does not hang.
 * The registrations' list lock and the bucketers' quarantine lock were not
 * held across fork: a parent's thread inside either at the fork left it
 * held in the child for good (about 1 fork in 100 hung). */
static _Atomic bool leaves_stop;
static void *leaf_registers(void *arg) {
  float buf[8];
  while (!atomic_load(&leaves_stop)) {
    void *h;
    if (gw_comm_register(arg, buf, sizeof buf, &h) == GW_SUCCESS) gw_comm_deregister(arg, h);
  }
  return NULL;
}

static void *leaf_bucketers(void *arg) {
  float buf[8];
  const size_t bounds[2] = {0, 8};
  while (!atomic_load(&leaves_stop)) {
    gw_bucketer_t b;
    if (gw_bucketer_create(arg, buf, 8, GW_FLOAT32, GW_SUM, bounds, 1, &b) == GW_SUCCESS) gw_bucketer_destroy(b);
  }
  return NULL;
}

static int child_registers(void) {
  signal(SIGALRM, SIG_DFL); /* Check's handler, inherited, kills the whole test with SIGKILL */
  alarm(10);                /* a hang is a failure */
  gw_comm_t c;
  float buf[8];
  const size_t bounds[2] = {0, 8};
  void *h = NULL;
  gw_bucketer_t b = NULL;
  if (gw_comm_init(&c, 1, 0, NULL) != GW_SUCCESS) return 3;
  if (gw_comm_register(c, buf, sizeof buf, &h) != GW_SUCCESS || gw_comm_deregister(c, h) != GW_SUCCESS) return 4;
  if (gw_bucketer_create(c, buf, 8, GW_FLOAT32, GW_SUM, bounds, 1, &b) != GW_SUCCESS) return 5;
  gw_bucketer_destroy(b);
  return gw_comm_destroy(c) == GW_SUCCESS ? 0 : 6;
}

START_TEST(test_fork_leaves_no_lock_held) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  /* The sanitizers' allocators (GCC 12's) keep their own locks over fork:
   * a child's first malloc hangs on one about 1 fork in 30, whatever
   * gradwire does. */
  printf("test_fork_leaves_no_lock_held: not run under a sanitizer\n");
  return;
#endif
  gw_comm_t comm;
  ck_assert_int_eq(gw_comm_init(&comm, 1, 0, NULL), GW_SUCCESS);
  atomic_store(&leaves_stop, false);
  pthread_t t[2];
  ck_assert_int_eq(pthread_create(&t[0], NULL, leaf_registers, comm), 0);
  ck_assert_int_eq(pthread_create(&t[1], NULL, leaf_bucketers, comm), 0);
  int failed = 0, first = -1, status = 0;
  for (int i = 0; i < 600 && !failed; i++) {
    const pid_t p = fork();
    if (p == 0) _exit(child_registers());
    if (p < 0 || waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++, first = i;
  }
  atomic_store(&leaves_stop, true);
  pthread_join(t[0], NULL), pthread_join(t[1], NULL);
  ck_assert_int_eq(gw_comm_destroy(comm), GW_SUCCESS);
  ck_assert_msg(!failed, "fork %d: the child %s (status 0x%x)", first,
                WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? "hung" : "failed", status);
}
END_TEST

void add_destroy_tests(TCase *tc) {
  tcase_add_test(tc, test_destroy_refused_in_use);
  tcase_add_test(tc, test_destroy_races);
  tcase_add_test(tc, test_stale_abort_leaves_next_comm);
  tcase_add_test(tc, test_stale_abort_held_up);
  tcase_add_test(tc, test_abort_left_midway);
  tcase_add_test(tc, test_fork_leaves_no_lock_held);
}
