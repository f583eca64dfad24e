/* harness.c - see harness.h. */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    perror("free_port");
    exit(99);
  }
  close(fd);
  return ntohs(a.sin_port);
}

struct wrap {
  rank_body_fn body;
  void *arg;
};

static int comm_body(int rank, int nranks, const char *master, void *arg) {
  struct wrap *w = arg;
  gw_comm_t comm;
  gw_result_t r = gw_comm_init(&comm, nranks, rank, master);
  if (r != GW_SUCCESS) {
    fprintf(stderr, "rank %d: gw_comm_init failed: %s: %s\n", rank, gw_strerror(r), gw_comm_last_error(NULL));
    return 1;
  }
  int rc = w->body(comm, rank, nranks, w->arg);
  gw_comm_destroy(comm);
  return rc;
}

int run_ranks(int nranks, rank_body_fn body, void *arg, double timeout_s) {
  struct wrap w = {body, arg};
  return run_ranks_raw(nranks, comm_body, &w, timeout_s);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int run_ranks_raw(int nranks, raw_body_fn body, void *arg, double timeout_s) {
  char master[64], token[64];
  snprintf(master, sizeof master, "127.0.0.1:%d", free_port());
  snprintf(token, sizeof token, "test-%d-%llx", (int)getpid(), (unsigned long long)mix64((uint64_t)now_s()));
  setenv("GW_JOB_TOKEN", token, 1);
  pid_t *pids = calloc((size_t)nranks, sizeof *pids);
  fflush(NULL);
  for (int r = 0; r < nranks; r++) {
    pid_t p = fork();
    if (p == 0) _exit(body(r, nranks, master, arg));
    pids[r] = p;
  }
  int failed = 0, left = nranks;
  double deadline = now_s() + timeout_s;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < nranks; r++)
        if (pids[r] == p) {
          pids[r] = 0;
          left--;
          if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break;
          failed++;
          if (WIFSIGNALED(status)) fprintf(stderr, "harness: rank %d killed by signal %d\n", r, WTERMSIG(status));
          else fprintf(stderr, "harness: rank %d exited with %d\n", r, WEXITSTATUS(status));
        }
      continue;
    }
    if (now_s() > deadline) {
      for (int r = 0; r < nranks; r++)
        if (pids[r]) {
          fprintf(stderr, "harness: rank %d still running after %.0f s: killed\n", r, timeout_s);
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          pids[r] = 0;
          failed++;
          left--;
        }
      break;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  free(pids);
  return failed;
}

double test_load(const void *buf, gw_dtype_t dt, size_t i) {
  switch (dt) {
    case GW_INT8: return ((const int8_t *)buf)[i];
    case GW_UINT8: return ((const uint8_t *)buf)[i];
    case GW_INT32: return ((const int32_t *)buf)[i];
    case GW_INT64: return (double)((const int64_t *)buf)[i];
    case GW_FLOAT16: {
      _Float16 h;
      memcpy(&h, (const char *)buf + 2 * i, 2);
      return (double)h;
    }
    case GW_BFLOAT16: {
      uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case GW_FLOAT32: return ((const float *)buf)[i];
    case GW_FLOAT64: return ((const double *)buf)[i];
    default: return 0;
  }
}

void test_store(void *buf, gw_dtype_t dt, size_t i, double v) {
  switch (dt) {
    case GW_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case GW_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case GW_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case GW_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case GW_FLOAT16: {
      _Float16 h = (_Float16)v;
      memcpy((char *)buf + 2 * i, &h, 2);
      break;
    }
    case GW_BFLOAT16: { /* truncation: any bf16 is a fine input, the value read back is exact */
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
      break;
    }
    case GW_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case GW_FLOAT64: ((double *)buf)[i] = v; break;
    default: break;
  }
}

double test_unit_roundoff(gw_dtype_t dt) {
  switch (dt) {
    case GW_FLOAT16: return 0x1p-11;
    case GW_BFLOAT16: return 0x1p-8;
    case GW_FLOAT32: return 0x1p-24;
    case GW_FLOAT64: return 0x1p-53;
    default: return 0;
  }
}

int test_is_float(gw_dtype_t dt) { return test_unit_roundoff(dt) > 0; }
