/* test_ib.c - the ib transport over the user-space verbs emulator
 * (GW_IB_EMULATE=1): the transport choice; credits (a sender that runs out of
 * credits waits, and never overwrites a slot its receiver has not read), with one
 * queue pair and with chunks split over three; a bad rkey reported as a remote
 * access error naming the peer; GW_IB_HCA with two devices uses both, and a
 * name that is no device or a port that is no port number leaves ib
 * unavailable; a rank killed with SIGKILL (each rank on its own
 * "machine") makes the others fail quickly, naming it; the locked-memory limit
 * and slot settings that differ across ranks as clear errors; buffers
 * registered with gw_comm_register are sent from directly (registered once:
 * the cache), in place and out of place, and no longer after deregistering; a
 * registration held by writes in flight keeps its MR past its deregistration,
 * and operations end their holds; on RoCE the GID picked by version and
 * address, and ranks whose RoCE versions differ fail at init naming them.  The
 * collective grid over ib runs as separate meson tests (test_collectives). */
#include <check.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "comm.h"
#include "harness.h"
#include "ib_dev.h"
#include "ibemu.h"
#include "transport.h"

static void emulate(void) {
  setenv("GW_IB_EMULATE", "1", 1);
  setenv("GW_TRANSPORT", "ib", 1);
}

static int raw_no_port(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r == GW_ERR_UNSUPPORTED, "init without an ib port returned %s", gw_strerror(r));
  EXPECT(strstr(gw_comm_last_error(NULL), "ib"), "message does not mention ib: %s", gw_comm_last_error(NULL));
  return 0;
}

/* GW_TRANSPORT=ib with one rank's port disabled: both name that rank (they
 * said only that no transport connects them). */
static int raw_one_without_ib(int rank, int n, const char *master, void *arg) {
  (void)arg;
  emulate();
  if (rank == 1) setenv("GW_IB_DISABLE", "1", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  EXPECT(r != GW_SUCCESS && strstr(gw_comm_last_error(NULL), "rank 1 has no ib port to use"), "rank %d: %s: %s", rank,
         gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_one_rank_without_ib) { ck_assert_int_eq(run_ranks_raw(2, raw_one_without_ib, NULL, 60), 0); }
END_TEST

START_TEST(test_transport_choice) {
  setenv("GW_IB_EMULATE", "1", 1);
  unsetenv("GW_TRANSPORT");
  ck_assert_int_eq(run_ranks(3, body_uses_transport, "shm", 60), 0); /* one machine: shm first */
  emulate();
  ck_assert_int_eq(run_ranks(3, body_uses_transport, "ib", 60), 0);
  unsetenv("GW_IB_EMULATE");
  if (!gw__ib_available()) /* a machine without an HCA: forcing ib is a clear error */
    ck_assert_int_eq(run_ranks_raw(2, raw_no_port, NULL, 60), 0);
  unsetenv("GW_TRANSPORT");
}
END_TEST

/* Ports that cannot carry our RC queue pairs are not offered as ib (forcing
 * ib then fails at init, clearly, as without any port): a device of another
 * transport type (AWS's EFA: no RC queue pairs; connections between machines
 * failed instead of going over tcp), a GW_IB_GID_INDEX naming an empty entry
 * of the GID table (the port was used with the zero GID: every connection
 * failed after the retry timeout), on RoCE and on InfiniBand. */
START_TEST(test_unusable_ports) {
  /* (4294967296: an index past the table, which a cast to int made 0) */
  static const char *const cases[][2] = {{"efa", NULL}, {"eth", "9"}, {"ib", "5"}, {"ib", "4294967296"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    emulate();
    setenv("GW_IB_EMULATE_LINK", cases[i][0], 1);
    if (cases[i][1]) setenv("GW_IB_GID_INDEX", cases[i][1], 1);
    ck_assert_int_eq(run_ranks_raw(2, raw_no_port, NULL, 60), 0);
    unsetenv("GW_IB_GID_INDEX");
  }
  unsetenv("GW_IB_EMULATE_LINK");
  unsetenv("GW_IB_EMULATE");
  unsetenv("GW_TRANSPORT");
}
END_TEST

/* An allreduce over the connections: the sum of rank + 1 over n ranks. */
static int sum_of_ranks(gw_comm_t comm, int rank, int n) {
  int64_t v = rank + 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT64, GW_SUM, comm, NULL) == GW_SUCCESS && v == (int64_t)n * (n + 1) / 2,
         "rank %d: sum %lld", rank, (long long)v);
  return 0;
}

/* GW_IB_HCA with two (emulated) devices: the receiving ends of connections take
 * them in turn (and each sending end the device of its receiver's rail); a name
 * that is not a device leaves no port, so forcing ib fails at init. */
static int body_two_devices(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  bool dev[2] = {false, false};
  for (int t = 0; t < GW_NTREES; t++) {
    struct gw_conn *tc[6];
    gw__tree_conns(&comm->trees[t], tc);
    for (int i = 0; i < 6; i++)
      if (tc[i]->tp) {
        dev[0] |= strstr(tc[i]->desc, "gwemu0:1") != NULL;
        dev[1] |= strstr(tc[i]->desc, "gwemu1:1") != NULL;
      }
  }
  const struct gw_conn *ring[2] = {&comm->rings[0].send, &comm->rings[0].recv};
  for (int i = 0; i < 2; i++) {
    dev[0] |= strstr(ring[i]->desc, "gwemu0:1") != NULL;
    dev[1] |= strstr(ring[i]->desc, "gwemu1:1") != NULL;
  }
  EXPECT(dev[0] && dev[1], "rank %d's connections do not use both devices (ring: %s)", rank, comm->rings[0].send.desc);
  /* The two ends of each ring connection are on the same device (rail). */
  int32_t recv_dev = strstr(comm->rings[0].recv.desc, "gwemu1:1") != NULL, devs[8];
  EXPECT(gw_allgather(&recv_dev, devs, 1, GW_INT32, comm, NULL) == GW_SUCCESS, "allgather");
  const int32_t send_dev = strstr(comm->rings[0].send.desc, "gwemu1:1") != NULL;
  EXPECT(send_dev == devs[comm->rings[0].next], "rank %d sends on device %d, rank %d receives on %d", rank, send_dev,
         comm->rings[0].next, devs[comm->rings[0].next]);
  return sum_of_ranks(comm, rank, n);
}

START_TEST(test_several_devices) {
  emulate();
  setenv("GW_IB_EMULATE_DEVICES", "2", 1);
  setenv("GW_IB_HCA", "gwemu0,gwemu1:1", 1);
  ck_assert_int_eq(run_ranks(3, body_two_devices, NULL, 60), 0);
  /* a name that is no device, or a port that is no port number (atoi made
   * 257 port 1, and "abc" every port) */
  static const char *const bad[] = {"mlx5_9", "gwemu1:257", "gwemu1:abc", "gwemu1:", "gwemu1:255"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    setenv("GW_IB_HCA", bad[i], 1);
    ck_assert_msg(run_ranks_raw(2, raw_no_port, NULL, 60) == 0, "GW_IB_HCA=%s", bad[i]);
  }
}
END_TEST

/* ---- credits, straight on the transport ---- */
enum { NCHUNKS = 300, NSLOTS = 4 };

static uint32_t chunk_bytes(uint32_t i, uint32_t slot_bytes) {
  return i % 7 == 0 ? slot_bytes : (uint32_t)((i * 2654435761u) % slot_bytes);
}
static uint8_t pattern(uint32_t i, uint32_t j) { return (uint8_t)(i * 31 + j * 7 + (j >> 8)); }

static struct gw_conn_params params(uint32_t slot_bytes) {
  struct gw_conn_params p = {.nslots = NSLOTS, .slot_bytes = slot_bytes, .job_hash = 42, .timeout_s = 20};
  struct sockaddr_in *a = (struct sockaddr_in *)&p.local_addr;
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  p.local_addr_len = sizeof *a;
  return p;
}

/* The sending process: posts NCHUNKS patterned chunks; the slot of chunk
 * NSLOTS must wait for a credit: once it finds none, it says so on blockfd,
 * and the receiver starts reading 0.2 s later (a sleep before reading, not
 * after the sender is held, raced with a descheduled sender). */
static int sender(int hfd, int syncfd, int blockfd, uint32_t slot_bytes) {
  struct gw_conn_params p = params(slot_bytes);
  struct gw_conn_handle h;
  if (read(hfd, &h, sizeof h) != sizeof h) return 10;
  struct gw_conn c = {.tp = &gw__ib_transport, .self = 0, .peer = 1, .is_send = true};
  struct gw_errctx err = {{0}};
  if (c.tp->send_connect(&c, &p, &h, &err) != GW_SUCCESS) {
    fprintf(stderr, "send_connect: %s\n", err.msg);
    return 11;
  }
  char one = 1;
  if (write(syncfd, &one, 1) != 1) return 12;
  double waited_full = 0;
  for (uint32_t i = 0; i < NCHUNKS; i++) {
    void *buf;
    size_t cap;
    double t0 = test_now();
    gw_result_t r;
    bool said = false;
    while ((r = c.tp->send_slot(&c, slot_bytes, &buf, &cap)) == GW_INPROGRESS) {
      if (test_now() - t0 > 15) return 13;
      if (i == NSLOTS && !said) said = write(blockfd, &one, 1) == 1;
      sched_yield();
    }
    if (r != GW_SUCCESS || cap < slot_bytes) return 14;
    if (i == NSLOTS) waited_full = test_now() - t0;
    uint32_t n = chunk_bytes(i, slot_bytes);
    for (uint32_t j = 0; j < n; j++) ((uint8_t *)buf)[j] = pattern(i, j);
    struct gw_chunk_hdr hdr = {.op = {.seq = i + 1, .count = n, .root = -1}, .bytes = n, .step = i};
    if (c.tp->send_post(&c, &hdr) != GW_SUCCESS) return 15;
    if (c.tp->progress(&c, &err) != GW_SUCCESS) return 16;
  }
  c.tp->close(&c);
  /* the receiver read 0.2 s after this sender was held: chunk NSLOTS waited for a credit */
  return waited_full > 0.15 ? 0 : 17;
}

static void credits(uint32_t slot_bytes) {
  emulate();
  int hp[2], sp[2], bp[2];
  ck_assert(pipe(hp) == 0 && pipe(sp) == 0 && pipe(bp) == 0);
  pid_t pid = fork();
  if (pid == 0) _exit(sender(hp[0], sp[1], bp[1], slot_bytes));
  close(bp[1]); /* the sender's exit ends the poll below at once */
  struct gw_conn_params p = params(slot_bytes);
  struct gw_conn c = {.tp = &gw__ib_transport, .self = 1, .peer = 0, .is_send = false};
  struct gw_errctx err = {{0}};
  struct gw_conn_handle h;
  ck_assert_msg(c.tp->recv_setup(&c, &p, &h, &err) == GW_SUCCESS, "recv_setup: %s", err.msg);
  ck_assert(write(hp[1], &h, sizeof h) == sizeof h);
  char one;
  ck_assert(read(sp[0], &one, 1) == 1);
  ck_assert_msg(c.tp->recv_connect(&c, &err) == GW_SUCCESS, "recv_connect: %s", err.msg);
  struct pollfd held = {.fd = bp[0], .events = POLLIN};
  const ssize_t said = poll(&held, 1, 15000) == 1 ? read(bp[0], &one, 1) : 0;
  (void)said; /* 0: the sender never waited, and fails with 17 */
  usleep(200 * 1000);
  for (uint32_t i = 0; i < NCHUNKS; i++) {
    const struct gw_chunk_hdr *hdr;
    const void *data;
    gw_result_t r;
    double t0 = test_now();
    while ((r = c.tp->recv_peek(&c, &hdr, &data)) == GW_INPROGRESS) {
      ck_assert_msg(test_now() - t0 < 15, "chunk %u never arrived", i);
      sched_yield();
    }
    ck_assert_msg(r == GW_SUCCESS, "chunk %u: %s", i, gw_strerror(r));
    uint32_t n = chunk_bytes(i, slot_bytes);
    ck_assert_msg(hdr->op.seq == i + 1 && hdr->bytes == n && hdr->step == i, "chunk %u: header seq %llu bytes %u",
                  i, (unsigned long long)hdr->op.seq, hdr->bytes);
    uint32_t bad = n;
    for (uint32_t j = 0; j < n && bad == n; j++)
      if (((const uint8_t *)data)[j] != pattern(i, j)) bad = j;
    ck_assert_msg(bad == n, "chunk %u byte %u overwritten or wrong", i, bad);
    ck_assert(c.tp->recv_release(&c) == GW_SUCCESS);
  }
  int status;
  ck_assert(waitpid(pid, &status, 0) == pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "sender exited with %d", WEXITSTATUS(status));
  c.tp->close(&c);
}

START_TEST(test_credits_one_qp) {
  setenv("GW_IB_QPS_PER_CONN", "1", 1);
  credits(4096);
}
END_TEST

START_TEST(test_credits_three_qps) {
  setenv("GW_IB_QPS_PER_CONN", "3", 1); /* 256 KiB slots: chunks split in up to 3 parts */
  credits(256 << 10);
}
END_TEST

/* ---- a bad rkey ---- */
static int raw_bad_rkey(int rank, int n, const char *master, void *arg) {
  (void)arg;
  emulate();
  if (rank == 0) setenv("GW_IB_TEST_BAD_RKEY", "3", 1); /* rank 0's third write */
  gw_comm_t comm;
  if (gw_comm_init(&comm, n, rank, master) != GW_SUCCESS) return 1;
  gw_comm_set_timeout(comm, 20);
  enum { COUNT = 1 << 20 };
  float *buf = calloc(COUNT, sizeof *buf);
  double t0 = test_now();
  gw_result_t r = gw_allreduce(buf, buf, COUNT, GW_FLOAT32, GW_SUM, comm, NULL);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_REMOTE, "allreduce with a bad rkey returned %s: %s", gw_strerror(r), msg);
  EXPECT(test_now() - t0 < 10, "took %.1f s", test_now() - t0);
  if (rank == 0) /* its own completion's error, or rank 1's notice (its queue pair's event) when that came first */
    EXPECT(strstr(msg, "rank 1") && strstr(msg, "gwemu0") &&
               (strstr(msg, "refused the write") || strstr(msg, "IBV_EVENT_QP_ACCESS_ERR")),
           "message: %s", msg);
  else /* its QP's async event says why its receives were flushed */
    EXPECT(strstr(msg, "rank 0") && strstr(msg, "IBV_EVENT_QP_ACCESS_ERR"), "message: %s", msg);
  free(buf);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_bad_rkey_reported) { ck_assert_int_eq(run_ranks_raw(2, raw_bad_rkey, NULL, 60), 0); }
END_TEST

/* ---- a killed rank, every rank on its own "machine" (a UTS namespace of its
 * own, so no rank can watch another's pid: only the transport notices) ---- */
static int raw_killed(int rank, int n, const char *master, void *arg) {
  emulate();
  char name[32];
  snprintf(name, sizeof name, "ibnode%d", rank);
  if (unshare(CLONE_NEWUTS) == 0 && sethostname(name, strlen(name)) != 0) return 1;
  gw_comm_t comm;
  if (gw_comm_init(&comm, n, rank, master) != GW_SUCCESS) return 1;
  int rc = body_rank1_killed(comm, rank, n, arg);
  gw_comm_destroy(comm);
  return rc;
}

START_TEST(test_killed_rank_named) {
  double limit = 15; /* against the 60 s timeout: the others notice by the transport alone */
  ck_assert_int_eq(run_ranks_raw(3, raw_killed, &limit, 90), 1); /* rank 1 dies on purpose */
}
END_TEST

/* ---- registered buffers: chunks leave straight from user memory ---- */
static int body_registered(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { COUNT = (4 << 20) + 17 };
  int32_t *in = malloc(COUNT * sizeof *in), *out = malloc(COUNT * sizeof *out);
  EXPECT(in && out, "out of memory");
  void *hin, *hout, *hsub;
  EXPECT(gw_comm_register(comm, in, COUNT * sizeof *in, &hin) == GW_SUCCESS, "register: %s", gw_comm_last_error(comm));
  EXPECT(gw_comm_register(comm, out, COUNT * sizeof *out, &hout) == GW_SUCCESS, "register");
  unsigned long regs = gw__ib_stat(0);
  EXPECT(regs == 2, "%lu ibv_reg_mr calls for two ranges on one port", regs);
  EXPECT(gw_comm_register(comm, out + 100, 1000, &hsub) == GW_SUCCESS && gw__ib_stat(0) == regs,
         "a range inside a registered one was registered again");
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < COUNT; i++) in[i] = (int32_t)(i * 7 + rank * 1000003 + round);
    bool inplace = round == 2;
    if (inplace) memcpy(out, in, COUNT * sizeof *in);
    unsigned long before = gw__ib_stat(1);
    EXPECT(gw_allreduce(inplace ? out : in, out, COUNT, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS, "allreduce: %s",
           gw_comm_last_error(comm));
    EXPECT(gw__ib_stat(1) > before, "round %d sent nothing straight from user memory", round);
    for (int i = 0; i < COUNT; i++) {
      int32_t want = 0;
      for (int r = 0; r < n; r++) want += (int32_t)(i * 7 + r * 1000003 + round);
      EXPECT(out[i] == want, "round %d element %d: %d, expected %d", round, i, out[i], want);
    }
  }
  /* The data path holds a registration while its writes are in flight: a
   * deregistration meanwhile (by another communicator: the cache is the
   * process's) hides the range at once but keeps its MR until the hold ends. */
  struct ib_reg *held[2];
  int nheld = 0;
  unsigned long deregs = gw__ib_stat(2);
  EXPECT(gw__ib_reg_hold(0, in + 10, 4096, held, &nheld, 2) != 0 && nheld == 1, "no hold on a registered range");
  EXPECT(gw__ib_reg_hold(0, in + 20, 4096, held, &nheld, 2) != 0 && nheld == 1, "the same range held twice");
  EXPECT(gw_comm_deregister(comm, hin) == GW_SUCCESS, "deregister");
  EXPECT(gw__ib_stat(2) == deregs, "a held registration was deregistered");
  struct ib_reg *other[2];
  int nother = 0;
  EXPECT(gw__ib_reg_hold(0, in + 10, 4096, other, &nother, 2) == 0 && nother == 0,
         "a deregistered range was still found");
  gw__ib_reg_release(held, &nheld);
  EXPECT(nheld == 0 && gw__ib_stat(2) == deregs + (unsigned long)gw__ib_devs.n,
         "%lu MRs deregistered when the last hold ended, expected %d", gw__ib_stat(2) - deregs, gw__ib_devs.n);
  /* The outer range deregistered while the inner one lives: only the inner
   * range is found (the outer stayed visible whole, and memory mapped there
   * later went out as the stale pinned pages); the MRs stay for it. */
  EXPECT(gw_comm_deregister(comm, hout) == GW_SUCCESS, "deregister the outer range");
  EXPECT(gw__ib_reg_hold(0, out + 1000, 64, other, &nother, 2) == 0 && nother == 0,
         "the deregistered outer range was still found through the inner one's registration");
  EXPECT(gw__ib_reg_hold(0, out + 110, 64, other, &nother, 2) != 0 && nother == 1, "the inner range was not found");
  gw__ib_reg_release(other, &nother);
  /* So is a new registration there: it is registered anew, not a reference on
   * the inner range's MRs, which pin the pages of the memory that was there. */
  void *hnew = NULL;
  unsigned long regs_before = gw__ib_stat(0);
  EXPECT(gw_comm_register(comm, out + 1000, 64, &hnew) == GW_SUCCESS && gw__ib_stat(0) > regs_before,
         "a range in the deregistered outer one took a reference on the stale registration");
  EXPECT(gw_comm_deregister(comm, hnew) == GW_SUCCESS, "deregister the new range");
  deregs += (unsigned long)gw__ib_devs.n; /* its MRs */
  EXPECT(gw__ib_stat(2) == deregs + (unsigned long)gw__ib_devs.n, "the inner range's MRs went with the outer");
  /* Operations end their holds: the last user reference takes the MRs. */
  EXPECT(gw_comm_deregister(comm, hsub) == GW_SUCCESS, "deregister");
  EXPECT(gw__ib_stat(2) == deregs + 2ul * (unsigned long)gw__ib_devs.n,
         "%lu MRs deregistered for two ranges: an operation kept holding one", gw__ib_stat(2) - deregs);
  unsigned long before = gw__ib_stat(1);
  EXPECT(gw_allreduce(in, out, COUNT, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS, "allreduce after deregister");
  EXPECT(gw__ib_stat(1) == before, "sent from user memory after deregistering it");
  EXPECT(gw_comm_register(comm, NULL, 10, &hin) == GW_ERR_INVALID_ARGUMENT &&
             strstr(gw_comm_last_error(comm), "gw_comm_register"), "NULL buffer accepted");
  free(in);
  free(out);
  return 0;
}

START_TEST(test_registered_buffers) {
  emulate();
  ck_assert_int_eq(run_ranks(3, body_registered, NULL, 120), 0);
}
END_TEST

/* In place at 2 ranks (the exchange, up to 256 KiB): the result goes where
 * the input was sent from as soon as the peer's data arrives, so the input
 * must not leave directly from the registered buffer.  With the emulator's
 * sends read 300 us after their post (as a DMA engine reads later), sending
 * it directly had the peer sum partly reduced values. */
static int body_inplace_exchange(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  enum { COUNT = 32768 }; /* 128 KiB: one chunk, above the direct-send minimum */
  int32_t *buf = malloc(COUNT * sizeof *buf);
  void *h;
  EXPECT(buf && gw_comm_register(comm, buf, COUNT * sizeof *buf, &h) == GW_SUCCESS, "register: %s",
         gw_comm_last_error(comm));
  for (int it = 0; it < 30; it++) {
    for (int i = 0; i < COUNT; i++) buf[i] = rank * 1000 + it + i % 17;
    EXPECT(gw_allreduce(buf, buf, COUNT, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS, "%s", gw_comm_last_error(comm));
    for (int i = 0; i < COUNT; i++)
      EXPECT(buf[i] == 1000 * n * (n - 1) / 2 + n * (it + i % 17), "iteration %d: element %d is %d, expected %d", it,
             i, buf[i], 1000 * n * (n - 1) / 2 + n * (it + i % 17));
  }
  EXPECT(gw_comm_deregister(comm, h) == GW_SUCCESS, "deregister");
  free(buf);
  return 0;
}

START_TEST(test_inplace_exchange_registered) {
  emulate();
  setenv("GW_IB_EMULATE_DELAY_US", "300", 1);
  ck_assert_int_eq(run_ranks(2, body_inplace_exchange, NULL, 120), 0);
  unsetenv("GW_IB_EMULATE_DELAY_US");
}
END_TEST

/* A small broadcast (the ring) and a small allreduce by the exchange
 * (recursive doubling) or the tree at 3 ranks, with the emulator's sends held
 * back 300 us: the root's broadcast is done once its chunk is posted, and its
 * allreduce then waits on other connections, whose CQs are all it polls.  The
 * emulator ran a held-back write only when its own QP's CQ was polled, so the
 * broadcast's chunk never left and every rank waited until its deadline (an
 * HCA sends it whatever the process polls). */
static int body_small_held_back(gw_comm_t comm, int rank, int n, void *arg) {
  gw_comm_set_timeout(comm, 20);
  EXPECT(gw_comm_set_algo(comm, arg, "simple") == GW_SUCCESS, "set_algo %s", (const char *)arg);
  for (int it = 0; it < 20; it++) {
    int32_t in[11], out[11], root[4] = {rank, rank, rank, rank};
    EXPECT(gw_broadcast(root, root, it % 2 ? 4 : 0, GW_INT32, 0, comm, NULL) == GW_SUCCESS, "broadcast: %s",
           gw_comm_last_error(comm));
    EXPECT(it % 2 == 0 || root[3] == 0, "iteration %d: the broadcast gave %d", it, root[3]);
    for (int i = 0; i < 11; i++) in[i] = rank * 100 + it + i;
    EXPECT(gw_allreduce(in, out, 11, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS, "%s: iteration %d: %s",
           (const char *)arg, it, gw_comm_last_error(comm));
    for (int i = 0; i < 11; i++)
      EXPECT(out[i] == 100 * n * (n - 1) / 2 + n * (it + i), "%s: iteration %d: element %d is %d", (const char *)arg,
             it, i, out[i]);
  }
  return 0;
}

START_TEST(test_small_held_back) {
  emulate();
  setenv("GW_IB_EMULATE_DELAY_US", "300", 1);
  ck_assert_int_eq(run_ranks(3, body_small_held_back, "exchange", 60), 0);
  ck_assert_int_eq(run_ranks(3, body_small_held_back, "tree", 60), 0);
  unsetenv("GW_IB_EMULATE_DELAY_US");
}
END_TEST

/* ---- setup errors ---- */
static int raw_memlock(int rank, int n, const char *master, void *arg) {
  (void)arg;
  emulate();
  setenv("GW_IB_EMULATE_MEMLOCK", "65536", 1); /* far below 8 slots of 256 KiB */
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r != GW_SUCCESS, "init succeeded beyond the locked-memory limit");
  EXPECT(strstr(gw_comm_last_error(NULL), "ulimit -l"), "no memlock hint: %s", gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_memlock_hint) { ck_assert_int_eq(run_ranks_raw(2, raw_memlock, NULL, 60), 0); }
END_TEST

/* QP timeout and retries out of range: refused naming the variable (modify_qp
 * said only "Invalid argument"; a timeout of 0 is "never" on hardware). */
static int raw_qp_settings(int rank, int n, const char *master, void *arg) {
  const char *const *kv = arg;
  emulate();
  setenv(kv[0], kv[1], 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(NULL), kv[2]), "%s=%s: init returned %s: %s",
         kv[0], kv[1], gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_qp_settings_checked) {
  const char *const timeout0[] = {"GW_IB_TIMEOUT", "0", "GW_IB_TIMEOUT=0 is not in 1..31"};
  const char *const retry9[] = {"GW_IB_RETRY_CNT", "9", "GW_IB_RETRY_CNT=9 is not in 0..7"};
  const char *const roce3[] = {"GW_IB_ROCE_VERSION", "3", "GW_IB_ROCE_VERSION=3 is not 1 or 2"};
  ck_assert_int_eq(run_ranks_raw(2, raw_qp_settings, (void *)timeout0, 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_qp_settings, (void *)retry9, 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_qp_settings, (void *)roce3, 60), 0);
  /* a service level past 15 was EINVAL under the GID index hint, a traffic
   * class of 256 silently 0 */
  const char *const sl16[] = {"GW_IB_SL", "16", "GW_IB_SL=16 is not a service level (0..15)"};
  const char *const tc256[] = {"GW_IB_TC", "256", "GW_IB_TC=256 is not a traffic class (0..255)"};
  ck_assert_int_eq(run_ranks_raw(2, raw_qp_settings, (void *)sl16, 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_qp_settings, (void *)tc256, 60), 0);
  /* no number: refused as out of range is (it ran as the default) */
  const char *const sl_word[] = {"GW_IB_SL", "abc", "GW_IB_SL=abc is not a service level (0..15)"};
  const char *const timeout_word[] = {"GW_IB_TIMEOUT", "18ms", "GW_IB_TIMEOUT=18ms is not in 1..31"};
  ck_assert_int_eq(run_ranks_raw(2, raw_qp_settings, (void *)sl_word, 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_qp_settings, (void *)timeout_word, 60), 0);
}
END_TEST

/* The move to RTR timing out (RoCE's address resolution when many
 * connections start at once; GW_IB_EMULATE_RTR_TIMEOUTS) is tried again: the
 * communicator comes up and works.  It failed init at the first one. */
static int raw_rtr_timeouts(int rank, int n, const char *master, void *arg) {
  (void)arg;
  emulate();
  setenv("GW_IB_EMULATE_RTR_TIMEOUTS", "3", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r == GW_SUCCESS, "rank %d: init with 3 RTR timeouts: %s: %s", rank, gw_strerror(r),
         gw_comm_last_error(NULL));
  const int rc = sum_of_ranks(comm, rank, n);
  gw_comm_destroy(comm);
  return rc;
}

/* ibv_fork_init before any registration (registered pages kept out of
 * forked children: on kernels before 5.13 a fork left the HCA reading pages
 * the process no longer used), unless GW_IB_FORK_INIT=0. */
static int raw_fork_init(int rank, int n, const char *master, void *arg) {
  const char *want = arg;
  emulate();
  setenv("GW_IB_FORK_INIT", want, 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r == GW_SUCCESS, "rank %d: init: %s", rank, gw_comm_last_error(NULL));
  EXPECT(gw__ibemu_fork_inited() == (want[0] == '1'), "rank %d: GW_IB_FORK_INIT=%s, fork_init %s", rank, want,
         gw__ibemu_fork_inited() ? "called" : "not called");
  const int rc = sum_of_ranks(comm, rank, n);
  gw_comm_destroy(comm);
  return rc;
}

START_TEST(test_fork_init) {
  ck_assert_int_eq(run_ranks_raw(2, raw_fork_init, "1", 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_fork_init, "0", 60), 0);
}
END_TEST

START_TEST(test_rtr_timeout_retried) { ck_assert_int_eq(run_ranks_raw(2, raw_rtr_timeouts, NULL, 60), 0); }
END_TEST

/* RoCE without GW_IB_GID_INDEX: the GID of the RoCE version asked
 * (GW_IB_ROCE_VERSION, default 2), IPv4-mapped before link-local; a port
 * without that version uses the other.  The emulated table is mlx5's: 0/1
 * link-local v1/v2, 2/3 IPv4-mapped v1/v2 (GW_IB_EMULATE_ROCE=v1: 0 link-local,
 * 1 IPv4-mapped, both v1).  Index 0, the old default, is v1 link-local. */
static int body_gid_choice(gw_comm_t comm, int rank, int n, void *arg) {
  const int *want = arg; /* index, type */
  const struct ib_port *pt = &gw__ib_devs.ports[0];
  EXPECT(gw__ib_devs.n == 1 && pt->eth && pt->gid_index == want[0] && pt->gid_type == want[1],
         "rank %d: GID index %d of type %d, expected %d of type %d", rank, pt->gid_index, pt->gid_type, want[0],
         want[1]);
  return sum_of_ranks(comm, rank, n);
}

START_TEST(test_roce_gid_choice) {
  emulate();
  setenv("GW_IB_EMULATE_LINK", "eth", 1);
  const int v2_ipv4[] = {3, IBV_GID_TYPE_ROCE_V2}, v1_ipv4[] = {2, IBV_GID_TYPE_ROCE_V1},
            only_v1[] = {1, IBV_GID_TYPE_ROCE_V1}, forced[] = {1, IBV_GID_TYPE_ROCE_V2};
  ck_assert_int_eq(run_ranks(2, body_gid_choice, (void *)v2_ipv4, 60), 0);
  setenv("GW_IB_ROCE_VERSION", "1", 1);
  ck_assert_int_eq(run_ranks(2, body_gid_choice, (void *)v1_ipv4, 60), 0);
  unsetenv("GW_IB_ROCE_VERSION");
  setenv("GW_IB_EMULATE_ROCE", "v1", 1);
  ck_assert_int_eq(run_ranks(2, body_gid_choice, (void *)only_v1, 60), 0);
  unsetenv("GW_IB_EMULATE_ROCE");
  setenv("GW_IB_GID_INDEX", "1", 1); /* given: used as it is */
  ck_assert_int_eq(run_ranks(2, body_gid_choice, (void *)forced, 60), 0);
  unsetenv("GW_IB_GID_INDEX");
  unsetenv("GW_IB_EMULATE_LINK");
}
END_TEST

/* One machine with RoCE v1 only, the other with v2: their QPs would never
 * reach each other (the writes fail after the retry timeout, ~8.6 s, saying
 * "unreachable"); both ranks fail at init naming the versions. */
static int raw_roce_versions(int rank, int n, const char *master, void *arg) {
  (void)arg;
  emulate();
  setenv("GW_IB_EMULATE_LINK", "eth", 1);
  if (rank == 1) setenv("GW_IB_EMULATE_ROCE", "v1", 1);
  gw_comm_t comm;
  double t0 = gw__now();
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  const char *msg = gw_comm_last_error(NULL);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(msg, "same RoCE version") && strstr(msg, "RoCE v1") &&
             strstr(msg, "RoCE v2"),
         "rank %d: init returned %s: %s", rank, gw_strerror(r), msg);
  EXPECT(gw__now() - t0 < 5, "rank %d took %.1f s to fail", rank, gw__now() - t0);
  return 0;
}

START_TEST(test_roce_versions_differ) { ck_assert_int_eq(run_ranks_raw(2, raw_roce_versions, NULL, 60), 0); }
END_TEST

/* Partitions.  A P_Key table whose index 0 is the default partition's limited
 * key (0x7fff, as on Azure's SR-IOV InfiniBand): the QPs join the first
 * full-member key (index 1), and the job runs (index 0, taken before, left
 * two limited members that never reach each other).  GW_IB_PKEY=0 forces the
 * limited key on both: init fails at once naming it (not after the retry
 * timeout); two different partitions likewise; an index with no key leaves
 * no port. */
static int body_pkey_full(gw_comm_t comm, int rank, int n, void *arg) {
  (void)arg;
  const struct ib_port *pt = &gw__ib_devs.ports[0];
  EXPECT(pt->pkey_index == 1 && pt->pkey == 0xffff, "rank %d: P_Key 0x%04x at index %d, expected 0xffff at 1", rank,
         pt->pkey, pt->pkey_index);
  return sum_of_ranks(comm, rank, n);
}

static int raw_pkeys_apart(int rank, int n, const char *master, void *arg) {
  const char *want = arg;
  emulate();
  setenv("GW_IB_EMULATE_PKEYS", "7fff,ffff", 1);
  if (strstr(want, "limited")) setenv("GW_IB_PKEY", "0", 1);
  else if (rank == 1) setenv("GW_IB_EMULATE_PKEYS", "8001", 1);
  gw_comm_t comm;
  double t0 = gw__now();
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  const char *msg = gw_comm_last_error(NULL);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(msg, want) && strstr(msg, "GW_IB_PKEY"), "rank %d: init returned %s: %s",
         rank, gw_strerror(r), msg);
  EXPECT(gw__now() - t0 < 5, "rank %d took %.1f s to fail", rank, gw__now() - t0);
  return 0;
}

START_TEST(test_partitions) {
  emulate();
  setenv("GW_IB_EMULATE_PKEYS", "7fff,ffff", 1);
  ck_assert_int_eq(run_ranks(2, body_pkey_full, NULL, 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_pkeys_apart, "both limited members", 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_pkeys_apart, "different partitions never meet", 60), 0);
  emulate();
  setenv("GW_IB_EMULATE_PKEYS", "7fff,ffff", 1);
  setenv("GW_IB_PKEY", "5", 1);
  ck_assert_int_eq(run_ranks_raw(2, raw_no_port, NULL, 60), 0);
  unsetenv("GW_IB_PKEY");
  unsetenv("GW_IB_EMULATE_PKEYS");
  unsetenv("GW_IB_EMULATE");
  unsetenv("GW_TRANSPORT");
}
END_TEST

/* The HCA's async events: rank 1's port goes down (its writes and rank 0's
 * reach nobody; with GW_IB_TIMEOUT=8 the retries end after ~8 ms) or its
 * device fails (its QPs flushed).  Both ranks fail within seconds, rank 1
 * naming the event: the link down beside whatever ended the operation, the
 * device failure instead of "flushed". */
static int raw_async_event(int rank, int n, const char *master, void *arg) {
  const bool fatal = arg != NULL;
  emulate();
  setenv("GW_IB_TIMEOUT", "8", 1);
  gw_comm_t comm;
  if (gw_comm_init(&comm, n, rank, master) != GW_SUCCESS) return 1;
  gw_comm_set_timeout(comm, 30);
  enum { COUNT = 1 << 18 };
  float *buf = calloc(COUNT, sizeof *buf);
  EXPECT(gw_allreduce(buf, buf, COUNT, GW_FLOAT32, GW_SUM, comm, NULL) == GW_SUCCESS, "first allreduce");
  if (rank == 1) {
    if (fatal) gw__ibemu_device_fatal(gw__ib_devs.ports[0].ctx);
    else gw__ibemu_set_port(gw__ib_devs.ports[0].ctx, 0);
  }
  double t0 = test_now();
  gw_result_t r = gw_allreduce(buf, buf, COUNT, GW_FLOAT32, GW_SUM, comm, NULL);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(r != GW_SUCCESS && test_now() - t0 < 10, "rank %d: allreduce returned %s after %.1f s: %s", rank,
         gw_strerror(r), test_now() - t0, msg);
  if (rank == 1)
    EXPECT(fatal ? strstr(msg, "IBV_EVENT_DEVICE_FATAL") != NULL : strstr(msg, "link down") != NULL,
           "rank 1: %s", msg);
  else
    EXPECT(strstr(msg, "rank 1"), "rank 0: %s", msg);
  free(buf);
  gw_comm_destroy(comm);
  return 0;
}

/* After one of rank 1's devices failed for good, a new communicator there
 * takes the other: it went to the failed one again (round robin) and failed
 * at its first send. */
static int raw_after_fatal(int rank, int n, const char *master, void *arg) {
  (void)arg;
  emulate();
  setenv("GW_IB_EMULATE_DEVICES", "2", 1);
  setenv("GW_IB_HCA", "gwemu0,gwemu1", 1);
  gw_comm_t comm;
  if (gw_comm_init(&comm, n, rank, master) != GW_SUCCESS) return 1;
  EXPECT(gw__ib_devs.n == 2, "rank %d: %d ports", rank, gw__ib_devs.n);
  int rc = sum_of_ranks(comm, rank, n);
  /* the device its next receiving connection would take (round robin) */
  if (rank == 1) gw__ibemu_device_fatal(gw__ib_devs.ports[atomic_load(&gw__ib_devs.next) % 2].ctx);
  gw_comm_destroy(comm);
  gw_result_t r = gw_comm_init(&comm, n, rank, master); /* the same rendezvous again */
  EXPECT(r == GW_SUCCESS, "rank %d: a new communicator after the device failure: %s", rank,
         gw_comm_last_error(NULL));
  for (int i = 0; i < 4 && !rc; i++) rc |= sum_of_ranks(comm, rank, n); /* both connections, both ways */
  static int64_t big[1 << 16];
  /* Registering skips the failed device (it failed on every port for one
   * dead HCA: its ibv_reg_mr is EIO) and the other's connection sends
   * straight from the buffer. */
  void *h = NULL;
  EXPECT(gw_comm_register(comm, big, sizeof big, &h) == GW_SUCCESS, "rank %d: register after a device failed: %s",
         rank, gw_comm_last_error(comm));
  EXPECT(gw_allreduce(big, big, 1 << 16, GW_INT64, GW_SUM, comm, NULL) == GW_SUCCESS,
         "rank %d: allreduce on the new communicator: %s", rank, gw_comm_last_error(comm));
  EXPECT(gw_comm_deregister(comm, h) == GW_SUCCESS, "rank %d: deregister", rank);
  gw_comm_destroy(comm);
  return rc;
}

START_TEST(test_async_events) {
  ck_assert_int_eq(run_ranks_raw(2, raw_async_event, NULL, 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_async_event, (void *)"fatal", 60), 0);
  ck_assert_int_eq(run_ranks_raw(2, raw_after_fatal, NULL, 60), 0);
}
END_TEST

static int raw_slots_differ(int rank, int n, const char *master, void *arg) {
  (void)arg;
  emulate();
  if (rank == 1) setenv("GW_SHM_SLOTS", "4", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r != GW_SUCCESS, "init succeeded with different slot settings");
  /* at 2 ranks each rank is the sender of one pair, and the sender sees it */
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && strstr(gw_comm_last_error(NULL), "GW_SHM_SLOTS"), "rank %d: %s: %s", rank,
         gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_slot_settings_differ) { ck_assert_int_eq(run_ranks_raw(2, raw_slots_differ, NULL, 60), 0); }
END_TEST

int main(void) {
  Suite *s = suite_create("ib");
  TCase *tc = tcase_create("ib");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_transport_choice);
  tcase_add_test(tc, test_one_rank_without_ib);
  tcase_add_test(tc, test_unusable_ports);
  tcase_add_test(tc, test_several_devices);
  tcase_add_test(tc, test_credits_one_qp);
  tcase_add_test(tc, test_credits_three_qps);
  tcase_add_test(tc, test_registered_buffers);
  tcase_add_test(tc, test_inplace_exchange_registered);
  tcase_add_test(tc, test_small_held_back);
  tcase_add_test(tc, test_bad_rkey_reported);
  tcase_add_test(tc, test_killed_rank_named);
  tcase_add_test(tc, test_memlock_hint);
  tcase_add_test(tc, test_qp_settings_checked);
  tcase_add_test(tc, test_rtr_timeout_retried);
  tcase_add_test(tc, test_fork_init);
  tcase_add_test(tc, test_slot_settings_differ);
  tcase_add_test(tc, test_roce_gid_choice);
  tcase_add_test(tc, test_roce_versions_differ);
  tcase_add_test(tc, test_partitions);
  tcase_add_test(tc, test_async_events);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
