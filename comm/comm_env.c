/* comm_env.c - what a rank learns from its launcher's environment (out of
 * comm.c, which was past 900 lines): the (rank, world size) pair of gw-run,
 * torchrun, Open MPI, MPICH / Intel MPI or Slurm, the local rank, the master
 * address and the job token; gw_comm_init_env and gw_env_launched. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm.h"
#include "netname.h"

/* ---- environment ---------------------------------------------------------------- */
/* The first of names set and not empty (its name in *which, if asked). */
static const char *first_env_named(const char *const *names, const char **which) {
  for (; *names; names++) {
    const char *v = getenv(*names);
    if (v && *v) {
      if (which) *which = *names;
      return v;
    }
  }
  return NULL;
}

static const char *first_env(const char *const *names) { return first_env_named(names, NULL); }

static bool parse_int(const char *s, long lo, long hi, int *out) {
  if (!s) return false;
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

/* Launchers are looked for innermost first: mpirun inside an sbatch script
 * leaves the batch task's SLURM_PROCID (0) in every rank's environment, so
 * Slurm's variables come last (they came before Open MPI's, and every rank
 * of such a job claimed rank 0). */
static const char *const local_vars[] = {"GW_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};

const char *gw__env_local_rank(void) { return first_env(local_vars); }

/* The launchers' (rank, world size) pairs, innermost first (see local_vars):
 * a rank from one and a size from another mixed two jobs' numbering.
 * MPICH's and Intel MPI's mpiexec (Hydra) say PMI_RANK / PMI_SIZE.  Slurm's
 * only inside a job step (srun: SLURM_STEP_ID): a batch script's own
 * environment holds SLURM_PROCID 0 and SLURM_NTASKS of the whole
 * allocation, and one program run there took itself for rank 0 of them. */
static const char *const launchers[][2] = {{"GW_RANK", "GW_WORLD_SIZE"},
                                           {"RANK", "WORLD_SIZE"},
                                           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                           {"PMI_RANK", "PMI_SIZE"},
                                           {"SLURM_PROCID", "SLURM_NTASKS"}};
enum { NLAUNCHERS = sizeof launchers / sizeof launchers[0] };

/* Whether this process is a task of a Slurm job step srun started: a step id
 * below Slurm's special ones (batch 0xfffffffb, interactive 0xfffffffa,
 * extern ...; an salloc shell's interactive step holds SLURM_PROCID 0 and the
 * allocation's SLURM_NTASKS as a batch script does). */
static bool slurm_task_step(void) {
  const char *s = getenv("SLURM_STEP_ID");
  char *end;
  errno = 0;
  const unsigned long long id = s && *s ? strtoull(s, &end, 10) : ~0ull;
  return s && *s && !*end && !errno && id < 0xfffffff0ull;
}

/* The launcher pair whose rank the environment holds: its index, or -1. */
static int launcher_pair(void) {
  for (int i = 0; i < NLAUNCHERS; i++) {
    const char *v = getenv(launchers[i][0]);
    if (!v || !*v) continue;
    if (!strcmp(launchers[i][0], "SLURM_PROCID") && !slurm_task_step()) continue;
    return i;
  }
  return -1;
}

int gw_env_launched(void) { return launcher_pair() >= 0; }

bool gw__slurm_first_host(const char *list, char *out, size_t len) {
  size_t n = 0;
  for (const char *p = list; p && *p && *p != ','; p++) {
    if (*p == '[') { /* a range group: its first number, as written (zero padding kept) */
      const char *q = p + 1;
      if (*q < '0' || *q > '9') return false;
      for (; *q >= '0' && *q <= '9'; q++)
        if (n + 1 < len) out[n++] = *q;
        else return false;
      p = strchr(q, ']');
      if (!p || memchr(q, '[', (size_t)(p - q))) return false;
      continue;
    }
    if (*p == ']' || n + 1 >= len) return false;
    out[n++] = *p;
  }
  out[n] = 0;
  return n > 0;
}

/* A Slurm step's master when none is set (srun alone, as torchrun's users
 * export MASTER_ADDR from the node list): rank 0's host is the step's first
 * node (task 0's with srun's block and cyclic distributions; rank 0 checks
 * that it is on it), the port 20000 + FNV-1a("JOB.STEP") mod 12000, the
 * same on every rank, below Linux's ephemeral ports (32768-60999), which any
 * connection may take.  Not in a heterogeneous job (its components have job
 * ids of their own).  Returns an error's code, or GW_SUCCESS with addr and
 * port filled (or left as they were where given). */
static gw_result_t slurm_master(int rank, const char **addr, const char **port, char *host, size_t hostlen,
                                char *portbuf, size_t portlen, struct gw_errctx *err) {
  const char *het = getenv("SLURM_HET_SIZE");
  if (het && *het)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: no master address, and a heterogeneous Slurm job's "
                   "components cannot agree on one: set GW_MASTER_ADDR and GW_MASTER_PORT", rank);
  if (!*addr) {
    const char *list = getenv("SLURM_STEP_NODELIST"), *list_var = "SLURM_STEP_NODELIST";
    if (!list || !*list) list = getenv("SLURM_JOB_NODELIST"), list_var = "SLURM_JOB_NODELIST";
    if (!list || !*list || !gw__slurm_first_host(list, host, hostlen))
      return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: no master address: Slurm's node list ('%s') names no "
                     "first node; set GW_MASTER_ADDR and GW_MASTER_PORT (rank 0's host and a free port)", rank,
                     list ? list : "");
    const char *node = getenv("SLURMD_NODENAME");
    if (rank == 0 && node && *node && strcmp(node, host) != 0)
      return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank 0 runs on %s, not on the step's first node %s (from "
                     "%s), where the other ranks look for it (srun --distribution=arbitrary?): set "
                     "GW_MASTER_ADDR to rank 0's host", node, host, list_var);
    /* rank 0 would listen there alone, out of the other nodes' reach (gw-run
     * refuses such a --master the same way) */
    const char *nodes = getenv("SLURM_STEP_NUM_NODES");
    char lo[64];
    if (rank == 0 && nodes && atoi(nodes) > 1 && gw__name_is_loopback(host, lo, sizeof lo))
      return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank 0: the step's first node %s resolves to %s (a loopback "
                     "address) here, which the ranks on the other %d nodes cannot reach: set GW_MASTER_ADDR to this "
                     "node's network address (Debian and Ubuntu map the host name to 127.0.1.1 in /etc/hosts)",
                     host, lo, atoi(nodes) - 1);
    *addr = host;
  }
  if (!*port || !**port) {
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    char id[64];
    snprintf(id, sizeof id, "%s.%s", job ? job : "", step ? step : "");
    snprintf(portbuf, portlen, "%llu", 20000 + (unsigned long long)(gw__fnv(GW_FNV_START, id, strlen(id)) % 12000));
    *port = portbuf;
  }
  GW_INFO(GW_SUB_INIT, "rank %d: master %s:%s, %s from Slurm's step (GW_MASTER_ADDR and GW_MASTER_PORT set "
          "others)", rank, *addr, *port,
          *addr == host && *port == portbuf ? "both" : *addr == host ? "the host" : "the port");
  return GW_SUCCESS;
}

/* A launcher's id as the token, "PREFIX:ID"; an id that would make it longer
 * than a token may be (a deep PMIx namespace, a long --rdzv-id) is hashed,
 * 128 bits (it failed init as "GW_JOB_TOKEN is longer than 128 characters",
 * a variable nobody had set). */
static bool launcher_token(char *out, size_t len, const char *prefix, const char *id, const char *more) {
  const int w = snprintf(out, len, "%s:%s%s", prefix, id, more);
  if (w >= 0 && (size_t)w <= GW_BOOT_TOKEN_MAX && (size_t)w < len) return true;
  uint64_t h1 = gw__fnv(GW_FNV_START, id, strlen(id)), h2 = gw__fnv(h1 ^ 0x9e3779b97f4a7c15ull, id, strlen(id));
  h1 = gw__fnv(h1, more, strlen(more)), h2 = gw__fnv(h2, more, strlen(more));
  snprintf(out, len, "%s-hashed:%016llx%016llx", prefix, (unsigned long long)h1, (unsigned long long)h2);
  return true;
}

/* The job token: GW_JOB_TOKEN, else an id every rank of the same launch shares. */
bool gw__job_token(char *out, size_t len) {
  const char *t = getenv("GW_JOB_TOKEN");
  if (t && *t) return snprintf(out, len, "%s", t), true;
  /* torchrun's default id with a static --master-addr is "none" for every job */
  if ((t = getenv("TORCHELASTIC_RUN_ID")) && *t && strcmp(t, "none") != 0)
    return launcher_token(out, len, "torchrun", t, "");
  /* ... and on one node its agent's own: every worker's error file lies in
   * <log dir>/<run id>_<random>/attempt_<n>/<local rank>/error.json, the
   * directory above the local rank's made afresh for each agent and attempt
   * (plain `torchrun --nproc-per-node N prog` failed here) */
  const char *world = getenv("WORLD_SIZE"), *local = getenv("LOCAL_WORLD_SIZE"), *lr = getenv("LOCAL_RANK"),
             *ef = getenv("TORCHELASTIC_ERROR_FILE");
  if (t && !strcmp(t, "none") && world && local && lr && ef && !strcmp(world, local)) {
    const char *file = strrchr(ef, '/'), *rank_dir = NULL;
    for (const char *p = ef; file && p < file; p++)
      if (*p == '/') rank_dir = p; /* the '/' before <local rank> */
    if (file && rank_dir && !strcmp(file, "/error.json") && (size_t)(file - rank_dir - 1) == strlen(lr) &&
        !strncmp(rank_dir + 1, lr, strlen(lr)) && rank_dir > ef) /* hashed: a deep --log_dir is long */
      return snprintf(out, len, "torchrun-local:%016llx",
                      (unsigned long long)gw__fnv(GW_FNV_START, ef, (size_t)(rank_dir - ef))), true;
  }
  /* An mpirun's own id before Slurm's: two mpiruns of one sbatch script share
   * the job and (batch) step ids. */
  if ((t = getenv("PMIX_NAMESPACE")) && *t) return launcher_token(out, len, "pmix", t, "");
  if ((t = getenv("OMPI_MCA_orte_ess_jobid")) && *t) return launcher_token(out, len, "ompi", t, "");
  const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
  char dot_step[80];
  snprintf(dot_step, sizeof dot_step, ".%.70s", step ? step : "");
  if (job && *job) return launcher_token(out, len, "slurm", job, dot_step);
  return false;
}

gw_result_t gw_comm_init_env(gw_comm_t *comm) {
  static const char *const addr_vars[] = {"GW_MASTER_ADDR", "MASTER_ADDR", NULL};
  struct gw_errctx err = {{0}};
  if (!comm) return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_comm_init_env: comm is NULL"));
  *comm = NULL;
  int rank, size;
  const int pair = launcher_pair();
  if (pair < 0)
    return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                   "gw_comm_init_env: no rank / world size in the environment; launch with "
                                   "gw-run, torchrun, srun (a job step, not the batch script itself) or "
                                   "mpirun / mpiexec, or set GW_RANK and GW_WORLD_SIZE"));
  const char *rv = launchers[pair][0], *sv = launchers[pair][1], *rs = getenv(rv);
  /* the step's own count (SLURM_NTASKS may be the allocation's, kept by srun) */
  if (!strcmp(rv, "SLURM_PROCID") && getenv("SLURM_STEP_NUM_TASKS") && *getenv("SLURM_STEP_NUM_TASKS"))
    sv = "SLURM_STEP_NUM_TASKS"; /* (empty: unset, as everywhere) */
  const char *ss = getenv(sv);
  if (!ss || !*ss)
    return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                   "gw_comm_init_env: %s is set but %s is not", rv, sv));
  if (!parse_int(ss, 1, GW_MAX_NRANKS, &size) || !parse_int(rs, 0, size - 1, &rank))
    return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                   "gw_comm_init_env: rank %s='%s' / world size %s='%s' from the environment are "
                                   "not a valid pair (need 0 <= rank < size)", rv, rs, sv, ss));
  const char *avar = "the Slurm node list's first host"; /* where addr came from, for messages */
  const char *addr = first_env_named(addr_vars, &avar), *port = getenv("GW_MASTER_PORT");
  const char *pvar = "GW_MASTER_PORT"; /* where port came from, for messages */
  char master[300] = "", moved[16];
  if (!port || !*port) {
    port = getenv("MASTER_PORT"), pvar = "MASTER_PORT";
    /* Under torchrun the agent's own store (TCPStore) listens on MASTER_PORT
     * for the whole job (TORCHELASTIC_USE_AGENT_STORE=True: its static
     * rendezvous, the default with --master-addr/--master-port): rank 0 could
     * not listen there ("port in use"); the next port is gradwire's. */
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    int p;
    if (port && agent && !strcasecmp(agent, "true") && parse_int(port, 1, 65534, &p)) {
      snprintf(moved, sizeof moved, "%d", p + 1);
      port = moved;
      GW_INFO(GW_SUB_INIT, "rank %d: torchrun's agent store holds MASTER_PORT %d: the rendezvous uses port %s "
              "(GW_MASTER_PORT sets another)", rank, p, port);
    } else if (size > 1 && port && agent && !strcasecmp(agent, "true") && parse_int(port, 65535, 65535, &p)) {
      /* no port after it: rank 0 would have failed to listen, "in use" */
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: torchrun's agent store holds "
                                         "MASTER_PORT 65535 and no port follows it for the rendezvous: set "
                                         "GW_MASTER_PORT, or give torchrun a lower --master-port", rank));
    }
  }
  char slurm_host[256], slurm_port[16];
  if (size > 1 && (!addr || !port || !*port) && !strcmp(rv, "SLURM_PROCID")) {
    const gw_result_t r = slurm_master(rank, &addr, &port, slurm_host, sizeof slurm_host, slurm_port,
                                       sizeof slurm_port, &err);
    if (r != GW_SUCCESS) return gw__init_fail(&err, r);
  }
  if (size > 1) {
    if (!addr || !port || !*port)
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT,
                                     "rank %d: no master address; set GW_MASTER_ADDR and GW_MASTER_PORT "
                                     "(rank 0's host and a free port)", rank));
    /* the port named by its variable (the master's parse said only
     * "'127.0.0.1:abc' is not HOST:PORT"), a decimal number */
    int pnum;
    if (port != moved && port != slurm_port && !parse_int(port, 1, 65535, &pnum))
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s='%s' is no port: a number "
                                         "from 1 to 65535", rank, pvar, port));
    /* host:port in the address (a torchrun-style slip) was taken for an IPv6
     * literal and retried as a name until the bootstrap deadline */
    struct in6_addr a6;
    char v6[64]; /* the address before a zone id (fe80::1%eth0), which inet_pton does not take */
    snprintf(v6, sizeof v6, "%.*s", (int)strcspn(addr, "%"), addr);
    if (addr[0] != '[' && strchr(addr, ':') && inet_pton(AF_INET6, v6, &a6) != 1)
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s='%s' is no host name or "
                                         "address (a port there? give it in GW_MASTER_PORT or MASTER_PORT)", rank,
                                         avar, addr));
    const int w = snprintf(master, sizeof master, strchr(addr, ':') && addr[0] != '[' ? "[%s]:%s" : "%s:%s", addr,
                           port);
    if (w < 0 || (size_t)w >= sizeof master) /* cut, it named another host or port */
      return gw__init_fail(&err, gw__err(&err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s and the port make %d "
                                         "characters, more than %zu", rank, avar, w, sizeof master - 1));
  }
  return gw_comm_init(comm, size, rank, size > 1 ? master : NULL);
}

