/* harness.h - runs a test body as N real rank processes on this machine (fork,
 * gw_comm_init over a free loopback port with a fresh job token), with a
 * deadline so a hang fails the test instead of stalling the suite. */
#ifndef GW_TEST_HARNESS_H
#define GW_TEST_HARNESS_H

#include <string.h>
#include <stddef.h>
#include <stdint.h>

#include <check.h>
#include <stdio.h>

#include "dtype_values.h"
#include "gradwire.h"

/* Returns 0 on success; anything else fails the rank (the message goes to stderr). */
typedef int (*rank_body_fn)(gw_comm_t comm, int rank, int nranks, void *arg);
/* Like rank_body_fn, but the body makes (or fails to make) its own communicator. */
typedef int (*raw_body_fn)(int rank, int nranks, const char *master, void *arg);

/* Forks nranks processes running body; returns how many ranks failed (exit code
 * non-zero, a signal, or still running after timeout_s and then killed). */
int run_ranks(int nranks, rank_body_fn body, void *arg, double timeout_s);
int run_ranks_raw(int nranks, raw_body_fn body, void *arg, double timeout_s);

/* A free TCP port on 127.0.0.1. */
int free_port(void);

/* An int, 0, shared by the rank processes run_ranks forks (a handshake
 * between them, instead of a sleep); aborts where mmap fails. */
_Atomic int *test_shared_int(void);
void test_shared_free(_Atomic int *p);

/* Runs fn(out, cap) in a child process with environment variable name set
 * to value (NULL: unset), and copies the cap bytes it left in out back into
 * the caller's out: for settings a process reads once.  Fails the test
 * where the child cannot be made or dies. */
void test_in_child_with_env(const char *name, const char *value, void (*fn)(void *out, size_t cap), void *out,
                            size_t cap);

/* Rank 1 stops itself (SIGSTOP, from a thread, 300 ms in) while every rank
 * runs allreduces of count float32 with algo (simple protocol) back to back,
 * under a timeout of timeout_s, until one fails; rank 0 then lets rank 1 go
 * on (SIGCONT).  Returns the failed call's result and its duration in *took;
 * GW_ERR_INTERNAL, said on stderr, where the setup failed (at most 8 ranks). */
gw_result_t test_allreduce_until_rank1_stopped(gw_comm_t comm, int rank, const char *algo, double timeout_s,
                                               size_t count, double *took);

/* Deterministic pseudo-random numbers for test inputs. */
static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Inside a rank body (which has `rank`): on failure print the message with the
 * place and make the rank fail. */
#define EXPECT(cond, ...)                                 \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "rank %d: ", rank);                 \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, " [%s:%d]\n", __FILE__, __LINE__);  \
      return 1;                                           \
    }                                                     \
  } while (0)

/* Monotonic seconds (one clock for every process of this machine). */
double test_now(void);
/* Whether s (may be NULL) contains sub: messages in assertions. */
static inline int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

/* A rank body for the dead-peer tests: after one allreduce rank 1 kills itself
 * with SIGKILL; every other rank's next allreduce must fail with GW_ERR_REMOTE
 * naming rank 1 within *(double *)arg seconds.  Run it on 3 or more ranks;
 * exactly one rank (the killed one) then counts as failed. */
int body_rank1_killed(gw_comm_t comm, int rank, int n, void *arg);

/* A rank body for the transport-choice tests, on 3 ranks: both ring connections
 * use the transport named by (const char *)arg, and an allreduce over them sums. */
int body_uses_transport(gw_comm_t comm, int rank, int n, void *arg);

/* Runs every test of the suite (Check forks each); the process exit code. */
int run_suite(Suite *s);

/* fn(arg) in a forked child: its return value as the child's exit status, or 1
 * when it died or could not be started.  For whatever must not initialize a
 * device in this process, such as probing a cudnn backend before run_suite:
 * CUDA does not survive fork, and Check forks every test from this process
 * (the children would fail with cudaErrorInitializationError). */
int run_in_child(int (*fn)(void *), void *arg);

/* Unit roundoff of a floating dtype (0 for integers). */
double test_unit_roundoff(gw_dtype_t dt);
int test_is_float(gw_dtype_t dt);

#endif
