/* test_api_env.c - the launchers' environment variables, part of test_api
 * (test_api.c runs them): gw_comm_init_env under gw-run, torchrun (its agent
 * store's port, its error files as the job token), Slurm (a job step only; the
 * master from the step's first node when none is set), Open MPI, MPICH/Intel
 * MPI, inner launchers over outer ones' leftovers; GW_TIMEOUT checked;
 * GW_DEBUG_SUBSYS lists that name nothing or run past the buffer said. */
#include <check.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm.h" /* gw__slurm_first_host; the timeout */
#include "harness.h"

void add_env_tests(TCase *tc);

/* ---- the launchers' environment variables ---- */
struct env_case {
  const char *rank, *size, *addr, *port;
  int torchrun_agent; /* MASTER_PORT is the port below the harness's, held (as torchrun's agent store holds it) */
  const char *stale[3]; /* set too, as a launcher outside this one leaves them (0: none) */
  int torchrun_local;   /* no GW_JOB_TOKEN: torchrun's run id "none", its error files the token */
};

static int body_env(int rank, int n, const char *master, void *arg) {
  const struct env_case *names = arg;
  char port[16], rs[16], ss[16];
  snprintf(port, sizeof port, "%s", strrchr(master, ':') + 1);
  snprintf(rs, sizeof rs, "%d", rank);
  snprintf(ss, sizeof ss, "%d", n);
  setenv(names->rank, rs, 1);
  setenv(names->size, ss, 1);
  setenv(names->addr, "127.0.0.1", 1);
  setenv(names->port, port, 1);
  for (int i = 0; i < 3 && names->stale[i]; i++) putenv((char *)names->stale[i]);
  if (names->torchrun_local) { /* plain `torchrun --nproc-per-node n`: as its agent sets them */
    char file[160];
    snprintf(file, sizeof file, "/tmp/torchelastic_%s/none_x1/attempt_0/%d/error.json", getenv("GW_JOB_TOKEN"),
             rank);
    setenv("TORCHELASTIC_ERROR_FILE", file, 1);
    setenv("TORCHELASTIC_RUN_ID", "none", 1);
    setenv("LOCAL_RANK", rs, 1);
    setenv("LOCAL_WORLD_SIZE", ss, 1);
    unsetenv("GW_JOB_TOKEN");
  }
  int agent = -1;
  if (names->torchrun_agent) {
    snprintf(port, sizeof port, "%d", atoi(port) - 1);
    setenv(names->port, port, 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    if (rank == 0) { /* the agent's store, listening (best effort: the port may be taken anyway) */
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      agent = socket(AF_INET, SOCK_STREAM, 0);
      if (agent >= 0 && (bind(agent, (struct sockaddr *)&a, sizeof a) != 0 || listen(agent, 4) != 0))
        close(agent), agent = -1;
    }
  }
  gw_comm_t comm;
  gw_result_t r = gw_comm_init_env(&comm);
  if (agent >= 0) close(agent);
  EXPECT(r == GW_SUCCESS, "init_env with %s failed: %s", names->rank, gw_comm_last_error(NULL));
  int got_rank, got_size;
  gw_comm_rank(comm, &got_rank);
  gw_comm_size(comm, &got_size);
  EXPECT(got_rank == rank && got_size == n, "got rank %d size %d", got_rank, got_size);
  int local;
  EXPECT(gw_comm_local_rank(comm, &local) == GW_SUCCESS && local == rank, "local rank %d (all ranks share this machine)", local);
  EXPECT(gw_comm_local_size(comm, &local) == GW_SUCCESS && local == n, "local size %d of %d ranks on this machine", local,
         n);
  int64_t v = rank + 1;
  EXPECT(gw_allreduce(&v, &v, 1, GW_INT64, GW_SUM, comm, NULL) == GW_SUCCESS && v == n * (n + 1) / 2, "sum %lld", (long long)v);
  gw_comm_destroy(comm);
  return 0;
}

/* GW_TIMEOUT: a time in seconds, 0 for no limit, the default when empty;
 * anything else (negative: -300 turned every deadline off; infinite, junk,
 * a unit: 5s was the default 300 with one line of warning; white space on
 * either side) refuses init, naming it, and so does GW_BOOTSTRAP_TIMEOUT's
 * (0 too: it has no "none"). */
START_TEST(test_env_timeout_checked) {
  static const struct {
    const char *name, *value;
    double want; /* -1: refused */
  } cases[] = {{"GW_TIMEOUT", "2.5", 2.5}, {"GW_TIMEOUT", "0", 0},     {"GW_TIMEOUT", "", 300},
               {"GW_TIMEOUT", "-300", -1}, {"GW_TIMEOUT", "inf", -1},  {"GW_TIMEOUT", "abc", -1},
               {"GW_TIMEOUT", "5s", -1},   {"GW_TIMEOUT", "nan", -1},  {"GW_BOOTSTRAP_TIMEOUT", "0", -1},
               {"GW_BOOTSTRAP_TIMEOUT", "1m", -1}, {"GW_BOOTSTRAP_TIMEOUT", "30", 30},
               {"GW_TIMEOUT", " 5", -1},   {"GW_TIMEOUT", "5 ", -1},   {"GW_TIMEOUT", "1e3", 1000}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    setenv(cases[i].name, cases[i].value, 1);
    gw_comm_t c = NULL;
    const gw_result_t r = gw_comm_init(&c, 1, 0, NULL);
    unsetenv(cases[i].name);
    if (cases[i].want < 0) {
      char want[160];
      snprintf(want, sizeof want, "rank 0: %s='%s': not a time in seconds (", cases[i].name, cases[i].value);
      ck_assert_msg(r == GW_ERR_INVALID_ARGUMENT && has(gw_comm_last_error(NULL), want), "%s=%s: %d %s",
                    cases[i].name, cases[i].value, r, gw_comm_last_error(NULL));
      /* GW_TIMEOUT's "0: no limit" only where GW_TIMEOUT is the one refused
       * (the rendezvous' limit has no "none") */
      ck_assert_msg(has(gw_comm_last_error(NULL), "GW_TIMEOUT=0: no limit") == !strcmp(cases[i].name, "GW_TIMEOUT"),
                    "%s=%s: %s", cases[i].name, cases[i].value, gw_comm_last_error(NULL));
      continue;
    }
    ck_assert_msg(r == GW_SUCCESS, "%s=%s: %s", cases[i].name, cases[i].value, gw_comm_last_error(NULL));
    const double got = !strcmp(cases[i].name, "GW_TIMEOUT") ? c->timeout_s : c->conn_params.timeout_s;
    ck_assert_msg(got == cases[i].want, "%s=%s: %g", cases[i].name, cases[i].value, got);
    gw_comm_destroy(c);
  }
}
END_TEST

START_TEST(test_env_launchers) {
  static const struct env_case cases[] = {
      {"GW_RANK", "GW_WORLD_SIZE", "GW_MASTER_ADDR", "GW_MASTER_PORT", 0, {0}, 0},
      {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", 0, {0}, 0},
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "MASTER_ADDR", "MASTER_PORT", 0, {"SLURM_STEP_ID=0", "SLURM_NTASKS=64"},
       0},
      /* MPICH's and Intel MPI's mpiexec (Hydra) */
      {"PMI_RANK", "PMI_SIZE", "GW_MASTER_ADDR", "GW_MASTER_PORT", 0, {0}, 0},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "GW_MASTER_ADDR", "GW_MASTER_PORT", 0, {0}, 0},
      /* mpirun inside an sbatch script: every rank inherits the batch task's Slurm rank */
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "GW_MASTER_ADDR", "GW_MASTER_PORT", 0,
       {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0"}, 0},
      /* torchrun (static rendezvous): its agent's store holds MASTER_PORT */
      {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", 1, {0}, 0},
      /* plain torchrun on one node: run id "none", the token from its error files */
      {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", 1, {0}, 1},
  };
  static const char *all[] = {"GW_RANK", "GW_WORLD_SIZE", "GW_MASTER_ADDR", "GW_MASTER_PORT", "RANK", "WORLD_SIZE",
                              "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
                              "OMPI_COMM_WORLD_SIZE", "SLURM_LOCALID", "TORCHELASTIC_USE_AGENT_STORE",
                              "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "PMI_RANK", "PMI_SIZE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID",
                              "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) unsetenv(all[j]);
    ck_assert_msg(run_ranks_raw(3, body_env, (void *)&cases[i], 60) == 0, "launcher variables %s", cases[i].rank);
  }
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) unsetenv(all[j]);
  gw_comm_t comm;
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "gw-run"));
  /* an sbatch script's own environment: Slurm's rank outside a job step is
   * no launcher's (one program there took itself for rank 0 of them all) */
  setenv("SLURM_PROCID", "0", 1), setenv("SLURM_NTASKS", "4", 1);
  ck_assert_int_eq(gw_env_launched(), 0);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "a job step, not the batch script"), "%s", gw_comm_last_error(NULL));
  setenv("SLURM_STEP_ID", "4294967290", 1); /* salloc's interactive step: no srun task either */
  ck_assert_int_eq(gw_env_launched(), 0);
  setenv("SLURM_STEP_ID", "0", 1);
  ck_assert_int_eq(gw_env_launched(), 1);
  unsetenv("SLURM_PROCID"), unsetenv("SLURM_NTASKS"), unsetenv("SLURM_STEP_ID");
  setenv("GW_RANK", "0", 1);
  setenv("GW_WORLD_SIZE", "2", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert(has(gw_comm_last_error(NULL), "GW_MASTER_ADDR"));
  setenv("GW_MASTER_ADDR", "127.0.0.1", 1), setenv("GW_MASTER_PORT", "1", 1);
  setenv("GW_RANK", "5", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "GW_RANK='5' / world size GW_WORLD_SIZE='2'") &&
                    has(gw_comm_last_error(NULL), "not a valid pair"),
                "%s", gw_comm_last_error(NULL));
  unsetenv("GW_WORLD_SIZE"); /* a rank without its launcher's size: not another launcher's */
  setenv("SLURM_NTASKS", "4", 1);
  setenv("GW_RANK", "1", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "GW_RANK is set but GW_WORLD_SIZE is not"), "%s",
                gw_comm_last_error(NULL));
  /* host:port in the address (retried as a name until the bootstrap
   * deadline), and one too long for the master's name (cut, it named another) */
  unsetenv("SLURM_NTASKS");
  setenv("GW_WORLD_SIZE", "2", 1);
  setenv("GW_MASTER_ADDR", "127.0.0.1:5", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "GW_MASTER_ADDR='127.0.0.1:5' is no host name or address (a port"),
                "%s", gw_comm_last_error(NULL));
  setenv("GW_MASTER_ADDR", "fe80::1%lo", 1); /* an IPv6 address with its zone: no port in it */
  setenv("GW_BOOTSTRAP_TIMEOUT", "0.2", 1);     /* it is then looked for, in vain */
  ck_assert_int_ne(gw_comm_init_env(&comm), GW_SUCCESS);
  unsetenv("GW_BOOTSTRAP_TIMEOUT");
  ck_assert_msg(!has(gw_comm_last_error(NULL), "is no host name"), "%s", gw_comm_last_error(NULL));
  /* a link-local one without its zone: no socket can use it (EINVAL), said
   * at once (it was "is rank 0 running?" after the whole deadline) */
  setenv("GW_MASTER_ADDR", "fe80::1", 1);
  setenv("GW_BOOTSTRAP_TIMEOUT", "0.2", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  unsetenv("GW_BOOTSTRAP_TIMEOUT");
  ck_assert_msg(has(gw_comm_last_error(NULL), "is a link-local IPv6 address without its interface: give it as "
                                              "[fe80::1%IFACE]:"),
                "%s", gw_comm_last_error(NULL));
  char longname[320];
  memset(longname, 'h', sizeof longname - 1), longname[sizeof longname - 1] = 0;
  setenv("GW_MASTER_ADDR", longname, 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "GW_MASTER_ADDR and the port make 321 characters, more than 299"),
                "%s", gw_comm_last_error(NULL));
  /* a bad port named by its variable (it was "'127.0.0.1:abc' is not HOST:PORT") */
  setenv("GW_MASTER_ADDR", "127.0.0.1", 1);
  setenv("GW_MASTER_PORT", "abc", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "GW_MASTER_PORT='abc' is no port: a number from 1 to 65535"), "%s",
                gw_comm_last_error(NULL));
  unsetenv("GW_MASTER_PORT");
  setenv("MASTER_PORT", "65536", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "MASTER_PORT='65536' is no port"), "%s", gw_comm_last_error(NULL));
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) unsetenv(all[j]);
  /* torchrun's agent store on the last port: none follows it for the
   * rendezvous (rank 0 failed to listen, "in use") */
  setenv("RANK", "0", 1), setenv("WORLD_SIZE", "2", 1), setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "65535", 1), setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "torchrun's agent store holds MASTER_PORT 65535 and no port follows"),
                "%s", gw_comm_last_error(NULL));
  setenv("WORLD_SIZE", "1", 1); /* one rank has no rendezvous: the port is no matter */
  ck_assert_msg(gw_comm_init_env(&comm) == GW_SUCCESS, "%s", gw_comm_last_error(NULL));
  ck_assert_int_eq(gw_comm_destroy(comm), GW_SUCCESS);
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) unsetenv(all[j]);
  /* Slurm's step count set but empty: unset, as every other variable (it
   * was "SLURM_STEP_NUM_TASKS is not set" beside SLURM_NTASKS) */
  setenv("SLURM_PROCID", "0", 1), setenv("SLURM_NTASKS", "1", 1), setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_STEP_NUM_TASKS", "", 1);
  ck_assert_msg(gw_comm_init_env(&comm) == GW_SUCCESS, "%s", gw_comm_last_error(NULL));
  ck_assert_int_eq(gw_comm_destroy(comm), GW_SUCCESS);
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) unsetenv(all[j]);
}
END_TEST

/* A launcher's id too long for a token is hashed (it failed init as
 * "GW_JOB_TOKEN is longer than 128 characters", a variable nobody set);
 * a short one is kept as it is. */
START_TEST(test_long_launcher_id_hashed) {
  unsetenv("GW_JOB_TOKEN");
  char id[201], tok[GW_BOOT_TOKEN_MAX + 16], other[sizeof tok];
  memset(id, 'r', sizeof id - 1), id[sizeof id - 1] = 0;
  setenv("TORCHELASTIC_RUN_ID", id, 1);
  ck_assert(gw__job_token(tok, sizeof tok));
  ck_assert_msg(strlen(tok) <= GW_BOOT_TOKEN_MAX && !strncmp(tok, "torchrun-hashed:", 16), "%s", tok);
  id[100] = 's'; /* another id, another token */
  setenv("TORCHELASTIC_RUN_ID", id, 1);
  ck_assert(gw__job_token(other, sizeof other));
  ck_assert_str_ne(tok, other);
  setenv("TORCHELASTIC_RUN_ID", "job-7", 1);
  ck_assert(gw__job_token(tok, sizeof tok));
  ck_assert_str_eq(tok, "torchrun:job-7");
  unsetenv("TORCHELASTIC_RUN_ID");
  setenv("PMIX_NAMESPACE", id, 1);
  ck_assert(gw__job_token(tok, sizeof tok));
  ck_assert_msg(!strncmp(tok, "pmix-hashed:", 12), "%s", tok);
  unsetenv("PMIX_NAMESPACE");
}
END_TEST


/* ---- Slurm's master: the step's first node ---- */
START_TEST(test_slurm_first_host) {
  static const struct {
    const char *list, *want; /* want NULL: not a host list */
  } cases[] = {
      {"node07", "node07"},
      {"node[07-09,12],gpu1", "node07"},
      {"gpu1,node[07-09]", "gpu1"},
      {"n[009-011]", "n009"},
      {"rack[1-2]-n[3,5]", "rack1-n3"},
      {"a-b.c[2]", "a-b.c2"},
      {"node[", NULL},
      {"node[a-b]", NULL},
      {"node[1-2", NULL},
      {"node]1", NULL},
      {"node[1[2]]", NULL},
      {"", NULL},
      {",node1", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[64] = "";
    const bool ok = gw__slurm_first_host(cases[i].list, out, sizeof out);
    ck_assert_msg(ok == (cases[i].want != NULL) && (!ok || !strcmp(out, cases[i].want)), "'%s': %s '%s', expected %s",
                  cases[i].list, ok ? "gave" : "refused", out, cases[i].want ? cases[i].want : "a refusal");
  }
  char tiny[6];
  ck_assert(!gw__slurm_first_host("node[07-09]", tiny, sizeof tiny)); /* "node07" does not fit: refused, not cut */
  ck_assert(gw__slurm_first_host("node[7-9]", tiny, sizeof tiny) && !strcmp(tiny, "node7"));
}
END_TEST

/* srun alone across "nodes" (all this machine: the step's node list says
 * localhost): no MASTER_* set, the master is the first node and a port from
 * the job and step ids; every rank agrees and the job runs. */
static int body_slurm_master(int rank, int n, const char *master, void *arg) {
  (void)master, (void)arg;
  char v[16];
  snprintf(v, sizeof v, "%d", rank);
  setenv("SLURM_PROCID", v, 1);
  setenv("SLURM_LOCALID", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("SLURM_STEP_NUM_TASKS", v, 1);
  setenv("SLURM_NTASKS", "64", 1);
  setenv("SLURM_STEP_ID", "3", 1);
  setenv("SLURM_STEP_NODELIST", "localhost", 1);
  setenv("SLURMD_NODENAME", "localhost", 1);
  gw_comm_t comm;
  EXPECT(gw_comm_init_env(&comm) == GW_SUCCESS, "init_env under srun: %s", gw_comm_last_error(NULL));
  int64_t x = rank + 1;
  EXPECT(gw_allreduce(&x, &x, 1, GW_INT64, GW_SUM, comm, NULL) == GW_SUCCESS && x == n * (n + 1) / 2, "sum %lld",
         (long long)x);
  gw_comm_destroy(comm);
  return 0;
}

START_TEST(test_slurm_master_from_nodelist) {
  static const char *all[] = {"GW_RANK", "GW_WORLD_SIZE", "GW_MASTER_ADDR", "GW_MASTER_PORT", "RANK", "WORLD_SIZE",
                              "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) unsetenv(all[j]);
  /* a job id whose port (20000 + FNV-1a("JOB.3") mod 12000) is free now */
  char job[24];
  for (int id = (int)getpid(), tries = 0; tries < 100; id++, tries++) {
    char jobstep[40];
    snprintf(jobstep, sizeof jobstep, "%d.3", id);
    const int port = 20000 + (int)(gw__fnv(GW_FNV_START, jobstep, strlen(jobstep)) % 12000);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool free_now = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    snprintf(job, sizeof job, "%d", id);
    if (free_now) break;
  }
  setenv("SLURM_JOB_ID", job, 1);
  ck_assert_int_eq(run_ranks_raw(3, body_slurm_master, NULL, 60), 0);
  /* Rank 0 elsewhere than the list's first node: said, naming both, before
   * anyone waits for it there. */
  setenv("SLURM_PROCID", "0", 1), setenv("SLURM_STEP_NUM_TASKS", "2", 1), setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_STEP_NODELIST", "node[07-08]", 1), setenv("SLURMD_NODENAME", "node08", 1);
  gw_comm_t comm;
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "rank 0 runs on node08, not on the step's first node node07 (from "
                "SLURM_STEP_NODELIST)"), "%s",
                gw_comm_last_error(NULL));
  /* A first node whose name resolves to a loopback address on rank 0's
   * (Debian's 127.0.1.1) in a step of two nodes: said at once, not after the
   * bootstrap timeout with the other node's ranks refused; in a step of one
   * node it is fine (the 3-rank job above, on localhost) */
  setenv("SLURM_STEP_NODELIST", "localhost,node2", 1), setenv("SLURMD_NODENAME", "localhost", 1);
  setenv("SLURM_STEP_NUM_NODES", "2", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "the step's first node localhost resolves to ") &&
                    has(gw_comm_last_error(NULL), "(a loopback address) here, which the ranks on the other 1 nodes"),
                "%s", gw_comm_last_error(NULL));
  setenv("SLURM_STEP_NODELIST", "node[07-08]", 1), setenv("SLURMD_NODENAME", "node08", 1);
  /* A heterogeneous job: its components have job ids of their own. */
  setenv("SLURM_HET_SIZE", "2", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "heterogeneous Slurm job"), "%s", gw_comm_last_error(NULL));
  unsetenv("SLURM_HET_SIZE");
  /* No list to take a first node from. */
  setenv("SLURM_STEP_NODELIST", "node[", 1);
  ck_assert_int_eq(gw_comm_init_env(&comm), GW_ERR_INVALID_ARGUMENT);
  ck_assert_msg(has(gw_comm_last_error(NULL), "Slurm's node list ('node[') names no first node"), "%s",
                gw_comm_last_error(NULL));
  static const char *slurm[] = {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
                                "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURMD_NODENAME", "SLURM_JOB_ID",
                                "SLURM_STEP_NUM_NODES"};
  for (size_t j = 0; j < sizeof slurm / sizeof slurm[0]; j++) unsetenv(slurm[j]);
}
END_TEST

/* GW_DEBUG_SUBSYS that names no subsystem (",,,") or runs past 255
 * characters is said on stderr (the first hid every subsystem's lines, the
 * second dropped the names past the cut, both without a word).  In a child:
 * the logger reads its settings once per process; its stderr into a file. */
static int debug_subsys_said(void *arg) {
  const char *const *c = arg; /* value, what stderr must hold */
  char path[] = "/tmp/gw-subsys-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0 || dup2(fd, 2) < 0) return 2;
  setenv("GW_DEBUG", "INFO", 1);
  setenv("GW_DEBUG_SUBSYS", c[0], 1);
  gw__log_init();
  char buf[1024] = "";
  const ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
  unlink(path);
  return got > 0 && strstr(buf, c[1]) ? 0 : 1;
}

START_TEST(test_debug_subsys_said) {
  char long_list[400] = "INIT";
  while (strlen(long_list) < 300) strcat(long_list, ",COLL");
  const char *const cases[][2] = {{",,,", "names no subsystem: no subsystem's lines are shown"},
                                  {"^,", "names no subsystem: every subsystem's lines are shown"},
                                  {long_list, "longer than 255 characters"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    ck_assert_msg(run_in_child(debug_subsys_said, (void *)cases[i]) == 0, "GW_DEBUG_SUBSYS=%.20s", cases[i][0]);
}
END_TEST

/* GW_TRANSPORT=shm between two ranks of one machine that do not share
 * /dev/shm (rank 1 in a mount namespace of its own, as another container):
 * the refusal says so (it said "shm needs both on one machine", both were). */
static int own_dev_shm(void) {
  return unshare(CLONE_NEWNS) == 0 && mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
         mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=16m") == 0;
}

static int body_apart(int rank, int n, const char *master, void *arg) {
  (void)arg;
  EXPECT(rank == 0 || own_dev_shm(), "rank 1: a /dev/shm of its own: %s", strerror(errno));
  setenv("GW_TRANSPORT", "shm", 1);
  gw_comm_t comm;
  const gw_result_t r = gw_comm_init(&comm, n, rank, master);
  EXPECT(r == GW_ERR_UNSUPPORTED && has(gw_comm_last_error(NULL), "both are on this machine but do not share /dev/shm"),
         "rank %d: %s: %s", rank, gw_strerror(r), gw_comm_last_error(NULL));
  return 0;
}

START_TEST(test_shm_apart_said) {
  const pid_t p = fork(); /* can a process here have a /dev/shm of its own? (root, no seccomp in the way) */
  if (p == 0) _exit(own_dev_shm() ? 0 : 1);
  int st = 0;
  if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("test_shm_apart_said: no mount namespace of one's own here: not run\n");
    return;
  }
  ck_assert_int_eq(run_ranks_raw(2, body_apart, NULL, 60), 0);
}
END_TEST

void add_env_tests(TCase *tc) {
  tcase_add_test(tc, test_shm_apart_said);
  tcase_add_test(tc, test_debug_subsys_said);
  tcase_add_test(tc, test_env_launchers);
  tcase_add_test(tc, test_long_launcher_id_hashed);
  tcase_add_test(tc, test_env_timeout_checked);
  tcase_add_test(tc, test_slurm_first_host);
  tcase_add_test(tc, test_slurm_master_from_nodelist);
}
