/* test_api.c - the API's contract beyond the data: bad arguments return
 * GW_ERR_INVALID_ARGUMENT with a message (never a crash) (calls that differ
 * across ranks: test_mismatch.c), a rank that never calls makes its
 * peers time out with a message naming it, the rendezvous refuses a wrong job
 * token and a world-size mismatch, non-blocking operations complete in order,
 * and no segment is left in /dev/shm (the launchers' environment:
 * test_api_env.c). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h" /* gw__fnv; the peers' pid namespaces and the ring's transport */
#include "harness.h"

void add_straggler_tests(TCase *tc); /* test_api_straggler.c */
void add_destroy_tests(TCase *tc);   /* test_api_destroy.c */
void add_env_tests(TCase *tc);       /* test_api_env.c */

/* ---- bad arguments (one rank: no peers needed for the checks) ---- */
START_TEST(test_bad_arguments) {
  gw_comm_t comm;
  float x[4] = {1, 2, 3, 4}, y[4];
  ck_assert_int_eq(gw_comm_init(&comm, 1, 0, NULL), GW_SUCCESS);
  ck_assert_int_eq(gw_allreduce(NULL, y, 4, GW_FLOAT32, GW_SUM, comm, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(comm), "sendbuf is NULL"));
  ck_assert_int_eq(gw_allreduce(x, NULL, 4, GW_FLOAT32, GW_SUM, comm, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(comm), "recvbuf is NULL"));
  ck_assert_int_eq(gw_allreduce(NULL, NULL, 0, GW_FLOAT32, GW_SUM, comm, NULL), GW_SUCCESS);
  ck_assert_int_eq(gw_allreduce(x, y, 4, (gw_dtype_t)42, GW_SUM, comm, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(comm), "unknown dtype 42"));
  ck_assert_int_eq(gw_allreduce(x, y, 4, GW_FLOAT32, (gw_op_t)-1, comm, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(comm), "unknown reduction op"));
  /* a refused non-blocking call leaves no stale handle (a cleanup's gw_wait read it) */
  gw_request_t rq = (gw_request_t)(uintptr_t)0x1;
  ck_assert_int_eq(gw_iallreduce(x, y, 4, (gw_dtype_t)42, GW_SUM, comm, NULL, &rq), GW_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(rq);
  /* NULL arguments of the other calls are named too (the message was stale) */
  ck_assert_int_eq(gw_comm_rank(comm, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(comm), "gw_comm_rank: a NULL argument"));
  int size;
  ck_assert_int_eq(gw_comm_size(NULL, &size), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "gw_comm_size: a NULL communicator"));
  ck_assert_int_eq(gw_wait(NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "gw_wait: a NULL request pointer"));
  ck_assert_int_eq(gw_broadcast(x, y, 4, GW_FLOAT32, 1, comm, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(comm), "root 1"));
  ck_assert_int_eq(gw_allreduce(x, x + 1, 2, GW_FLOAT32, GW_SUM, comm, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(comm), "overlap"));
  /* A stream where no device layer exists (on a GPU machine &dummy is no stream). */
  int dummy, dev = 0;
  ck_assert_int_eq(gw_comm_device(comm, &dev), GW_SUCCESS);
  if (dev < 0 && !getenv("GW_DEV_EMULATE")) {
    ck_assert_int_eq(gw_allreduce(x, y, 4, GW_FLOAT32, GW_SUM, comm, &dummy), GW_ERR_UNSUPPORTED);
    ck_assert(has(gw_comm_last_error(comm), "stream"));
  }
  ck_assert_int_eq(gw_iallreduce(x, y, 4, GW_FLOAT32, GW_SUM, comm, NULL, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(gw_allreduce(x, y, 4, GW_FLOAT32, GW_SUM, NULL, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "comm is NULL"));
  ck_assert_int_eq(gw_allreduce(x, y, SIZE_MAX / 2, GW_FLOAT32, GW_SUM, comm, NULL), GW_ERR_INVALID_ARGUMENT);
  /* a valid call after all the bad ones still works: they never touched the ring */
  ck_assert_int_eq(gw_allreduce(x, y, 4, GW_FLOAT32, GW_AVG, comm, NULL), GW_SUCCESS);
  ck_assert(y[0] == 1 && y[3] == 4);
  ck_assert_int_eq(gw_comm_destroy(comm), GW_SUCCESS);
  ck_assert_int_eq(gw_comm_destroy(NULL), GW_SUCCESS);

  ck_assert_int_eq(gw_comm_init(&comm, 2, 2, "127.0.0.1:1"), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "rank 2 is not valid for 2 ranks"));
  ck_assert_int_eq(gw_comm_init(&comm, 0, 0, NULL), GW_ERR_INVALID_ARGUMENT);
  /* a world no machine holds: refused as such (it was "out of memory", a system error) */
  ck_assert_int_eq(gw_comm_init(&comm, INT_MAX, 1, "127.0.0.1:1"), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "gw_comm_init: 2147483647 ranks, more than a communicator takes (1048576)"));
  ck_assert_int_eq(gw_comm_init(&comm, 2, 0, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(gw_comm_init(&comm, 2, 1, "no-port-here"), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "not HOST:PORT"));
  ck_assert_int_eq(gw_comm_init(NULL, 1, 0, NULL), GW_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(gw_wait(NULL), GW_ERR_INVALID_ARGUMENT);
  gw_request_t none = NULL;
  ck_assert_int_eq(gw_wait(&none), GW_SUCCESS);
  ck_assert_str_eq(gw_strerror(GW_ERR_TIMEOUT), "timeout");
  ck_assert_int_eq(gw_dtype_from_name("bf16"), GW_BFLOAT16);
  ck_assert_int_eq(gw_dtype_from_name("float"), GW_FLOAT32);
  ck_assert_int_eq(gw_op_from_name("avg"), GW_AVG);
  ck_assert_int_eq(gw_dtype_from_name("complex"), -1);
  ck_assert_uint_eq(gw_dtype_size(GW_BFLOAT16), 2);
  ck_assert_uint_eq(gw_dtype_size((gw_dtype_t)99), 0);
}
END_TEST


int count_segments(void);

/* ---- a rank killed on this machine: the others fail fast, naming it ---- */
/* rank 1 dies on purpose: exactly one rank fails */
START_TEST(test_killed_rank_shm) {
  double limit = 15;
  ck_assert_int_eq(run_ranks(3, body_rank1_killed, &limit, 90), 1);
  ck_assert_int_eq(count_segments(), 0); /* kill -9 leaves nothing in /dev/shm */
}
END_TEST


/* ---- ranks that chose different algorithms for one call ----
 * At 2 ranks the exchange and the ring move the same chunks over the same
 * connections, so only the header's record of the choice tells them apart:
 * gw_comm_set_algo at different points fails with both choices named instead
 * of computing different sums. */
static int body_algo_differs(gw_comm_t comm, int rank, int n, void *arg) {
  (void)n, (void)arg;
  gw_comm_set_timeout(comm, 20);
  EXPECT(gw_comm_set_algo(comm, rank == 0 ? "exchange" : "ring", "simple") == GW_SUCCESS, "set_algo: %s",
         gw_comm_last_error(comm));
  static float buf[131072];
  for (size_t i = 0; i < 131072; i++) buf[i] = (float)(rank + 1);
  gw_result_t r = gw_allreduce(buf, buf, 131072, GW_FLOAT32, GW_SUM, comm, NULL);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT || r == GW_ERR_REMOTE, "returned %s", gw_strerror(r));
  EXPECT(has(msg, "by exchange/simple") && has(msg, "by ring/simple"), "message does not name both choices: %s", msg);
  return 0;
}

static int raw_exchange_max_differs(int rank, int n, const char *master, void *arg) {
  (void)arg;
  setenv("GW_EXCHANGE_MAX_BYTES", rank == 1 ? "1048576" : "262144", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), "GW_EXCHANGE_MAX_BYTES=1048576"),
         "init returned %s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_algorithm_choice_must_agree) {
  ck_assert_int_eq(run_ranks(2, body_algo_differs, NULL, 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_exchange_max_differs, NULL, 60), 0);
}
END_TEST

/* ---- rendezvous: wrong token refused, world-size mismatch reported ---- */
static int body_wrong_token(int rank, int n, const char *master, void *arg) {
  (void)arg;
  if (rank == 1) setenv("GW_JOB_TOKEN", "not-the-token", 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "3", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r != GW_SUCCESS, "init with a wrong token succeeded");
  if (rank == 1) EXPECT(has(gw_comm_last_error(NULL), "wrong job token"), "message: %s", gw_comm_last_error(NULL));
  if (rank == 0) /* missing ranks named, and the address rank 0 listens on */
    EXPECT(r == GW_ERR_TIMEOUT && has(gw_comm_last_error(NULL), "missing ranks: 1") &&
               has(gw_comm_last_error(NULL), "(listening on 127.0.0.1)"),
           "message: %s", gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_wrong_token_refused) { ck_assert_int_eq(run_ranks_raw(2, body_wrong_token, NULL, 60), 0); }
END_TEST

/* Rank 2 never comes: rank 0 names it, and so does rank 1, which joined (it
 * used to see only that it lost rank 0). */
static int body_missing_rank(int rank, int n, const char *master, void *arg) {
  (void)arg;
  if (rank == 2) return 0;
  setenv("GW_BOOTSTRAP_TIMEOUT", "3", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  EXPECT(r != GW_SUCCESS && has(gw_comm_last_error(NULL), "missing ranks: 2"), "rank %d: init returned %s: %s", rank,
         gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_missing_rank_named) { ck_assert_int_eq(run_ranks_raw(3, body_missing_rank, NULL, 60), 0); }
END_TEST

static int body_size_mismatch(int rank, int n, const char *master, void *arg) {
  (void)arg, (void)n;
  setenv("GW_BOOTSTRAP_TIMEOUT", "5", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, rank == 1 ? 3 : 2, rank, master);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT || r == GW_ERR_REMOTE, "init returned %s", gw_strerror(r));
  EXPECT(has(gw_comm_last_error(NULL), "world size mismatch"), "message: %s", gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_world_size_mismatch) { ck_assert_int_eq(run_ranks_raw(2, body_size_mismatch, NULL, 60), 0); }
END_TEST

static int body_no_master(int rank, int n, const char *master, void *arg) {
  (void)arg, (void)master;
  setenv("GW_BOOTSTRAP_TIMEOUT", "1", 1);
  gw_comm_t comm;
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
  gw_result_t r = gw_comm_init(&comm, n + 1, 1, addr);
  EXPECT(r == GW_ERR_TIMEOUT && has(gw_comm_last_error(NULL), "no answer from master"), "returned %s: %s",
         gw_strerror(r), gw_comm_last_error(NULL));
  (void)rank;
  return 0;
}

START_TEST(test_master_absent) { ck_assert_int_eq(run_ranks_raw(1, body_no_master, NULL, 30), 0); }
END_TEST

/* The rendezvous routes records to the ranks they are for, through rank 0,
 * which sends each rank only its own (the connection handles: an allgather
 * sent every rank all of them, O(n^2 k) bytes).  Each rank sends records to
 * the next two ranks and one for nobody; each gets exactly its two, with
 * their origins and contents; rank 0 sent 2 (n - 1) records in all. */
struct routed {
  int32_t dest, from, k, pad;
  char text[40];
};

static int raw_route(int rank, int n, const char *master, void *arg) {
  (void)arg;
  struct gw_bootstrap *bs;
  struct gw_errctx err = {{0}};
  EXPECT(gw__bootstrap_init(&bs, rank, n, master, getenv("GW_JOB_TOKEN"), 30, &err) == GW_SUCCESS, "init: %s",
         err.msg);
  struct routed mine[3], got[4];
  int32_t origin[4];
  for (int k = 0; k < 3; k++) {
    mine[k] = (struct routed){.dest = k < 2 ? (rank + 1 + k) % n : -1, .from = rank, .k = k};
    snprintf(mine[k].text, sizeof mine[k].text, "from %d to %d", rank, mine[k].dest);
  }
  const uint64_t before = gw__bootstrap_root_bytes();
  int ngot = -1;
  EXPECT(gw__bootstrap_route(bs, mine, 3, sizeof *mine, got, origin, 4, &ngot, &err) == GW_SUCCESS, "route: %s",
         err.msg);
  EXPECT(ngot == 2, "rank %d got %d records", rank, ngot);
  for (int i = 0; i < ngot; i++) {
    const int o = origin[i], k = (rank - o - 1 + 2 * n) % n;
    char want[40];
    snprintf(want, sizeof want, "from %d to %d", o, rank);
    EXPECT(got[i].dest == rank && got[i].from == o && got[i].k == k && !strcmp(got[i].text, want),
           "rank %d: record %d from %d: dest %d from %d k %d '%s'", rank, i, o, got[i].dest, got[i].from, got[i].k,
           got[i].text);
  }
  if (ngot == 2) EXPECT(origin[0] < origin[1] || n == 2, "rank %d: origins %d, %d out of order", rank, origin[0], origin[1]);
  if (rank == 0) {
    const uint64_t sent = gw__bootstrap_root_bytes() - before, want = 2ull * (uint64_t)(n - 1) * (4 + sizeof *mine);
    EXPECT(sent == want, "rank 0 sent %llu bytes, expected %llu (2 records to each other rank)",
           (unsigned long long)sent, (unsigned long long)want);
  }
  /* more for a rank than it makes room for: an error, not an overrun */
  for (int k = 0; k < 3; k++) mine[k].dest = 0;
  gw_result_t r = gw__bootstrap_route(bs, mine, 3, sizeof *mine, got, origin, 4, &ngot, &err);
  EXPECT(rank == 0 ? r == GW_ERR_INTERNAL && strstr(err.msg, "not up to 4 records") : r == GW_SUCCESS && ngot == 0,
         "rank %d: overflow returned %s, %d records: %s", rank, gw_strerror(r), ngot, err.msg);
  for (int k = 0; k < 3; k++) mine[k].dest = 1; /* and for another rank: it says so */
  r = gw__bootstrap_route(bs, mine, 3, sizeof *mine, got, origin, 4, &ngot, &err);
  EXPECT(rank == 1 ? r == GW_ERR_INTERNAL && strstr(err.msg, "more than the 4") : r == GW_SUCCESS && ngot == 0,
         "rank %d: overflow for rank 1 returned %s, %d records: %s", rank, gw_strerror(r), ngot, err.msg);
  gw__bootstrap_free(bs);
  return 0;
}

START_TEST(test_bootstrap_route) {
  ck_assert_int_eq(run_ranks_raw(2, raw_route, NULL, 60), 0);
  ck_assert_int_eq(run_ranks_raw(5, raw_route, NULL, 60), 0);
}
END_TEST

/* A socket listening on a free loopback port; addr gets "127.0.0.1:PORT". */
static int listen_loopback(char *addr, size_t len) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &al) != 0)
    return -1;
  snprintf(addr, len, "127.0.0.1:%d", ntohs(a.sin_port));
  return fd;
}

/* A master name that never resolves: named with the resolver's reason, not
 * "no route; is rank 0 running?". */
static int body_master_unresolvable(int rank, int n, const char *master, void *arg) {
  (void)rank, (void)n, (void)master, (void)arg;
  setenv("GW_BOOTSTRAP_TIMEOUT", "1", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, 2, 1, "no-such-host.invalid:29500");
  EXPECT(r == GW_ERR_TIMEOUT && has(gw_comm_last_error(NULL), "cannot resolve the master's name"), "returned %s: %s",
         gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_master_unresolvable) { ck_assert_int_eq(run_ranks_raw(1, body_master_unresolvable, NULL, 30), 0); }
END_TEST

/* Another service on the master's port (it answers with its own banner): the
 * rank says so instead of "lost the bootstrap connection: did it exit?". */
static void *ssh_like(void *arg) {
  int fd = accept(*(int *)arg, NULL, NULL);
  const char banner[] = "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n";
  if (fd >= 0 && write(fd, banner, sizeof banner - 1) > 0) sleep(3);
  if (fd >= 0) close(fd);
  return NULL;
}

static int body_master_foreign(int rank, int n, const char *master, void *arg) {
  (void)rank, (void)n, (void)master, (void)arg;
  char addr[64];
  int fd = listen_loopback(addr, sizeof addr);
  EXPECT(fd >= 0, "listen: %s", strerror(errno));
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, ssh_like, &fd) == 0, "thread");
  setenv("GW_BOOTSTRAP_TIMEOUT", "5", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, 2, 1, addr);
  EXPECT(r == GW_ERR_REMOTE && has(gw_comm_last_error(NULL), "another service listening"), "returned %s: %s",
         gw_strerror(r), gw_comm_last_error(NULL));
  pthread_join(th, NULL);
  close(fd);
  return 0;
}

START_TEST(test_master_foreign) { ck_assert_int_eq(run_ranks_raw(1, body_master_foreign, NULL, 30), 0); }
END_TEST

/* A master that takes the connection (the kernel's backlog does) and never
 * answers: the rank gives up after its timeout plus the grace it allows rank 0,
 * and says how long it waited. */
static int body_master_silent(int rank, int n, const char *master, void *arg) {
  (void)rank, (void)n, (void)master, (void)arg;
  char addr[64];
  int fd = listen_loopback(addr, sizeof addr);
  EXPECT(fd >= 0, "listen: %s", strerror(errno));
  setenv("GW_BOOTSTRAP_TIMEOUT", "1", 1);
  gw_comm_t comm;
  double t0 = test_now();
  gw_result_t r = gw_comm_init(&comm, 2, 1, addr);
  double took = test_now() - t0;
  EXPECT(r == GW_ERR_TIMEOUT && has(gw_comm_last_error(NULL), "rank 0 did not answer within 2 s"), "returned %s: %s",
         gw_strerror(r), gw_comm_last_error(NULL));
  EXPECT(took > 1.8 && took < 10, "gave up after %.1f s", took);
  close(fd);
  return 0;
}

START_TEST(test_master_silent) { ck_assert_int_eq(run_ranks_raw(1, body_master_silent, NULL, 30), 0); }
END_TEST

/* ---- non-blocking: many outstanding, completed in call order ---- */
static int body_nonblocking(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { K = 16, N = 100003 };
  static int32_t bufs[K][N];
  gw_request_t reqs[K];
  for (int k = 0; k < K; k++) {
    for (int i = 0; i < N; i++) bufs[k][i] = rank * k + i;
    EXPECT(gw_iallreduce(bufs[k], bufs[k], N, GW_INT32, GW_SUM, comm, NULL, &reqs[k]) == GW_SUCCESS, "iallreduce %d", k);
  }
  /* a blocking call queued behind them runs after them */
  int64_t one = 1;
  EXPECT(gw_allreduce(&one, &one, 1, GW_INT64, GW_SUM, comm, NULL) == GW_SUCCESS && one == n, "blocking sum");
  for (int k = K - 1; k >= 0; k--) {
    if (k % 2) { /* already done: the blocking call ran after every operation called before it */
      int done = 0;
      EXPECT(gw_test(&reqs[k], &done) == GW_SUCCESS && done, "op %d was not done when a later blocking call returned",
             k);
      EXPECT(reqs[k] == NULL, "request not cleared");
    } else {
      EXPECT(gw_wait(&reqs[k]) == GW_SUCCESS, "wait %d", k);
    }
    int32_t rsum = n * (n - 1) / 2;
    for (int i = 0; i < N; i++) EXPECT(bufs[k][i] == rsum * k + n * i, "op %d element %d: %d", k, i, bufs[k][i]);
  }
  gw_request_t rq;
  EXPECT(gw_ibarrier(comm, &rq) == GW_SUCCESS && gw_wait(&rq) == GW_SUCCESS, "ibarrier");
  double b[3] = {rank, 1, 2};
  EXPECT(gw_ibroadcast(b, b, 3, GW_FLOAT64, n - 1, comm, NULL, &rq) == GW_SUCCESS && gw_wait(&rq) == GW_SUCCESS, "ibroadcast");
  EXPECT(b[0] == n - 1, "broadcast value %g", b[0]);
  int32_t g[8], mine = rank * 10;
  EXPECT(gw_iallgather(&mine, g, 1, GW_INT32, comm, NULL, &rq) == GW_SUCCESS && gw_wait(&rq) == GW_SUCCESS, "iallgather");
  for (int r = 0; r < n; r++) EXPECT(g[r] == r * 10, "allgather[%d] = %d", r, g[r]);
  int32_t rs_in[8], rs_out;
  for (int r = 0; r < n; r++) rs_in[r] = r + rank;
  EXPECT(gw_ireduce_scatter(rs_in, &rs_out, 1, GW_INT32, GW_MAX, comm, NULL, &rq) == GW_SUCCESS && gw_wait(&rq) == GW_SUCCESS,
         "ireduce_scatter");
  EXPECT(rs_out == rank + n - 1, "reduce_scatter max %d", rs_out);
  return 0;
}

START_TEST(test_nonblocking) { ck_assert_int_eq(run_ranks(3, body_nonblocking, NULL, 120), 0); }
END_TEST

/* Two threads of each rank calling blocking allreduces on one communicator at
 * once (calls of the same shape, so any pairing across ranks is right): they
 * run one after the other.  Both ran inline at once, sharing the
 * connections' state: slots claimed twice, chunks under the other call's
 * header, wrong sums or a hang. */
struct two_threads {
  gw_comm_t comm;
  int n, bad;
  gw_result_t r;
};

static void *hammer(void *arg) {
  struct two_threads *t = arg;
  int32_t buf[2048];
  for (int it = 0; it < 150 && t->r == GW_SUCCESS && !t->bad; it++) {
    for (int i = 0; i < 2048; i++) buf[i] = 1;
    t->r = gw_allreduce(buf, buf, 2048, GW_INT32, GW_SUM, t->comm, NULL);
    for (int i = 0; i < 2048 && t->r == GW_SUCCESS; i++) t->bad |= buf[i] != t->n;
  }
  return NULL;
}

static int body_two_threads(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  struct two_threads t[2] = {{comm, n, 0, GW_SUCCESS}, {comm, n, 0, GW_SUCCESS}};
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, hammer, &t[1]) == 0, "pthread_create");
  hammer(&t[0]);
  pthread_join(th, NULL);
  for (int k = 0; k < 2; k++)
    EXPECT(t[k].r == GW_SUCCESS && !t[k].bad, "rank %d thread %d: %s, %s", rank, k, gw_strerror(t[k].r),
           t[k].bad ? "wrong sums" : "sums right");
  return 0;
}

START_TEST(test_two_threads_one_comm) { ck_assert_int_eq(run_ranks(2, body_two_threads, NULL, 120), 0); }
END_TEST

/* One buffer as both send and receive buffer is in place for allgather and
 * reduce_scatter only on rank 0 (the layout puts a rank's part at its
 * offset); on another rank it overlaps (reduce_scatter wrote its output over
 * the input it was still sending from), refused before any data moves. */
static int body_equal_pointers(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int32_t buf[64];
  for (int i = 0; i < 64; i++) buf[i] = rank;
  if (rank == 1) {
    gw_result_t r = gw_reduce_scatter(buf, buf, 8, GW_INT32, GW_SUM, comm, NULL);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "overlap without being the in-place layout"),
           "reduce_scatter(buf, buf) on rank 1: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
    r = gw_allgather(buf, buf, 8, GW_INT32, comm, NULL);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "overlap without being the in-place layout"),
           "allgather(buf, buf) on rank 1: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
  }
  /* Elements away from their alignment (a float at an odd address: C's
   * undefined behaviour, the reduction's vector loops may fault): refused,
   * naming the buffer; bytes may be anywhere. */
  {
    char raw[64] __attribute__((aligned(16)));
    gw_result_t r = gw_allreduce(raw + 1, raw + 1, 4, GW_FLOAT32, GW_SUM, comm, NULL);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "sendbuf") &&
               has(gw_comm_last_error(comm), "is not aligned to its 4-byte elements"),
           "a misaligned float buffer: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
    r = gw_allgather(raw + 1, raw + 32, 4, GW_BFLOAT16, comm, NULL);
    EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(comm), "sendbuf"),
           "a misaligned bfloat16 send buffer: %s: %s", gw_strerror(r), gw_comm_last_error(comm));
    for (int i = 0; i < 64; i++) raw[i] = (char)(rank + 1);
    r = gw_allreduce(raw + 1, raw + 33, 5, GW_INT8, GW_SUM, comm, NULL);
    EXPECT(r == GW_SUCCESS && raw[33] == (char)(n * (n + 1) / 2), "int8 at odd addresses: %s, %d", gw_strerror(r),
           raw[33]);
  }
  /* Refused calls take no sequence number: the next call pairs up; the
   * in-place layouts work everywhere. */
  for (int i = 0; i < 64; i++) buf[i] = rank * 100 + i;
  EXPECT(gw_allgather(buf + rank * 8, buf, 8, GW_INT32, comm, NULL) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
  for (int r = 0; r < n; r++)
    for (int i = 0; i < 8; i++)
      EXPECT(buf[r * 8 + i] == r * 100 + r * 8 + i, "allgather in place: element %d of rank %d is %d", i, r,
             buf[r * 8 + i]);
  for (int i = 0; i < 64; i++) buf[i] = i;
  EXPECT(gw_reduce_scatter(buf, buf + rank * 8, 8, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS, "%s",
         gw_comm_last_error(comm));
  for (int i = 0; i < 8; i++)
    EXPECT(buf[rank * 8 + i] == n * (rank * 8 + i), "reduce_scatter in place: element %d is %d", i, buf[rank * 8 + i]);
  return 0;
}

START_TEST(test_equal_pointers_refused) { ck_assert_int_eq(run_ranks(2, body_equal_pointers, NULL, 60), 0); }
END_TEST

/* Ranks in pid namespaces of their own that share /dev/shm (a pod's
 * containers): their pids mean nothing to each other, yet a killed rank is
 * noticed within seconds (its liveness lock goes with it), not at GW_TIMEOUT. */
static int body_other_pidns_killed(gw_comm_t comm, int rank, int n, void *arg) {
  EXPECT(comm->peers[0].pidns != comm->peers[1].pidns, "both ranks in pid namespace %llu",
         (unsigned long long)comm->peers[0].pidns);
  EXPECT(!strcmp(comm->rings[0].send.tp->name, "shm"), "ring uses %s, not shm", comm->rings[0].send.tp->name);
  EXPECT(comm->alive_fds && comm->alive_fds[1 - rank] >= 0, "rank %d does not watch rank %d's lock", rank, 1 - rank);
  if (body_rank1_killed(comm, rank, n, arg) != 0) return 1;
  EXPECT(has(gw_comm_last_error(comm), "in another pid namespace"), "%s", gw_comm_last_error(comm));
  return 0;
}

/* The same with a child that rank 1 forked without exec (a data loader's
 * worker) still running after the rank is killed: it inherited the lock's
 * descriptor, which kept the lock until the child ended (here until rank 0
 * says it is done, or 20 s) where only a fork handler closing it in the child
 * lets the lock go with the rank. */
static void release_path(char *buf, size_t len) {
  snprintf(buf, len, "/tmp/gw-test-release-%s", getenv("GW_JOB_TOKEN") ? getenv("GW_JOB_TOKEN") : "none");
}

static int body_other_pidns_killed_forked(gw_comm_t comm, int rank, int n, void *arg) {
  char release[256];
  release_path(release, sizeof release);
  if (rank == 1 && fork() == 0) {
    for (int i = 0; i < 400 && access(release, F_OK) != 0; i++) usleep(50000);
    _exit(0);
  }
  int rc = body_other_pidns_killed(comm, rank, n, arg);
  if (rank == 0) close(open(release, O_CREAT | O_WRONLY, 0600));
  return rc;
}

/* Runs the rank as pid 2 of a new pid namespace (pid 1 of one ignores its own
 * SIGKILL); pid 1 waits for it (and for what it forked) and goes with its
 * parent.  arg non-NULL: rank 1 forks a child first (above). */
static int raw_own_pidns(int rank, int n, const char *master, void *arg) {
  if (unshare(CLONE_NEWPID) != 0) return 3;
  pid_t init = fork();
  if (init == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* the harness's kill on a timeout takes the namespace */
    pid_t p = fork();
    if (p == 0) {
      gw_comm_t comm;
      gw_result_t r = gw_comm_init(&comm, n, rank, master);
      if (r != GW_SUCCESS) {
        fprintf(stderr, "rank %d: gw_comm_init: %s\n", rank, gw_comm_last_error(NULL));
        _exit(1);
      }
      double limit = 15;
      int rc = arg ? body_other_pidns_killed_forked(comm, rank, n, &limit)
                   : body_other_pidns_killed(comm, rank, n, &limit);
      gw_comm_destroy(comm);
      fflush(NULL);
      _exit(rc);
    }
    int st = 0;
    waitpid(p, &st, 0);
    while (wait(NULL) > 0) { /* orphans of the rank come to pid 1 */
    }
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 2);
  }
  int st = 0;
  waitpid(init, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 2;
}

static int try_unshare_pidns(void *arg) {
  (void)arg;
  return unshare(CLONE_NEWPID) == 0 ? 0 : 1;
}

START_TEST(test_killed_rank_other_pidns) {
  if (run_in_child(try_unshare_pidns, NULL) != 0) {
    printf("test_killed_rank_other_pidns: cannot make pid namespaces here (not root?): not run\n");
    return;
  }
  /* Rank 1's body kills it (exit 2 through its pid 1); rank 0 must pass. */
  ck_assert_int_eq(run_ranks_raw(2, raw_own_pidns, NULL, 90), 1);
  ck_assert_int_eq(count_segments(), 0);
  /* again with a child of rank 1 left running (until rank 0 is done) */
  ck_assert_int_eq(run_ranks_raw(2, raw_own_pidns, "forked", 90), 1);
  char release[256];
  release_path(release, sizeof release);
  unlink(release);
  ck_assert_int_eq(count_segments(), 0);
}
END_TEST

/* ---- nothing left in /dev/shm ---- */
/* Segments in /dev/shm of the job run_ranks ran last (names carry the low
 * 32 bits of the FNV-1a hash of its GW_JOB_TOKEN, as transport/shm.c names
 * them), so other jobs on the machine, such as concurrent tests, cannot move the
 * count. */
int count_segments(void) {
  const char *token = getenv("GW_JOB_TOKEN");
  ck_assert_msg(token != NULL, "no job has run yet");
  uint64_t h = gw__fnv(GW_FNV_START, token, strlen(token)); /* the job hash in the names (comm.c) */
  char prefix[32];
  snprintf(prefix, sizeof prefix, "gw-%08llx-", (unsigned long long)(h & 0xffffffffu));
  DIR *d = opendir("/dev/shm");
  ck_assert_msg(d != NULL, "/dev/shm: %s", strerror(errno));
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
  closedir(d);
  return n;
}

/* A /dev/shm too small for the FIFOs (a container's default is 64 MiB):
 * tmpfs sizes a file without reserving its pages and MAP_POPULATE skips what
 * it cannot get, so the first store to a missing page killed the rank with
 * SIGBUS.  Now init fails naming /dev/shm and the settings.  Here a 1 MiB
 * tmpfs in a mount namespace of its own, 8 slots of 1 MiB per FIFO. */
static int raw_small_shm(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  const char *msg = gw_comm_last_error(NULL);
  /* and the setting that makes fewer FIFOs */
  EXPECT(r != GW_SUCCESS && has(msg, "/dev/shm") && has(msg, "GW_SHM_SLOT_BYTES") && has(msg, "GW_ALGO=ring"),
         "rank %d: %s: %s", rank, gw_strerror(r), msg);
  return 0;
}

static int in_small_dev_shm(void *arg) {
  (void)arg;
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") != 0)
    return 77;
  setenv("GW_SHM_SLOT_BYTES", "1048576", 1);
  return run_ranks_raw(2, raw_small_shm, NULL, 60);
}

START_TEST(test_small_dev_shm) {
  int r = run_in_child(in_small_dev_shm, NULL);
  if (r == 77) {
    printf("test_small_dev_shm: cannot mount a tmpfs in a mount namespace here (not root?): not run\n");
    return;
  }
  ck_assert_int_eq(r, 0);
}
END_TEST

static int body_sum(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  int32_t v = rank;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS && v == n * (n - 1) / 2, "sum");
  return 0;
}

START_TEST(test_no_shm_leftovers) {
  ck_assert_int_eq(run_ranks(4, body_sum, NULL, 60), 0);
  ck_assert_int_eq(count_segments(), 0);
  /* The count sees a name of this job (it once hashed the token otherwise and saw nothing). */
  char probe[96];
  uint64_t h = gw__fnv(GW_FNV_START, getenv("GW_JOB_TOKEN"), strlen(getenv("GW_JOB_TOKEN")));
  snprintf(probe, sizeof probe, "/dev/shm/gw-%08llx-probe", (unsigned long long)(h & 0xffffffffu));
  FILE *f = fopen(probe, "w");
  ck_assert_msg(f != NULL, "%s: %s", probe, strerror(errno));
  fclose(f);
  int seen = count_segments();
  unlink(probe);
  ck_assert_int_eq(seen, 1);
}
END_TEST

/* What dead ranks of earlier jobs left in /dev/shm goes at a rank's first
 * init (transport/shm.c's sweep): a file of this pid namespace whose creator's
 * pid is free, and, of any namespace, one older than a minute whose lock
 * nobody holds (a container restarted with the pod's /dev/shm kept: its new
 * pid namespace never saw the pids, and those files stayed for good), and of
 * this namespace, an unlocked one older than the process now at its pid.  A
 * locked one (its creator maps it), a new one (made, not yet locked) and one
 * of a live pid changed since that process started stay. */
static void plant_file(const char *path, int age_s) {
  FILE *f = fopen(path, "w");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  fclose(f);
  struct timespec now; /* to the nanosecond: a whole second fell before a process started this second */
  clock_gettime(CLOCK_REALTIME, &now);
  now.tv_sec -= age_s;
  struct timespec t[2] = {now, now};
  ck_assert_int_eq(utimensat(AT_FDCWD, path, t, 0), 0);
}

/* A process's first sweep, with a file of its own pid an hour old and
 * unlocked (one rank per container, restarted with its /dev/shm kept and
 * given the same pid again): the file goes (a process skipped files of its
 * own pid, and the other ranks' sweeps came before it was planted here). */
static int own_pid_file_swept(void *arg) {
  (void)arg;
  char own[128];
  snprintf(own, sizeof own, "/dev/shm/gw-0badc0de-1-0-%d-11-deadbeef-%llu", (int)getpid(),
           (unsigned long long)gw__pidns_self());
  plant_file(own, 3600);
  gw__shm_sweep(); /* the first init's */
  const bool left = access(own, F_OK) == 0;
  unlink(own);
  return left;
}

START_TEST(test_dead_ranks_files_swept) {
  ck_assert_msg(run_in_child(own_pid_file_swept, NULL) == 0, "an old unlocked file of the sweeper's own pid stayed");
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ck_assert_int_eq(waitpid(dead, NULL, 0), dead); /* a pid now free (unless the kernel hands it out again) */
  const unsigned long long ns = (unsigned long long)gw__pidns_self();
  char gone_pid[128], other_old[128], other_locked[128], other_new[128], live_pid_old[128], live_pid_new[128],
      live_pid_old_locked[128];
  snprintf(gone_pid, sizeof gone_pid, "/dev/shm/gw-0badc0de-0-1-%d-7-deadbeef-%llu", (int)dead, ns);
  snprintf(other_old, sizeof other_old, "/dev/shm/gw-0badc0de-0-1-4242-7-deadbeef-%llu", ns + 1);
  snprintf(other_locked, sizeof other_locked, "/dev/shm/gw-0badc0de-0-1-4242-8-deadbeef-%llu", ns + 1);
  snprintf(other_new, sizeof other_new, "/dev/shm/gw-0badc0de-0-1-4242-9-deadbeef-%llu", ns + 1);
  snprintf(live_pid_old, sizeof live_pid_old, "/dev/shm/gw-0badc0de-0-1-%d-7-deadbeef-%llu", (int)getpid(), ns);
  snprintf(live_pid_new, sizeof live_pid_new, "/dev/shm/gw-0badc0de-0-1-%d-8-deadbeef-%llu", (int)getpid(), ns);
  snprintf(live_pid_old_locked, sizeof live_pid_old_locked, "/dev/shm/gw-0badc0de-0-1-%d-9-deadbeef-%llu",
           (int)getpid(), ns);
  plant_file(gone_pid, 0);
  plant_file(other_old, 3600);
  plant_file(other_locked, 3600);
  plant_file(other_new, 0);
  /* This process lives, but started after the file's last change: not its
   * creator but a later process given the pid (a restarted container's pid
   * namespace reuses the old one's number and pids): it goes, unless locked.
   * One changed since it started, unlocked, stays: its creator's lock may
   * have failed. */
  plant_file(live_pid_old, 3600);
  plant_file(live_pid_new, 0);
  plant_file(live_pid_old_locked, 3600);
  int lk = open(other_locked, O_RDWR | O_CLOEXEC), lk2 = open(live_pid_old_locked, O_RDWR | O_CLOEXEC);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  ck_assert(lk >= 0 && fcntl(lk, F_OFD_SETLK, &fl) == 0);
  ck_assert(lk2 >= 0 && fcntl(lk2, F_OFD_SETLK, &fl) == 0);
  ck_assert_int_eq(run_ranks(2, body_sum, NULL, 60), 0);
  const int gone_left = access(gone_pid, F_OK) == 0, old_left = access(other_old, F_OK) == 0,
            locked_left = access(other_locked, F_OK) == 0, new_left = access(other_new, F_OK) == 0,
            reused_left = access(live_pid_old, F_OK) == 0, live_new_left = access(live_pid_new, F_OK) == 0,
            reused_locked_left = access(live_pid_old_locked, F_OK) == 0;
  close(lk), close(lk2);
  unlink(gone_pid), unlink(other_old), unlink(other_locked), unlink(other_new), unlink(live_pid_old);
  unlink(live_pid_new), unlink(live_pid_old_locked);
  /* unless the kernel gave the dead pid to another process meanwhile (tests run side by side) */
  ck_assert_msg(!gone_left || kill(dead, 0) == 0, "a dead pid's file stayed");
  ck_assert_msg(!old_left, "another pid namespace's old unlocked file stayed");
  ck_assert_msg(!reused_left, "an unlocked file older than the process now at its pid stayed");
  ck_assert_msg(live_new_left, "an unlocked file of a live pid, changed since that process started, was removed");
  ck_assert_msg(reused_locked_left, "a locked file of a live pid was removed");
  ck_assert_msg(locked_left, "a locked file (its creator maps it) was removed");
  ck_assert_msg(new_left, "a file just made (not locked yet) was removed");
}
END_TEST

int main(void) {
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("api");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_bad_arguments);
  tcase_add_test(tc, test_algorithm_choice_must_agree);
  tcase_add_test(tc, test_killed_rank_shm);
  tcase_add_test(tc, test_killed_rank_other_pidns);
  tcase_add_test(tc, test_equal_pointers_refused);
  tcase_add_test(tc, test_world_size_mismatch);
  tcase_add_test(tc, test_bootstrap_route);
  add_env_tests(tc);
  tcase_add_test(tc, test_nonblocking);
  tcase_add_test(tc, test_two_threads_one_comm);
  add_destroy_tests(tc);
  tcase_add_test(tc, test_no_shm_leftovers);
  tcase_add_test(tc, test_dead_ranks_files_swept);
  tcase_add_test(tc, test_small_dev_shm);
  suite_add_tcase(s, tc);
  /* The cases that mostly sleep (a straggler kept alive past the others'
   * deadlines, a rank waiting for an abort; a rendezvous that cannot
   * complete, waiting out its timeout: 13 s of the api case's 20): about
   * 55 s, run by meson as a test of its own (CK_RUN_CASE=waits) beside the
   * others. */
  TCase *waits = tcase_create("waits");
  tcase_set_timeout(waits, 300);
  add_straggler_tests(waits);
  tcase_add_test(waits, test_wrong_token_refused);
  tcase_add_test(waits, test_missing_rank_named);
  tcase_add_test(waits, test_master_absent);
  tcase_add_test(waits, test_master_silent);
  tcase_add_test(waits, test_master_unresolvable);
  tcase_add_test(waits, test_master_foreign);
  suite_add_tcase(s, waits);
  return run_suite(s);
}
