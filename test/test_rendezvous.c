/* test_rendezvous.c - what reaches rank 0's rendezvous from outside the job:
 * a rank arriving after everyone joined (a relaunched rank, another job on the
 * same port whose own rank 0 could not bind) is refused at once, not taken
 * into the backlog unanswered and failed after the timeout blaming a missing
 * rank; ranks that differ in GW_TRANSPORT fail at init naming it (they used to
 * fail in the connection setup naming the FIFO sizes or a malformed tcp
 * handle); torchrun's default run id "none" is no job token; the numbers
 * init reads from the environment; whether ranks share cores (the waiting
 * policy) counts only ranks whose CPUs overlap; a rank whose process exited
 * after it joined gives its place to a new one, before or after the last;
 * rank 0 given to two processes is said as such by the second; strangers
 * are said beside the ranks missing at the timeout. */
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h" /* the communicator's oversubscribed flag; gw__env_int */
#include "harness.h"
#include "hmac.h"

static void marker(const char *master, const char *what, char *path, size_t len) {
  snprintf(path, len, "/tmp/gw-rdv-%d-%s-%s", (int)getppid(), strchr(master, ':') + 1, what);
}

static int wait_for(const char *path, double seconds) {
  for (double t0 = test_now(); test_now() - t0 < seconds; usleep(20000))
    if (access(path, F_OK) == 0) return 1;
  return 0;
}

/* Whether master's port takes a connection within 30 s (rank 0 listens). */
static bool master_listens(const char *master) {
  char host[64], port[16];
  struct addrinfo *ai = NULL, hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  if (!gw__parse_host_port(master, host, sizeof host, port, sizeof port) || getaddrinfo(host, port, &hints, &ai) != 0)
    return false;
  bool up = false;
  for (double t0 = test_now(); !up && test_now() - t0 < 30; usleep(up ? 0 : 20000)) {
    const int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    up = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    if (fd >= 0) close(fd);
  }
  freeaddrinfo(ai);
  return up;
}

/* Rank 0 given to two processes: the second cannot listen at the master's
 * port, and says it may be this job's own rank 0 twice (it spoke only of
 * another job). */
static int body_rank0_twice(int rank, int n, const char *master, void *arg) {
  (void)arg;
  setenv("GW_BOOTSTRAP_TIMEOUT", "2", 1);
  if (rank == 1) EXPECT(master_listens(master), "rank 0 never listened at %s", master);
  gw_comm_t comm;
  const gw_result_t r = gw_comm_init(&comm, n, 0, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  if (rank == 1)
    EXPECT(r != GW_SUCCESS && strstr(gw_comm_last_error(NULL), "was rank 0 given to two processes?"),
           "a second rank 0: %s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_rank0_twice_said) { ck_assert_int_eq(run_ranks_raw(2, body_rank0_twice, NULL, 60), 0); }
END_TEST

/* Rank 1 never comes, a stranger does (it connects and closes): rank 0's
 * timeout says it beside the missing rank (a rank kept out by strangers was
 * said only as missing). */
static int body_missing_beside_stranger(int rank, int n, const char *master, void *arg) {
  (void)arg;
  if (rank == 1) return master_listens(master) ? 0 : 1;
  setenv("GW_BOOTSTRAP_TIMEOUT", "2", 1);
  gw_comm_t comm;
  const gw_result_t r = gw_comm_init(&comm, n, 0, master);
  EXPECT(r == GW_ERR_TIMEOUT && has(gw_comm_last_error(NULL), "within 2 s (1 connection that was no rank of this job "
                                    "came meanwhile, the last from 127.0.0.1); missing ranks: 1"),
         "%s: %s", gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

/* A GW_BOOTSTRAP_TIMEOUT too short for any try (1e-7 s) says so (it said "no
 * answer from master after 0 s (no route)", no connection having been
 * tried). */
static int body_timeout_before_try(void *arg) {
  (void)arg;
  setenv("GW_JOB_TOKEN", "tiny", 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "1e-7", 1);
  gw_comm_t comm;
  const gw_result_t r = gw_comm_init(&comm, 2, 1, "127.0.0.1:9");
  const char *msg = gw_comm_last_error(NULL);
  return r == GW_ERR_TIMEOUT && has(msg, "GW_BOOTSTRAP_TIMEOUT (1e-07 s) ran out before a connection to master "
                                          "127.0.0.1:9 could be tried") ? 0 : 1;
}

START_TEST(test_missing_beside_stranger) {
  ck_assert_int_eq(run_ranks_raw(2, body_missing_beside_stranger, NULL, 60), 0);
  ck_assert_msg(run_in_child(body_timeout_before_try, NULL) == 0, "a timeout too short for any try");
}
END_TEST

/* Harness ranks 0 and 1 make a 2-rank communicator; harness rank 2 then
 * claims to be its rank 1. */
static int body_late_joiner(int rank, int n, const char *master, void *arg) {
  (void)n, (void)arg;
  char up[128], done[128];
  marker(master, "up", up, sizeof up);
  marker(master, "done", done, sizeof done);
  if (rank == 2) {
    EXPECT(wait_for(up, 60), "the job never came up");
    setenv("GW_BOOTSTRAP_TIMEOUT", "1", 1);
    gw_comm_t c;
    double t0 = test_now();
    gw_result_t r = gw_comm_init(&c, 2, 1, master);
    double took = test_now() - t0;
    FILE *f = fopen(done, "w");
    if (f) fclose(f);
    EXPECT(r != GW_SUCCESS, "a rank after the rendezvous joined");
    EXPECT(has(gw_comm_last_error(NULL), "no answer from master"), "after %.1f s: %s", took,
           gw_comm_last_error(NULL));
    return 0;
  }
  gw_comm_t comm;
  EXPECT(gw_comm_init(&comm, 2, rank, master) == GW_SUCCESS, "init: %s", gw_comm_last_error(NULL));
  if (rank == 0) {
    FILE *f = fopen(up, "w");
    if (f) fclose(f);
  }
  EXPECT(wait_for(done, 60), "the late rank never finished");
  int32_t v = 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS && v == 2, "the job after it: %s",
         gw_comm_last_error(comm));
  gw_comm_destroy(comm);
  if (rank == 0) unlink(up), unlink(done);
  return 0;
}

START_TEST(test_late_joiner_refused) { ck_assert_int_eq(run_ranks_raw(3, body_late_joiner, NULL, 90), 0); }
END_TEST

static int body_transport_differs(int rank, int n, const char *master, void *arg) {
  (void)arg;
  if (rank == 1) setenv("GW_TRANSPORT", "tcp", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  EXPECT(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), "GW_TRANSPORT=tcp") &&
             has(gw_comm_last_error(NULL), "GW_TRANSPORT=(unset)"),
         "rank %d: init returned %s: %s", rank, gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

/* A rank that fails on its own during setup (here an interface this machine
 * does not have, named by GW_SOCKET_IFNAME on rank 2 alone: said as such, not
 * as an interface without an address) tells the others why:
 * they said "lost the bootstrap connection to rank 2: did it exit?". */
static int body_one_rank_fails(int rank, int n, const char *master, void *arg) {
  (void)arg;
  setenv("GW_TRANSPORT", "tcp", 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "20", 1);
  if (rank == 2) setenv("GW_SOCKET_IFNAME", "gwnosuchif0", 1);
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  const char *msg = gw_comm_last_error(NULL);
  EXPECT(r != GW_SUCCESS && has(msg, "GW_SOCKET_IFNAME=gwnosuchif0: this machine has no interface of that name") &&
             (rank == 2 || has(msg, "rank 2 failed")),
         "rank %d: init returned %s: %s", rank, gw_strerror(r), msg);
  return 0;
}

START_TEST(test_failed_rank_says_why) { ck_assert_int_eq(run_ranks_raw(3, body_one_rank_fails, NULL, 60), 0); }
END_TEST

/* A setting out of range (or no number, or no word of its own) on one rank
 * (ranks started without a launcher that stops the others): that rank
 * refused it before the rendezvous, and the others waited out
 * GW_BOOTSTRAP_TIMEOUT, then said only that it never came.  Now it joins the rendezvous to fail there, and every rank names
 * the setting in well under the timeout (30 s here).  arg: "RANK VAR=VALUE". */
static int body_setting_refused(int rank, int n, const char *master, void *arg) {
  const char *spec = arg, *eq = strchr(spec, '=');
  const int bad = atoi(spec);
  char var[64];
  snprintf(var, sizeof var, "%.*s", (int)(eq - (strchr(spec, ' ') + 1)), strchr(spec, ' ') + 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "30", 1);
  char value[32];
  snprintf(value, sizeof value, "%.*s", (int)strcspn(eq + 1, " "), eq + 1);
  if (rank == bad) setenv(var, value, 1);
  /* "... late R": rank R comes to the next exchange 2.5 s after the table,
   * when rank 0 has told the others and closed (it said "did it exit?") */
  const char *late = strstr(spec, " late ");
  if (late && rank == atoi(late + 6)) setenv("GW_TEST_AFTER_TABLE_PAUSE_MS", "2500", 1);
  const double t0 = test_now();
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (r == GW_SUCCESS) gw_comm_destroy(comm);
  const char *msg = gw_comm_last_error(NULL);
  char want[80]; /* "rank 2: GW_SOCKET_NSTREAMS=99", on every rank */
  snprintf(want, sizeof want, "rank %d: %.*s", bad, (int)strcspn(strchr(spec, ' ') + 1, " "), strchr(spec, ' ') + 1);
  EXPECT(r != GW_SUCCESS && has(msg, want) && test_now() - t0 < 15,
         "%s: rank %d: init returned %s after %.1f s: %s", spec, rank, gw_strerror(r), test_now() - t0, msg);
  return 0;
}

START_TEST(test_setting_refused_said_to_all) {
  static const char *const cases[] = {"2 GW_SOCKET_NSTREAMS=99", "0 GW_NCHANNELS=0", "1 GW_SHM_SLOT_BYTES=1000",
                                      "0 GW_NCHANNELS=0 late 2", "1 GW_SOCKET_NSTREAMS=0 late 2",
                                      /* no number, no such word: refused too (they ran as the default) */
                                      "1 GW_NCHANNELS=12abc", "2 GW_ALGO=bogus", "0 GW_PROTO=fast",
                                      "1 GW_EXCHANGE_MAX_BYTES=zz",
                                      /* ib used the nearest of 1..8, logged as given; a word the default */
                                      "2 GW_IB_QPS_PER_CONN=9", "0 GW_IB_QPS_PER_CONN=0", "1 GW_IB_QPS_PER_CONN=abc"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_msg(run_ranks_raw(3, body_setting_refused, (void *)cases[i], 60) == 0, "%s", cases[i]);
}
END_TEST

/* Rank 1 joins, then its process dies (SIGKILL inside gw_comm_init), and a
 * new rank 1 starts (a pod restarted, a rank relaunched): it takes the dead
 * one's place and the job runs.  The steps go by rank 0's log (GW_DEBUG=TRACE,
 * its stderr in a file) and by its end of the dead connection (CLOSE_WAIT);
 * sleeps of 2 and 3 s ordered them before.  Three orders:
 *  - RESTART_BEFORE_LAST: the new rank 1 comes before rank 2.  Rank 0 took it
 *    for a duplicate ("rank 1 joined twice") and failed every rank.
 *  - RESTART_AFTER_LAST: rank 2 comes first, once rank 0 holds a closed
 *    connection for rank 1; the new rank 1 comes once rank 0 said it waits
 *    for one.  Rank 0 completed the rendezvous with the dead connection and
 *    every rank failed at the next exchange.
 *  - RESTART_NEVER: no new rank 1: the timeout names rank 1 as having joined
 *    and exited, at rank 0 and at rank 2. */
enum { RESTART_BEFORE_LAST, RESTART_AFTER_LAST, RESTART_NEVER };
static char restart_log[64]; /* rank 0's stderr */

/* Whether rank 0's log holds `what`, within 30 s. */
static bool rank0_said(const char *what) {
  for (double t0 = test_now(); test_now() - t0 < 30; usleep(10000)) {
    FILE *f = fopen(restart_log, "r");
    static char buf[1 << 16];
    const size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[got] = 0;
    if (strstr(buf, what)) return true;
  }
  return false;
}

/* Whether rank 0 holds no live connection on the master's port any more
 * (after the only one, the first rank 1's, was killed: CLOSE_WAIT after its
 * FIN, or gone after an RST where the proof lay unread), within 30 s. */
static bool rank0_holds_closed(const char *master) {
  const unsigned port = (unsigned)atoi(strrchr(master, ':') + 1);
  for (double t0 = test_now(); test_now() - t0 < 30; usleep(10000)) {
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    bool live = false;
    while (f && !live && fgets(line, sizeof line, f)) {
      unsigned laddr, lport, st; /* rank 0's own: on 127.0.0.1 (another address's socket may share the number) */
      live = sscanf(line, " %*d: %x:%x %*x:%*x %x", &laddr, &lport, &st) == 3 && laddr == 0x0100007Fu &&
             lport == port && st == 0x01;
    }
    if (f) fclose(f);
    if (f && !live) return true;
  }
  return false;
}

static int body_rank_restarted(int rank, int n, const char *master, void *arg) {
  const int order = *(const int *)arg;
  setenv("GW_BOOTSTRAP_TIMEOUT", order == RESTART_NEVER ? "15" : "40", 1);
  int saved_err = -1;
  if (rank == 0) { /* its log into the file the others read */
    setenv("GW_DEBUG", "TRACE", 1);
    const int fd = open(restart_log, O_WRONLY | O_APPEND);
    EXPECT(fd >= 0, "open %s", restart_log);
    saved_err = dup(2);
    dup2(fd, 2), close(fd);
  }
  if (rank == 1) {
    const pid_t child = fork();
    if (child == 0) {
      gw_comm_t c;
      gw_comm_init(&c, n, rank, master); /* joins, then waits for rank 2 */
      _exit(3);
    }
    const bool joined = rank0_said("rank 0: rank 1 joined from");
    int status = 0;
    EXPECT(child > 0 && kill(child, SIGKILL) == 0 && waitpid(child, &status, 0) == child && WIFSIGNALED(status),
           "the first rank 1 did not die in the rendezvous");
    EXPECT(joined, "rank 0 never saw the first rank 1 join");
    if (order == RESTART_NEVER) return 0;
    if (order == RESTART_AFTER_LAST)
      EXPECT(rank0_said("waiting for a new rank 1"), "rank 0 never took out the dead rank 1");
  }
  if (rank == 2 && order == RESTART_BEFORE_LAST)
    EXPECT(rank0_said("the new one takes its place"), "rank 0 never let the new rank 1 in");
  if (rank == 2 && order != RESTART_BEFORE_LAST)
    EXPECT(rank0_said("rank 0: rank 1 joined from") && rank0_holds_closed(master),
           "rank 0 never saw the first rank 1's connection close");
  gw_comm_t comm;
  const gw_result_t r = gw_comm_init(&comm, n, rank, master);
  if (rank == 0) { /* its log back where it was, and shown there */
    dup2(saved_err, 2), close(saved_err);
    unsetenv("GW_DEBUG");
  }
  if (order == RESTART_NEVER) {
    if (r == GW_SUCCESS) gw_comm_destroy(comm);
    EXPECT(r != GW_SUCCESS && has(gw_comm_last_error(NULL), "missing ranks: 1 (joined, then exited)"),
           "rank %d: init returned %s: %s", rank, gw_strerror(r), gw_comm_last_error(NULL));
    return 0;
  }
  EXPECT(r == GW_SUCCESS, "rank %d: init: %s", rank, gw_comm_last_error(NULL));
  int32_t v = rank + 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS && v == 6, "rank %d: allreduce: %d %s",
         rank, v, gw_comm_last_error(comm));
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_restarted_rank_takes_its_place) {
  static const int orders[] = {RESTART_BEFORE_LAST, RESTART_AFTER_LAST, RESTART_NEVER};
  for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++) {
    snprintf(restart_log, sizeof restart_log, "/tmp/gw-restart-log-XXXXXX");
    const int fd = mkstemp(restart_log);
    ck_assert_int_ge(fd, 0);
    close(fd);
    const int rc = run_ranks_raw(3, body_rank_restarted, (void *)&orders[i], 90);
    unlink(restart_log);
    ck_assert_msg(rc == 0, "order %d: the ranks failed", orders[i]);
  }
}
END_TEST

/* A master name with two addresses (/etc/hosts in a mount namespace: gwdual is
 * 127.0.0.1 and 127.0.0.2): rank 0 listens on both, so rank 1 reaching it at
 * one and rank 2 at the other both join.  It bound the first alone, and the
 * rank that took the other was refused until its deadline ("is rank 0
 * running?"), as one with no route for a name's first (IPv6) address. */
static int body_dual_address(int rank, int n, const char *master, void *arg) {
  (void)arg;
  setenv("GW_BOOTSTRAP_TIMEOUT", "5", 1);
  const char *port = strrchr(master, ':') + 1;
  char mine[64];
  snprintf(mine, sizeof mine, "%s:%s", rank == 0 ? "gwdual" : rank == 1 ? "127.0.0.1" : "127.0.0.2", port);
  gw_comm_t comm;
  EXPECT(gw_comm_init(&comm, n, rank, mine) == GW_SUCCESS, "rank %d at %s: init: %s", rank, mine,
         gw_comm_last_error(NULL));
  int32_t v = rank;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS && v == 3, "rank %d: allreduce", rank);
  gw_comm_destroy(comm);
  return 0;
}

static int in_dual_hosts(void *arg) {
  (void)arg;
  char hosts[] = "/tmp/gw-hosts-XXXXXX";
  const int fd = mkstemp(hosts);
  static const char text[] = "127.0.0.1 localhost\n127.0.0.1 gwdual\n127.0.0.2 gwdual\n";
  if (fd < 0 || write(fd, text, sizeof text - 1) != (ssize_t)(sizeof text - 1)) return 1;
  close(fd);
  const bool ns = unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
                  mount(hosts, "/etc/hosts", NULL, MS_BIND, NULL) == 0;
  unlink(hosts);
  if (!ns) return 77;
  return run_ranks_raw(3, body_dual_address, NULL, 60);
}

START_TEST(test_master_name_with_two_addresses) {
  const int r = run_in_child(in_dual_hosts, NULL);
  if (r == 77) {
    printf("test_master_name_with_two_addresses: no mount namespace here (not root?): not run\n");
    return;
  }
  ck_assert_int_eq(r, 0);
}
END_TEST

START_TEST(test_transport_must_agree) { ck_assert_int_eq(run_ranks_raw(2, body_transport_differs, NULL, 60), 0); }
END_TEST

START_TEST(test_torchrun_none_no_token) {
  unsetenv("GW_JOB_TOKEN"); /* and every other launcher's id (a CI job under Slurm has one) */
  unsetenv("SLURM_JOB_ID"), unsetenv("PMIX_NAMESPACE"), unsetenv("OMPI_MCA_orte_ess_jobid");
  setenv("TORCHELASTIC_RUN_ID", "none", 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "1", 1); /* taken as a token, it would wait for rank 1 */
  gw_comm_t comm;
  ck_assert_int_eq(gw_comm_init(&comm, 2, 0, "127.0.0.1:1"), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "no job token") && has(gw_comm_last_error(NULL), "--rdzv-id"), "%s",
                gw_comm_last_error(NULL));
  unsetenv("TORCHELASTIC_RUN_ID");
  unsetenv("GW_BOOTSTRAP_TIMEOUT");
}
END_TEST

/* Numbers from the environment: junk and NaN (which compares false with
 * everything, so GW_TIMEOUT=nan turned every deadline off) take the default. */
START_TEST(test_env_numbers) {
  static const struct { const char *text; double want; } cases[] = {
      {"2.5", 2.5}, {"abc", 300}, {"nan", 300}, {"-nan", 300}, {"5x", 300}, {"", 300}, {"0", 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setenv("GW_TEST_NUMBER", cases[i].text, 1);
    const double got = gw__env_double("GW_TEST_NUMBER", 300);
    ck_assert_msg(got == cases[i].want, "'%s' read as %g", cases[i].text, got);
  }
  /* a size whose suffix overflows (it wrapped to 256 KiB and was taken) */
  setenv("GW_TEST_NUMBER", "18014398509482240K", 1);
  ck_assert_int_eq(gw__env_int("GW_TEST_NUMBER", 7), 7);
  setenv("GW_TEST_NUMBER", "-3K", 1);
  ck_assert_int_eq(gw__env_int("GW_TEST_NUMBER", 7), -3072);
  /* decimal with a leading zero (010 was octal 8, 08 refused), hex after 0x */
  const struct {
    const char *text;
    int64_t want;
  } ints[] = {{"010", 10}, {"08", 8}, {"-010", -10}, {"0x10", 16}, {"0X1fK", 31 << 10}, {"0", 0}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    setenv("GW_TEST_NUMBER", ints[i].text, 1);
    const int64_t got = gw__env_int("GW_TEST_NUMBER", 7);
    ck_assert_msg(got == ints[i].want, "'%s' read as %lld", ints[i].text, (long long)got);
  }
  /* junk where the default is a negative "automatic": the warning says so
   * (it said "using the default -1"); stderr caught in a file meanwhile */
  char said[512] = {0};
  FILE *caught = tmpfile();
  ck_assert_ptr_nonnull(caught);
  fflush(stderr);
  const int saved = dup(2);
  ck_assert(saved >= 0 && dup2(fileno(caught), 2) == 2);
  setenv("GW_TEST_NUMBER", "abc", 1);
  const int64_t got = gw__env_int("GW_TEST_NUMBER", -1), got_min = gw__env_int_min("GW_TEST_NUMBER", -1, 0);
  setenv("GW_TEST_NUMBER", "-5", 1);
  const int64_t below = gw__env_int_min("GW_TEST_NUMBER", 3, 0);
  fflush(stderr);
  ck_assert(dup2(saved, 2) == 2 && close(saved) == 0);
  rewind(caught);
  ck_assert(fread(said, 1, sizeof said - 1, caught) > 0);
  fclose(caught);
  ck_assert_msg(got == -1 && got_min == -1 && below == 3, "read as %lld, %lld, %lld", (long long)got,
                (long long)got_min, (long long)below);
  ck_assert_msg(strstr(said, "GW_TEST_NUMBER=abc is not an integer in range; using the default (automatic)") &&
                    strstr(said, "GW_TEST_NUMBER=-5 is below its least value 0; using the default 3") &&
                    !strstr(said, "default -1"),
                "the warnings said:\n%s", said);
  unsetenv("GW_TEST_NUMBER");
}
END_TEST

/* Ranks bound to cores of their own (srun --cpu-bind, mpirun's binding) are
 * not oversubscribed: each counts the ranks whose CPUs overlap its own (it
 * counted every rank on the machine against its own cores, and waits then
 * yielded at once for good).  Up to 4 ranks, bound to CPUs spread over the
 * machine (one at 64 or above where there is one: the sets are words of 64);
 * then 3 ranks on 2 CPUs, unbound among them, are.  An oversubscribed
 * communicator's waits yield at once while it lives, and spin again after
 * its destroy (a fixed 0 outlived it, for every later communicator). */
struct binding {
  int shared; /* 1: every rank on cpu[0] and cpu[1]; 0: rank r on cpu[r] */
  int cpu[4];
  int expect; /* comm->oversubscribed */
  const char *what;
};

static int raw_bound(int rank, int n, const char *master, void *arg) {
  const struct binding *b = arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (b->shared) CPU_SET(b->cpu[0], &set), CPU_SET(b->cpu[1], &set);
  else CPU_SET(b->cpu[rank], &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) return 3;
  gw_comm_t comm;
  if (gw_comm_init(&comm, n, rank, master) != GW_SUCCESS) return 1;
  EXPECT(comm->oversubscribed == b->expect, "rank %d of %d, %s: oversubscribed %d", rank, n, b->what,
         comm->oversubscribed);
  EXPECT((gw__waiter_spin() == 0) == b->expect, "rank %d, %s: waits spin %g s", rank, b->what, gw__waiter_spin());
  gw_comm_destroy(comm);
  EXPECT(gw__waiter_spin() > 0, "rank %d, %s: waits spin %g s after the destroy", rank, b->what, gw__waiter_spin());
  return 0;
}

/* SHA-256 (FIPS 180-4's examples) and HMAC-SHA256 (RFC 4231's cases 1, 2
 * and 6: a key longer than a block, as a 128-character token is). */
static void hex(const uint8_t *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

START_TEST(test_hmac_vectors) {
  uint8_t d[32];
  char h[65];
  struct gw_sha256 s;
  gw__sha256_init(&s);
  gw__sha256_update(&s, "abc", 3);
  gw__sha256_final(&s, d);
  hex(d, 32, h);
  ck_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  gw__sha256_init(&s);
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* two blocks of padding */
  gw__sha256_update(&s, two, strlen(two));
  gw__sha256_final(&s, d);
  hex(d, 32, h);
  ck_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  uint8_t k1[20], k6[131];
  memset(k1, 0x0b, sizeof k1), memset(k6, 0xaa, sizeof k6);
  const char *m1 = "Hi There", *m2 = "what do ya want for nothing?",
             *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  const struct { const void *key; size_t klen; const char *msg, *want; } v[] = {
      {k1, sizeof k1, m1, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", 4, m2, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {k6, sizeof k6, m6, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"}};
  for (size_t i = 0; i < 3; i++) {
    /* the message in two parts, as the rendezvous passes its fields */
    const size_t cut = strlen(v[i].msg) / 3;
    const void *parts[] = {v[i].msg, v[i].msg + cut};
    const size_t lens[] = {cut, strlen(v[i].msg) - cut};
    gw__hmac_sha256(v[i].key, v[i].klen, parts, lens, 2, d);
    hex(d, 32, h);
    ck_assert_msg(!strcmp(h, v[i].want), "RFC 4231 vector %zu: %s", i, h);
  }
}
END_TEST

/* Something other than this job's rank 0 holds the master port (a squatter,
 * another job's rank 0): it challenges the rank like rank 0 and answers with
 * a proof it cannot make.  The rank must never send the token (it went in
 * the clear in its hello), and must refuse the impostor's word by name. */
struct impostor {
  int fd;
  uint8_t got[4096];
  size_t n;
};

static void *impostor_master(void *arg) {
  struct impostor *im = arg;
  int c = accept(im->fd, NULL, NULL);
  if (c < 0) return NULL;
  struct gw_boot_frame f = {.magic = GW_BOOT_MAGIC, .kind = GW_BOOT_CHALLENGE, .len = GW_BOOT_NONCE};
  uint8_t nonce[GW_BOOT_NONCE] = {7};
  if (write(c, &f, sizeof f) == (ssize_t)sizeof f && write(c, nonce, sizeof nonce) == (ssize_t)sizeof nonce) {
    const size_t want = sizeof f + sizeof(struct gw_boot_hello);
    while (im->n < want) {
      ssize_t r = read(c, im->got + im->n, sizeof im->got - im->n);
      if (r <= 0) break;
      im->n += (size_t)r;
    }
    struct gw_boot_frame p = {.magic = GW_BOOT_MAGIC, .kind = GW_BOOT_PROOF, .len = 32};
    uint8_t bogus[32] = {1, 2, 3};
    if (write(c, &p, sizeof p) == (ssize_t)sizeof p && write(c, bogus, sizeof bogus) == (ssize_t)sizeof bogus) {
      ssize_t r;
      while (im->n < sizeof im->got && (r = read(c, im->got + im->n, sizeof im->got - im->n)) > 0) im->n += (size_t)r;
    }
  }
  close(c);
  return NULL;
}

static int body_impostor(int rank, int n, const char *master, void *arg) {
  (void)rank, (void)n, (void)master, (void)arg;
  static const char token[] = "the-job-secret-4711";
  setenv("GW_JOB_TOKEN", token, 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "5", 1);
  struct impostor im = {.fd = socket(AF_INET, SOCK_STREAM, 0)};
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  EXPECT(im.fd >= 0 && bind(im.fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(im.fd, 4) == 0 &&
             getsockname(im.fd, (struct sockaddr *)&a, &al) == 0,
         "listen");
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, impostor_master, &im) == 0, "thread");
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, 2, 1, addr);
  pthread_join(th, NULL);
  close(im.fd);
  EXPECT(r == GW_ERR_REMOTE && has(gw_comm_last_error(NULL), "does not know this job's token"), "returned %s: %s",
         gw_strerror(r), gw_comm_last_error(NULL));
  EXPECT(im.n >= sizeof(struct gw_boot_frame) + sizeof(struct gw_boot_hello), "the impostor got %zu bytes", im.n);
  EXPECT(!memmem(im.got, im.n, token, strlen(token)), "the token went to the impostor in the clear");
  return 0;
}

START_TEST(test_impostor_master) { ck_assert_int_eq(run_ranks_raw(1, body_impostor, NULL, 30), 0); }
END_TEST

/* Rank 0 closed a rank's connection before its hello came (packet loss held
 * the hello back past rank 0's window; here a test hook closes the first
 * two connections as they come): the rank connects again and the job
 * starts.  It failed at once blaming rank 0 ("lost the bootstrap connection
 * to rank 0 ... did it exit?"), and rank 0 waited for it until its timeout. */
static int body_hello_dropped(int rank, int n, const char *master, void *arg) {
  (void)arg;
  setenv("GW_BOOTSTRAP_TIMEOUT", "30", 1);
  if (rank == 0) setenv("GW_TEST_BOOT_DROP_HELLOS", "2", 1);
  gw_comm_t comm;
  const double t0 = test_now();
  const gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r == GW_SUCCESS, "rank %d: init after %.1f s: %s", rank, test_now() - t0, gw_comm_last_error(NULL));
  int32_t v = rank + 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS && v == n * (n + 1) / 2,
         "rank %d: allreduce", rank);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_hello_dropped_connects_again) { ck_assert_int_eq(run_ranks_raw(3, body_hello_dropped, NULL, 60), 0); }
END_TEST

/* Strangers on the master's port that connect and say nothing (a health
 * check, a port scan holding its connections), one that drips a byte of a
 * frame every half second, and one that sends a gradwire header and stops,
 * all before the ranks: the job starts all the same.  Rank 0 took one
 * handshake at a time, 5 s for each silent one: 10 of them held it 50 s, past
 * the rendezvous' 20 s.  With rank 0 a few descriptors from its limit
 * (headroom), the strangers take them all: it closes the oldest silent one
 * for the next connection (it failed the job: "raise `ulimit -n`").  More
 * silent strangers than rank 0's 256 waiting slots: the oldest is closed for
 * each new connection (rank 0 stopped accepting, and the ranks queued behind
 * them until the timeout, said as missing).  Strangers that send a hello
 * with a wrong token and hold their connection: each is drained beside the
 * others (each held the rendezvous 2 s: 15 of them 30 s).  Harness rank 3 is
 * the strangers; ranks 0-2 the job. */
struct strangers { int n, headroom, bad_token; };
#define MAX_STRANGERS 300
static int body_silent_strangers(int rank, int n, const char *master, void *arg) {
  (void)n;
  const struct strangers *k = arg;
  char up[128], done[128];
  marker(master, "strangers", up, sizeof up);
  marker(master, "strangers-done", done, sizeof done);
  setenv("GW_BOOTSTRAP_TIMEOUT", "20", 1);
  if (rank == 3) {
    char host[64], port[16];
    struct addrinfo *ai = NULL, hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    EXPECT(gw__parse_host_port(master, host, sizeof host, port, sizeof port) &&
           getaddrinfo(host, port, &hints, &ai) == 0, "master %s", master);
    int fds[MAX_STRANGERS];
    for (int i = 0; i < k->n; i++) {
      fds[i] = socket(ai->ai_family, SOCK_STREAM, 0);
      double t0 = test_now(); /* rank 0 may not listen yet */
      while (connect(fds[i], ai->ai_addr, ai->ai_addrlen) != 0 && test_now() - t0 < 30) {
        close(fds[i]);
        usleep(20000);
        fds[i] = socket(ai->ai_family, SOCK_STREAM, 0);
      }
    }
    freeaddrinfo(ai);
    const struct gw_boot_frame f = {.magic = GW_BOOT_MAGIC, .kind = GW_BOOT_HELLO, .len = sizeof(struct gw_boot_hello)};
    EXPECT(send(fds[k->n - 1], &f, sizeof f, MSG_NOSIGNAL) == (ssize_t)sizeof f, "the header");
    for (int i = k->n - 1 - k->bad_token; i < k->n - 1; i++) { /* a whole hello, its MAC not the token's */
      struct {
        struct gw_boot_frame f;
        struct gw_boot_hello h;
      } bad = {f, {.rank = 1, .nranks = 3}};
      EXPECT(send(fds[i], &bad, sizeof bad, MSG_NOSIGNAL) == (ssize_t)sizeof bad, "a wrong token's hello");
    }
    FILE *m = fopen(up, "w");
    if (m) fclose(m);
    /* all held until the job is up (or 25 s), whatever rank 0 did with one */
    static const char drip[] = "GET / HTTP/1.0\r\n";
    for (int i = 0; i < 50 && access(done, F_OK) != 0; i++, usleep(500000))
      (void)send(fds[0], drip + i % (sizeof drip - 1), 1, MSG_NOSIGNAL);
    for (int i = 0; i < k->n; i++) close(fds[i]);
    unlink(up), unlink(done);
    return 0;
  }
  if (rank > 0) EXPECT(wait_for(up, 60), "the strangers never came");
  struct rlimit old;
  if (rank == 0 && k->headroom) { /* the listener and `headroom` more; the limit back after the rendezvous */
    const int lowest = open("/dev/null", O_RDONLY);
    EXPECT(lowest >= 0 && getrlimit(RLIMIT_NOFILE, &old) == 0, "getrlimit");
    close(lowest);
    struct rlimit rl = old;
    rl.rlim_cur = (rlim_t)(lowest + 1 + k->headroom);
    EXPECT(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
  }
  gw_comm_t comm;
  const double t0 = test_now();
  const gw_result_t r = gw_comm_init(&comm, 3, rank, master);
  if (rank == 0 && k->headroom) setrlimit(RLIMIT_NOFILE, &old);
  EXPECT(r == GW_SUCCESS && test_now() - t0 < 15, "rank %d: init after %.1f s: %s", rank, test_now() - t0,
         gw_comm_last_error(NULL));
  if (rank == 0) {
    FILE *m = fopen(done, "w");
    if (m) fclose(m);
  }
  int32_t v = rank + 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL) == GW_SUCCESS && v == 6, "rank %d: allreduce", rank);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_silent_strangers_cost_nothing) {
  static const struct strangers cases[] = {{10, 0, 0}, {24, 12, 0}, {MAX_STRANGERS, 0, 0}, {12, 0, 10}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    ck_assert_msg(run_ranks_raw(4, body_silent_strangers, (void *)&cases[i], 90) == 0,
                  "%d strangers, headroom %d, %d with a wrong token", cases[i].n, cases[i].headroom,
                  cases[i].bad_token);
}
END_TEST

/* A rank out of file descriptors (RLIMIT_NOFILE at the lowest free one) fails
 * at once, saying so; it retried until GW_BOOTSTRAP_TIMEOUT and then said "no
 * answer from master ... (no route); is rank 0 running?". */
static int body_out_of_fds(int rank, int n, const char *master, void *arg) {
  (void)rank, (void)n, (void)master, (void)arg;
  setenv("GW_JOB_TOKEN", "fds", 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "30", 1);
  const int lowest = open("/dev/null", O_RDONLY); /* stdin may be closed */
  EXPECT(lowest >= 0, "open /dev/null");
  close(lowest);
  struct rlimit rl;
  EXPECT(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit");
  rl.rlim_cur = (rlim_t)lowest;
  EXPECT(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
  const double t0 = gw__now();
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, 2, 1, "127.0.0.1:9");
  const double took = gw__now() - t0;
  EXPECT(r == GW_ERR_SYSTEM && has(gw_comm_last_error(NULL), "ulimit -n") && took < 10, "returned %s after %.1f s: %s",
         gw_strerror(r), took, gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_out_of_fds_said) { ck_assert_int_eq(run_ranks_raw(1, body_out_of_fds, NULL, 60), 0); }
END_TEST

START_TEST(test_bound_ranks_not_oversubscribed) {
  cpu_set_t all;
  ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
  int avail[CPU_SETSIZE], n = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &all)) avail[n++] = c;
  if (n < 2) {
    printf("test_bound_ranks_not_oversubscribed: %d CPU here: not run\n", n);
    return;
  }
  const int ranks = n < 4 ? n : 4;
  struct binding own = {.shared = 0, .expect = 0, .what = "each bound to a CPU of its own"},
                 two = {.shared = 1, .cpu = {avail[0], avail[1]}, .expect = 1, .what = "3 ranks on 2 CPUs"};
  for (int k = 0; k < ranks; k++) own.cpu[k] = avail[k * (n - 1) / (ranks - 1)]; /* the first and the last */
  ck_assert_int_eq(run_ranks_raw(ranks, raw_bound, &own, 60), 0);
  ck_assert_int_eq(run_ranks_raw(3, raw_bound, &two, 60), 0);
}
END_TEST

/* The first CPUs this process may run on (up to max); how many. */
static int my_cpus(int *avail, int max) {
  cpu_set_t all;
  ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < max; c++)
    if (CPU_ISSET(c, &all)) avail[n++] = c;
  return n;
}

static void put(const char *dir, const char *rel, const char *file, const char *text) {
  char p[600];
  snprintf(p, sizeof p, "%s%s", dir, rel);
  for (char *q = p + 1; (q = strchr(q, '/')); q++) *q = 0, mkdir(p, 0755), *q = '/'; /* each folder above */
  mkdir(p, 0755);
  snprintf(p + strlen(p), sizeof p - strlen(p), "/%s", file);
  FILE *f = fopen(p, "w");
  ck_assert_msg(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", p);
}

/* A cgroup's CPU quota is read where the process's cgroup is, and above it
 * (a systemd slice, a job scheduler's cgroup: only the root's files were
 * read): 2 ranks on 2 CPUs are oversubscribed under a quota of 1 CPU on an
 * ancestor of their cgroup, v1 (cpu controller) or v2, and not with the
 * quota on a sibling cgroup only.  Fake trees (GW_TEST_CGROUP_FS,
 * GW_TEST_PROC_CGROUP). */
START_TEST(test_nested_cgroup_quota) {
  int avail[2];
  if (my_cpus(avail, 2) < 2) {
    printf("test_nested_cgroup_quota: 1 CPU here: not run\n");
    return;
  }
  char dir[] = "/tmp/gw-cgroup-XXXXXX", v1[64], v2[64], proc[64];
  ck_assert(mkdtemp(dir) != NULL);
  snprintf(v1, sizeof v1, "%s/v1", dir), snprintf(v2, sizeof v2, "%s/v2", dir), snprintf(proc, sizeof proc, "%s/p", dir);
  put(v1, "/cpu", "cpu.cfs_quota_us", "-1\n"), put(v1, "/cpu", "cpu.cfs_period_us", "100000\n");
  put(v1, "/cpu/job", "cpu.cfs_quota_us", "100000\n"), put(v1, "/cpu/job", "cpu.cfs_period_us", "100000\n");
  put(v1, "/cpu/job/step", "cpu.cfs_quota_us", "-1\n"), put(v1, "/cpu/job/step", "cpu.cfs_period_us", "100000\n");
  put(v1, "/cpu/other", "cpu.cfs_quota_us", "100000\n"), put(v1, "/cpu/other", "cpu.cfs_period_us", "100000\n");
  put(v2, "", "cgroup.controllers", "cpu\n");
  put(v2, "/user.slice", "cpu.max", "50000 100000\n"), put(v2, "/user.slice/run", "cpu.max", "max 100000\n");
  put(v2, "/other.slice", "cpu.max", "50000 100000\n");
  static const struct {
    const char *fs, *proc, *what;
    int expect;
  } cases[] = {
      {"v1", "4:cpu,cpuacct:/job/step\n0::/\n", "v1: 1 CPU on the job's cgroup, above this one", 1},
      {"v1", "4:cpu,cpuacct:/job\n", "v1: 1 CPU on this very cgroup", 1},
      {"v1", "4:cpu:/free/step\n", "v1: a quota on a sibling cgroup only", 0},
      {"v2", "0::/user.slice/run\n", "v2: 0.5 CPU on the slice above", 1},
      {"v2", "0::/system.slice/x\n", "v2: a quota on another slice only", 0},
      {"v1", "4:cpu:/../cpu/other\n", "v1: a cgroup outside the namespace's root: the root's quota (none)", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char fs[80];
    snprintf(fs, sizeof fs, "%s/%s", dir, cases[i].fs);
    FILE *f = fopen(proc, "w");
    ck_assert(f && fputs(cases[i].proc, f) >= 0 && fclose(f) == 0);
    setenv("GW_TEST_CGROUP_FS", fs, 1), setenv("GW_TEST_PROC_CGROUP", proc, 1);
    struct binding b = {.shared = 1, .cpu = {avail[0], avail[1]}, .expect = cases[i].expect, .what = cases[i].what};
    ck_assert_msg(run_ranks_raw(2, raw_bound, &b, 60) == 0, "%s", cases[i].what);
  }
  unsetenv("GW_TEST_CGROUP_FS"), unsetenv("GW_TEST_PROC_CGROUP");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rendezvous");
  TCase *tc = tcase_create("rendezvous");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_late_joiner_refused);
  tcase_add_test(tc, test_rank0_twice_said);
  tcase_add_test(tc, test_missing_beside_stranger);
  tcase_add_test(tc, test_hmac_vectors);
  tcase_add_test(tc, test_impostor_master);
  tcase_add_test(tc, test_silent_strangers_cost_nothing);
  tcase_add_test(tc, test_hello_dropped_connects_again);
  tcase_add_test(tc, test_out_of_fds_said);
  tcase_add_test(tc, test_transport_must_agree);
  tcase_add_test(tc, test_failed_rank_says_why);
  tcase_add_test(tc, test_setting_refused_said_to_all);
  tcase_add_test(tc, test_restarted_rank_takes_its_place);
  tcase_add_test(tc, test_master_name_with_two_addresses);
  tcase_add_test(tc, test_torchrun_none_no_token);
  tcase_add_test(tc, test_env_numbers);
  tcase_add_test(tc, test_bound_ranks_not_oversubscribed);
  tcase_add_test(tc, test_nested_cgroup_quota);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
