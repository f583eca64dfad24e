/* test_liveness.c - what tells a waiting rank that its peer on this machine
 * died, and what must not: a rank whose main thread called pthread_exit while
 * another thread drives the communicator is a zombie thread-group leader in
 * /proc (state Z) yet alive; it was declared dead at the first look (about a
 * second into a wait).  A rank that destroyed its communicator early and runs
 * on is said to have left it, not to have died. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm.h"
#include "harness.h"

struct late {
  gw_comm_t comm;
  int rank, n;
};

/* Rank 1's other thread: 3 s late to the allreduce, then ends the process. */
static void *late_allreduce(void *arg) {
  struct late *l = arg;
  sleep(3);
  int32_t v = l->rank + 1;
  gw_result_t r = gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, l->comm, NULL);
  gw_comm_destroy(l->comm);
  fflush(NULL);
  _exit(r == GW_SUCCESS && v == l->n * (l->n + 1) / 2 ? 0 : 1);
}

static int raw_main_thread_exits(int rank, int n, const char *master, void *arg) {
  (void)arg;
  static struct late l;
  if (gw_comm_init(&l.comm, n, rank, master) != GW_SUCCESS) return 1;
  l.rank = rank, l.n = n;
  if (rank == 1) {
    pthread_t t;
    if (pthread_create(&t, NULL, late_allreduce, &l) != 0) return 3;
    pthread_exit(NULL); /* the process goes on in the other thread */
  }
  int32_t v = rank + 1;
  gw_result_t r = gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, l.comm, NULL);
  EXPECT(r == GW_SUCCESS && v == 3, "rank 0: %s, %d: %s", gw_strerror(r), v, gw_comm_last_error(l.comm));
  gw_comm_destroy(l.comm);
  return 0;
}

/* Leftovers in /dev/shm of a dead rank of this user and pid namespace go at
 * the first init (a full /dev/shm failed later jobs under launchers that do
 * not sweep); a live creator's file stays, and so does one of another pid
 * namespace. */
static int raw_sweep(int rank, int n, const char *master, void *arg) {
  (void)arg;
  gw_comm_t comm;
  if (gw_comm_init(&comm, n, rank, master) != GW_SUCCESS) return 1;
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_leftovers_swept) {
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ck_assert_int_gt(dead, 0);
  waitpid(dead, NULL, 0);
  const unsigned long long ns = (unsigned long long)gw__pidns_self();
  char gone[128], alive[128], other_ns[128];
  snprintf(gone, sizeof gone, "/dev/shm/gw-0badf00d-1-0-%d-3-12345678-%llu", (int)dead, ns);
  snprintf(alive, sizeof alive, "/dev/shm/gw-0badf00d-1-0-%d-4-12345678-%llu", (int)getpid(), ns);
  snprintf(other_ns, sizeof other_ns, "/dev/shm/gw-0badf00d-1-0-%d-5-12345678-%llu", (int)dead, ns + 1);
  const char *files[] = {gone, alive, other_ns};
  for (int i = 0; i < 3; i++) {
    int fd = open(files[i], O_CREAT | O_EXCL | O_WRONLY, 0600);
    ck_assert_msg(fd >= 0, "%s: %s", files[i], strerror(errno));
    close(fd);
  }
  ck_assert_int_eq(run_ranks_raw(2, raw_sweep, NULL, 60), 0);
  const int gone_left = access(gone, F_OK) == 0, alive_left = access(alive, F_OK) == 0,
            other_left = access(other_ns, F_OK) == 0;
  for (int i = 0; i < 3; i++) unlink(files[i]);
  ck_assert_msg(!gone_left, "a dead rank's leftover stayed");
  ck_assert_msg(alive_left && other_left, "a live creator's file or another namespace's went");
}
END_TEST

START_TEST(test_main_thread_exit_alive) { ck_assert_int_eq(run_ranks_raw(2, raw_main_thread_exits, NULL, 60), 0); }
END_TEST

/* Rank 2 destroys its communicator after the first of two allreduces and
 * sleeps: the others fail the second within seconds (not at the 30 s
 * deadline), naming rank 2 as gone from the communicator, its process alive. */
static int raw_left_early(int rank, int n, const char *master, void *arg) {
  _Atomic int *reported = arg; /* shared: how many of the others have their answer */
  gw_comm_t comm;
  if (gw_comm_init(&comm, n, rank, master) != GW_SUCCESS) return 1;
  gw_comm_set_timeout(comm, 30);
  int32_t v = 1;
  gw_result_t r = gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL);
  EXPECT(r == GW_SUCCESS && v == n, "rank %d: first allreduce: %s", rank, gw_comm_last_error(comm));
  if (rank == 2) { /* alive until both others have their answer (at most 30 s) */
    gw_comm_destroy(comm);
    for (double t0 = test_now(); atomic_load(reported) < n - 1 && test_now() - t0 < 30;) usleep(10000);
    return 0;
  }
  double t0 = test_now();
  r = gw_allreduce(&v, &v, 1, GW_INT32, GW_SUM, comm, NULL);
  atomic_fetch_add(reported, 1);
  const char *msg = gw_comm_last_error(comm);
  EXPECT(r == GW_ERR_REMOTE && test_now() - t0 < 10, "rank %d: %s after %.1f s: %s", rank, gw_strerror(r),
         test_now() - t0, msg);
  EXPECT(has(msg, "rank 2 (pid") && has(msg, "left the communicator") && !has(msg, "died"), "rank %d: %s", rank, msg);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_left_early_not_died) {
  _Atomic int *reported = test_shared_int();
  ck_assert_int_eq(run_ranks_raw(3, raw_left_early, (void *)reported, 60), 0);
  test_shared_free(reported);
}
END_TEST

int main(void) {
  Suite *s = suite_create("liveness");
  TCase *tc = tcase_create("liveness");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_leftovers_swept);
  tcase_add_test(tc, test_main_thread_exit_alive);
  tcase_add_test(tc, test_left_early_not_died);
  suite_add_tcase(s, tc);
  return run_suite(s);
}
