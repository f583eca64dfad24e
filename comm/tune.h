/* tune.h - the cost model that picks an algorithm and protocol per operation
 * (tune.c): time(bytes, n) = latency x steps(n) + bytes x factor(n) / bandwidth
 * per (algorithm, protocol), with built-in constants or those of a tuning file
 * (GW_TUNING_FILE, written by `gw-perf --tune`).  Not here: running anything
 * (ring.c, tree.c) or measuring (tools/gw-perf.c). */
#ifndef GW_TUNE_H
#define GW_TUNE_H

#include <stdbool.h>
#include <stddef.h>

#include "core.h"

#define GW_MODEL_NALGOS 4  /* indexed by enum gw_algo; [GW_ALGO_AUTO] unused */
#define GW_MODEL_NPROTOS 2 /* indexed by enum gw_proto */

struct gw_model {
  double lat_us[GW_MODEL_NALGOS][GW_MODEL_NPROTOS];   /* per step */
  double bw_gbps[GW_MODEL_NALGOS][GW_MODEL_NPROTOS];  /* per rank's link */
  /* Where some rank of the job shares its cores with more ranks than cores
   * (the comm sets it, alike on every rank, from the rendezvous table): what
   * a step costs on top, the scheduler handing the core to the rank waited
   * for; 0 otherwise.  Not added where a tuning file's row for this very
   * world size was loaded (fitted_here): that fit measured it already. */
  double oversub_step_us;
  bool fitted_here[GW_MODEL_NALGOS][GW_MODEL_NPROTOS];
};
/* A step's cost under oversubscription (gw_model's oversub_step_us; a
 * compile-time constant): 4 ranks on the 2-core development machine, 8 B
 * allreduce, ring (6 steps) 22-44 us, tree (4) 22-25 us, recursive doubling
 * (2) 12-15 us: 4-7 us a step (another day's runs there measured about 2; at
 * 4 ranks either value picks recursive doubling up to its 256 KiB limit). */
#define GW_MODEL_OVERSUB_STEP_US 5.0
_Static_assert(sizeof(struct gw_model) == 2 * sizeof(double) * GW_MODEL_NALGOS * GW_MODEL_NPROTOS + sizeof(double) +
                                             sizeof(bool) * GW_MODEL_NALGOS * GW_MODEL_NPROTOS,
               "struct gw_model is hashed byte by byte (gw__model_hash): no padding");

/* What an operation's choice depends on; every rank has the same. */
struct gw_pick_args {
  int nranks, coll;  /* enum gw_coll */
  size_t bytes;      /* the whole operation's data (every block for RS/AG) */
  int algo;          /* enum gw_algo: GW_ALGO_AUTO or the one forced */
  int proto;         /* enum gw_proto, or -1: the model decides */
  bool tree_ok;      /* the trees are connected */
  bool ll_ok;        /* every connection has the LL format */
  size_t exchange_max; /* the two-rank exchange only up to this many bytes */
  int tree_levels;     /* the trees' depth when hierarchical; 0: flat, log2(nranks) */
  bool rd_ok;          /* recursive doubling is connected (the exchange at more than 2 ranks) */
};

void gw__model_defaults(struct gw_model *m);
/* The transports a tuning file's rows may name: a communicator's class is
 * the slowest its ring crosses (tcp over ib over shm; comm.c). */
#define GW_TCLASS_NONE 0 /* a row without a transport; a load or write for no communicator */
#define GW_TCLASS_SHM 1
#define GW_TCLASS_IB 2
#define GW_TCLASS_TCP 3
const char *gw__tclass_name(int tclass); /* "shm", "ib", "tcp"; "any" for none */
/* Reads a tuning file over m for a communicator of nranks whose links are of
 * class tclass (rows tagged with another world size or transport are checked
 * and skipped).  A file that does not parse changes nothing and fails with a
 * message naming the line.  *applied (may be NULL): how many rows it took. */
gw_result_t gw__model_load(struct gw_model *m, const char *path, int nranks, int tclass, int *applied,
                           struct gw_errctx *err);
/* The model's time in microseconds; steps and factor by algorithm and collective. */
double gw__model_time(const struct gw_model *m, int algo, int proto, int coll, size_t bytes, int nranks,
                      int tree_levels);
/* gw_tune_write for trees of tree_levels levels (0: flat, log2(nranks)): the
 * per-step latency is the measured time over the steps the run took; rows
 * tagged with the transport class tclass (GW_TCLASS_NONE: untagged). */
gw_result_t gw__tune_write(const char *path, int nranks, int tree_levels, int tclass,
                           const struct gw_tune_sample *samples, int nsamples, const char *note);
/* The cheapest allowed (algorithm, protocol) for an operation. */
void gw__model_pick(const struct gw_model *m, const struct gw_pick_args *a, int *algo, int *proto);
/* A digest of the table, so ranks can check they decide alike. */
uint64_t gw__model_hash(const struct gw_model *m);
/* At INFO level, subsystem TUNE: the table, and the model's times and pick for
 * allreduces of 8 B .. 64 MiB under base's constraints. */
void gw__model_log(const struct gw_model *m, const struct gw_pick_args *base);
const char *gw__algo_name(int algo);
const char *gw__proto_name(int proto);
/* Whether gw__tune_write may replace path: no such file, or a tuning file
 * (gw-perf checks it before it measures).  0, or -1 with why saying what the
 * file is. */
int gw__tune_replaceable(const char *path, char *why, size_t why_cap);
int gw__algo_from_name(const char *s);  /* -1 when unknown */
int gw__proto_from_name(const char *s); /* -1 when unknown; "auto" is -2 */

#endif
