/* tune.c - the cost model (tune.h): its built-in table, the tuning file
 * (GW_TUNING_FILE; read here, written by gw_tune_write for `gw-perf --tune`),
 * the time of an operation by algorithm and protocol, and the choice of the
 * cheapest.  Every rank computes the same choice from the same call and the
 * same table (comm.c checks the tables agree at init), so no rank waits on
 * connections its peers do not use.  Not here: the algorithms. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"
#include "tune.h"

static const char *const algo_names[GW_MODEL_NALGOS] = {[GW_ALGO_AUTO] = "auto", [GW_ALGO_RING] = "ring",
                                                        [GW_ALGO_EXCHANGE] = "exchange", [GW_ALGO_TREE] = "tree"};
static const char *const proto_names[GW_MODEL_NPROTOS] = {[GW_PROTO_SIMPLE] = "simple", [GW_PROTO_LL] = "ll"};

const char *gw__algo_name(int algo) { return algo >= 0 && algo < GW_MODEL_NALGOS ? algo_names[algo] : "?"; }
const char *gw__proto_name(int proto) { return proto >= 0 && proto < GW_MODEL_NPROTOS ? proto_names[proto] : "auto"; }

static const char *const tclass_names[] = {[GW_TCLASS_NONE] = "any", [GW_TCLASS_SHM] = "shm", [GW_TCLASS_IB] = "ib",
                                           [GW_TCLASS_TCP] = "tcp"};
const char *gw__tclass_name(int tclass) {
  return tclass > GW_TCLASS_NONE && tclass <= GW_TCLASS_TCP ? tclass_names[tclass] : "any";
}
static int tclass_from_name(const char *s) {
  for (int t = GW_TCLASS_SHM; t <= GW_TCLASS_TCP; t++)
    if (!strcasecmp(s, tclass_names[t])) return t;
  return -1;
}

int gw__algo_from_name(const char *s) {
  for (int a = 0; a < GW_MODEL_NALGOS; a++)
    if (!strcasecmp(s, algo_names[a])) return a;
  return -1;
}

int gw__proto_from_name(const char *s) {
  if (!strcasecmp(s, "auto")) return -2;
  for (int p = 0; p < GW_MODEL_NPROTOS; p++)
    if (!strcasecmp(s, proto_names[p])) return p;
  return -1;
}

/* Fitted by `gw-perf --tune` on the 2-core development machine (2 ranks, shm,
 * idle; two runs averaged), except the tree's simple bandwidth: at 2 ranks the
 * trees are two one-hop pipes and measure like the ring, but an interior node
 * handles three streams, and at 16 MiB the tree took 1.4x the ring's time
 * (docs/architecture.md, "Choosing the algorithm and protocol"); and the
 * exchange's, set to the ring's: the fit's two points (4 KiB, 256 KiB) hide
 * that it beat the ring at every size up to 256 KiB in direct runs. */
void gw__model_defaults(struct gw_model *m) {
  static const struct { int algo, proto; double lat_us, bw_gbps; } rows[] = {
      {GW_ALGO_RING, GW_PROTO_SIMPLE, 0.12, 14.5},     {GW_ALGO_RING, GW_PROTO_LL, 0.11, 4.3},
      {GW_ALGO_TREE, GW_PROTO_SIMPLE, 0.13, 10.0},     {GW_ALGO_TREE, GW_PROTO_LL, 0.11, 4.7},
      {GW_ALGO_EXCHANGE, GW_PROTO_SIMPLE, 0.18, 14.5}, {GW_ALGO_EXCHANGE, GW_PROTO_LL, 0.14, 4.4},
  };
  memset(m, 0, sizeof *m);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    m->lat_us[rows[i].algo][rows[i].proto] = rows[i].lat_us;
    m->bw_gbps[rows[i].algo][rows[i].proto] = rows[i].bw_gbps;
  }
}

static int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) d++;
  return d;
}

/* Recursive doubling's steps (rd.c): log2 p exchanges (p the largest power of
 * two <= n), 2 more to fold the other n - p ranks in and out; 1 at n = 2. */
static int rd_steps(int n) {
  int p = 1, k = 0;
  while (p * 2 <= n) p *= 2, k++;
  return k + (n > p ? 2 : 0);
}

/* Hops a message crosses, and the share of the data each rank sends: the
 * ring's 2(n - 1) steps moving 2(n - 1)/n of the data (half of both for
 * reduce-scatter and allgather; n - 1 steps of all of it for a broadcast); the
 * trees' 2 log2(n) levels, where a rank interior in one tree sends its half up
 * once and down twice and its other half once as a leaf: about 2(n - 1)/n as
 * well (exactly 1 at n = 2); hierarchical trees (several machines) their
 * measured depth instead of log2(n); the exchange (recursive doubling) its
 * steps, each with all of the data (one hop at n = 2). */
static void shape(int algo, int coll, int n, int tree_levels, double *steps, double *factor) {
  if (algo == GW_ALGO_TREE) *steps = 2.0 * (tree_levels ? tree_levels : ceil_log2(n)), *factor = 2.0 * (n - 1) / n;
  else if (algo == GW_ALGO_EXCHANGE) *steps = *factor = rd_steps(n);
  else if (coll == GW_COLL_ALLREDUCE || coll == GW_COLL_BARRIER) *steps = 2.0 * (n - 1), *factor = 2.0 * (n - 1) / n;
  else if (coll == GW_COLL_BROADCAST) *steps = n - 1, *factor = 1;
  else *steps = n - 1, *factor = (double)(n - 1) / n;
}

double gw__model_time(const struct gw_model *m, int algo, int proto, int coll, size_t bytes, int nranks,
                      int tree_levels) {
  double steps, factor;
  shape(algo, coll, nranks, tree_levels, &steps, &factor);
  const double lat = m->lat_us[algo][proto] + (m->fitted_here[algo][proto] ? 0 : m->oversub_step_us);
  return steps * lat + (double)bytes * factor / (m->bw_gbps[algo][proto] * 1e3);
}

static bool algo_allowed(const struct gw_pick_args *a, int algo) {
  bool reduce = a->coll == GW_COLL_ALLREDUCE || a->coll == GW_COLL_BARRIER;
  if (algo == GW_ALGO_TREE) return reduce && a->tree_ok && (a->algo == GW_ALGO_AUTO || a->algo == GW_ALGO_TREE);
  if (algo == GW_ALGO_EXCHANGE)
    return reduce && (a->nranks == 2 || a->rd_ok) &&
           (a->algo == GW_ALGO_EXCHANGE || (a->algo == GW_ALGO_AUTO && a->bytes <= a->exchange_max));
  /* The ring runs everything the others do not. */
  return a->algo == GW_ALGO_AUTO || a->algo == GW_ALGO_RING || !reduce ||
         (a->algo == GW_ALGO_TREE && !a->tree_ok) || (a->algo == GW_ALGO_EXCHANGE && a->nranks != 2 && !a->rd_ok);
}

void gw__model_pick(const struct gw_model *m, const struct gw_pick_args *a, int *algo, int *proto) {
  static const int order[] = {GW_ALGO_RING, GW_ALGO_TREE, GW_ALGO_EXCHANGE}; /* ties go to the first */
  double best = INFINITY;
  bool any = false; /* the first allowed pair stands even at an infinite time (an allowed one, not ring's) */
  *algo = GW_ALGO_RING, *proto = GW_PROTO_SIMPLE;
  if (a->nranks < 2) return;
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    if (!algo_allowed(a, order[i])) continue;
    for (int p = 0; p < GW_MODEL_NPROTOS; p++) {
      if ((a->proto >= 0 && p != a->proto && a->ll_ok) || (p == GW_PROTO_LL && !a->ll_ok)) continue;
      double t = gw__model_time(m, order[i], p, a->coll, a->bytes, a->nranks, a->tree_levels);
      if (!any || t < best) any = true, best = t, *algo = order[i], *proto = p;
    }
  }
}

uint64_t gw__model_hash(const struct gw_model *m) {
  const uint8_t *b = (const uint8_t *)m;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *m; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* ---- the tuning file ------------------------------------------------------------
 * Text, one row per line: `ALGO PROTO LATENCY_US BANDWIDTH_GBPS [RANKS
 * [TRANSPORT]]` (ALGO ring, tree or exchange; PROTO simple or ll; TRANSPORT
 * shm, ib or tcp); `#` starts a comment.  A row with RANKS applies only to
 * communicators of that many ranks and wins over a row without (which applies
 * to every size); one with TRANSPORT too applies only where the communicator's
 * ring crosses that transport at worst (comm.c) and wins over both; rows not
 * given keep the built-in value.  gw-perf --tune writes both tags: a file
 * fitted over tcp, loaded by a job over shm, mixed its slow rows with the
 * built-in LL ones, and auto picked LL at every size (4x slower at 8 MiB).
 * Anything else, and a second row for an algorithm, protocol, world size and
 * transport (of any size), refuses the whole file.  Several world sizes matter
 * because the per-step latency does not scale alike for every algorithm (4
 * ranks on 2 cores: every step a context switch), so a table fitted on 2 ranks
 * mispicks at 4. */

/* The rows seen so far (pass 0 checks every row of the file, whatever its
 * world size, so a second row for a size is refused on every world size):
 * the tagged ones in an open-addressed hash set (a list searched row by row
 * took 0.55 s of every rank's init on a 1 MiB file of 42k rows). */
struct seen_key { int32_t algo, proto, tclass, used; long ranks; };
struct rows_seen {
  bool untagged[GW_MODEL_NALGOS][GW_MODEL_NPROTOS];
  struct seen_key *tagged; /* cap slots, a power of two, at most half full */
  size_t ntagged, cap;
};

static size_t seen_slot(const struct rows_seen *s, const struct seen_key *k) {
  uint64_t h = (uint64_t)k->ranks * 0x9e3779b97f4a7c15ull ^ (uint64_t)(k->algo * 16 + k->proto * 4 + k->tclass);
  h ^= h >> 29;
  size_t i = (size_t)(h * 0xbf58476d1ce4e5b9ull) & (s->cap - 1);
  while (s->tagged[i].used && (s->tagged[i].algo != k->algo || s->tagged[i].proto != k->proto ||
                               s->tagged[i].tclass != k->tclass || s->tagged[i].ranks != k->ranks))
    i = (i + 1) & (s->cap - 1);
  return i;
}

static bool seen_before(struct rows_seen *s, int a, int p, long ranks, int tclass, bool tagged, bool *nomem) {
  if (!tagged) {
    const bool was = s->untagged[a][p];
    s->untagged[a][p] = true;
    return was;
  }
  if (2 * (s->ntagged + 1) > s->cap) { /* grown and filled again */
    const size_t cap = s->cap ? 2 * s->cap : 64;
    struct rows_seen grown = {.tagged = calloc(cap, sizeof *grown.tagged), .cap = cap};
    if (!grown.tagged) return *nomem = true, false;
    for (size_t i = 0; i < s->cap; i++)
      if (s->tagged[i].used) grown.tagged[seen_slot(&grown, &s->tagged[i])] = s->tagged[i];
    free(s->tagged);
    s->tagged = grown.tagged, s->cap = cap;
  }
  const struct seen_key k = {a, p, tclass, 1, ranks};
  const size_t i = seen_slot(s, &k);
  if (s->tagged[i].used) return true;
  s->tagged[i] = k, s->ntagged++;
  return false;
}

/* One row: checked on pass 0; into m when it applies to nranks over tclass
 * (pass 0: untagged rows, 1: rows tagged nranks alone, 2: nranks and tclass);
 * *applied counts it. */
static gw_result_t parse_row(char *line, struct gw_model *m, int nranks, int tclass, int pass, struct rows_seen *seen,
                             int *applied, const char **why) {
  char *save, *f[7];
  int nf = 0;
  for (char *t = strtok_r(line, " \t\r\n", &save); t && nf < 7; t = strtok_r(NULL, " \t\r\n", &save)) f[nf++] = t;
  if (nf == 0) return GW_SUCCESS;
  if (nf < 4 || nf > 6)
    return *why = "expected 4 to 6 fields: algo proto latency_us bandwidth_GBps [ranks [transport]]",
           GW_ERR_INVALID_ARGUMENT;
  int a = gw__algo_from_name(f[0]), p = gw__proto_from_name(f[1]);
  if (a <= GW_ALGO_AUTO) return *why = "unknown algorithm (ring, tree, exchange)", GW_ERR_INVALID_ARGUMENT;
  if (p < 0) return *why = "unknown protocol (simple, ll)", GW_ERR_INVALID_ARGUMENT;
  char *e1, *e2, *e3 = "";
  errno = 0;
  double lat = strtod(f[2], &e1), bw = strtod(f[3], &e2);
  /* bandwidth from 1e-6 GB/s: any size's time stays finite, so the pick compares */
  if (errno || *e1 || *e2 || !(lat >= 0 && lat < 1e6) || !(bw >= 1e-6 && bw < 1e5))
    return *why = "latency must be a number in [0, 1e6) us and bandwidth in [1e-6, 1e5) GB/s", GW_ERR_INVALID_ARGUMENT;
  errno = 0;
  long ranks = nf >= 5 ? strtol(f[4], &e3, 10) : 0;
  if (errno || *e3 || (nf >= 5 && (ranks < 2 || ranks > 1 << 20)))
    return *why = "ranks must be a world size from 2 to 1048576", GW_ERR_INVALID_ARGUMENT;
  const int t = nf == 6 ? tclass_from_name(f[5]) : GW_TCLASS_NONE;
  if (t < 0) return *why = "unknown transport (shm, ib, tcp)", GW_ERR_INVALID_ARGUMENT;
  bool tagged = nf >= 5, nomem = false;
  if (pass == 0 && seen_before(seen, a, p, ranks, t, tagged, &nomem))
    return *why = t != GW_TCLASS_NONE ? "a second row for this algorithm, protocol, world size and transport"
                  : tagged ? "a second row for this algorithm, protocol and world size without a transport"
                           : "a second row for this algorithm and protocol without a world size",
           GW_ERR_INVALID_ARGUMENT;
  if (nomem) return *why = "out of memory", GW_ERR_SYSTEM;
  if (pass != nf - 4 || (tagged && ranks != nranks) || (t != GW_TCLASS_NONE && t != tclass))
    return GW_SUCCESS; /* another pass's, size's or transport's */
  m->lat_us[a][p] = lat;
  m->bw_gbps[a][p] = bw;
  m->fitted_here[a][p] = tagged;
  if (applied) ++*applied;
  return GW_SUCCESS;
}

/* A tuning file read whole (at most TUNING_FILE_MAX bytes), and where the
 * next line starts. */
struct tuning_text {
  char *buf;
  size_t len, pos;
};

/* The next line of t into line[size] (without its newline).  A line longer
 * than size - 1 is taken when its comment starts within it (the rest is
 * comment, dropped); else *bad says why it is not.  A NUL byte is refused (C
 * strings would end the row there).  False at the end of the file. */
static bool next_line(struct tuning_text *t, char *line, size_t size, const char **bad) {
  *bad = NULL;
  size_t n = 0;
  bool any = false, hash = false, nul = false;
  while (t->pos < t->len) {
    const char c = t->buf[t->pos++];
    any = true;
    if (c == '\n') break;
    if (c == 0) nul = true;
    if (n + 1 < size) line[n++] = c, hash |= c == '#';
    else if (!hash && !*bad) *bad = "a row of 512 characters or more";
  }
  line[n] = 0;
  if (nul) *bad = "a NUL byte";
  return any;
}

static void cut_comment(char *line) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
}

/* The first line gw__tune_write writes (every version) starts with this. */
#define TUNING_HEADER "# gradwire tuning file (GW_TUNING_FILE), written by gw-perf --tune"

/* Far more than a table of every algorithm, protocol and world size. */
#define TUNING_FILE_MAX (1u << 20)

/* Reads an existing tuning file whole into t (free t->buf): opened without
 * blocking (a FIFO with no writer would hold the caller there), and only a
 * regular file of sane size (/dev/zero, a FIFO or a terminal never end: init
 * spun on them on every rank), its bytes counted as they come (/proc and /sys
 * files say size 0 and may never end: /proc/self/pagemap, hundreds of GB of
 * NULs, was read on every rank before the rendezvous, with no timeout).  One
 * read serves every pass (it was read three times, then four).  False with
 * why (cap bytes) saying what is wrong, and errno ENOENT when there is no
 * such file. */
static bool read_tuning(const char *path, struct tuning_text *t, char *why, size_t cap) {
  memset(t, 0, sizeof *t);
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    snprintf(why, cap, "cannot open: %s", strerror(e));
    errno = e;
    return false;
  }
  struct stat sb;
  const char *not_file = fstat(fd, &sb) != 0       ? "cannot be examined"
                         : S_ISDIR(sb.st_mode)      ? "is a directory"
                         : !S_ISREG(sb.st_mode)     ? "is not a regular file"
                         : sb.st_size > TUNING_FILE_MAX ? "is larger than 1 MiB: not a tuning file"
                                                    : NULL;
  int read_errno = 0;
  /* in chunks of 64 KiB (pagemap takes only reads of whole 8-byte words) */
  enum { CHUNK = 64 << 10 };
  if (!not_file && !(t->buf = malloc(TUNING_FILE_MAX + CHUNK))) not_file = "cannot be read in: out of memory";
  while (!not_file && t->len <= TUNING_FILE_MAX) {
    const ssize_t got = read(fd, t->buf + t->len, CHUNK);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) read_errno = errno, not_file = "cannot be read";
    if (got <= 0) break;
    t->len += (size_t)got;
  }
  if (!not_file && t->len > TUNING_FILE_MAX) not_file = "is larger than 1 MiB: not a tuning file";
  close(fd);
  if (!not_file) return true;
  if (read_errno) snprintf(why, cap, "%s: %s", not_file, strerror(read_errno));
  else snprintf(why, cap, "%s", not_file);
  free(t->buf);
  memset(t, 0, sizeof *t);
  errno = EINVAL;
  return false;
}

gw_result_t gw__model_load(struct gw_model *m, const char *path, int nranks, int tclass, int *applied,
                           struct gw_errctx *err) {
  char not_file[160];
  struct tuning_text f;
  if (applied) *applied = 0;
  if (!read_tuning(path, &f, not_file, sizeof not_file))
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "GW_TUNING_FILE %s: %s", path, not_file);
  struct gw_model tmp = *m;
  struct rows_seen seen = {0};
  char line[512];
  const char *why = NULL;
  gw_result_t res = GW_SUCCESS;
  int rows = 0, took = 0;
  /* untagged rows, then this size's over them, then this size's and transport's */
  for (int pass = 0; pass < 3 && res == GW_SUCCESS; pass++) {
    f.pos = 0;
    const char *bad;
    for (int no = 1; res == GW_SUCCESS && next_line(&f, line, sizeof line, &bad); no++) {
      if (bad) why = bad, res = GW_ERR_INVALID_ARGUMENT;
      cut_comment(line);
      rows += pass == 0 && line[strspn(line, " \t\r")] != 0;
      if (res == GW_SUCCESS) res = parse_row(line, &tmp, nranks, tclass, pass, &seen, &took, &why);
      if (res != GW_SUCCESS)
        gw__err(err, res, "GW_TUNING_FILE %s:%d: %s; using the built-in table", path, no, why);
    }
  }
  /* gw-perf --tune writes rows or no file: an empty one (cut short, or
   * another file emptied) loaded as the built-in table with no word */
  if (res == GW_SUCCESS && rows == 0)
    res = gw__err(err, GW_ERR_INVALID_ARGUMENT, "GW_TUNING_FILE %s: no rows (empty, or only comments: gw-perf --tune "
                  "writes at least one); using the built-in table", path);
  free(f.buf);
  free(seen.tagged);
  if (res == GW_SUCCESS) *m = tmp;
  if (applied) *applied = res == GW_SUCCESS ? took : 0;
  return res;
}

/* ---- printing (GW_DEBUG_SUBSYS=TUNE) -------------------------------------------- */

/* The table and the model's time for every algorithm and protocol at sizes 8 B
 * .. 16 MiB (x8), with the pick an allreduce of that size gets. */
void gw__model_log(const struct gw_model *m, const struct gw_pick_args *base) {
  if (gw__log_level < GW_LOG_INFO) return;
  for (int a = GW_ALGO_RING; a < GW_MODEL_NALGOS; a++)
    for (int p = 0; p < GW_MODEL_NPROTOS; p++)
      GW_INFO(GW_SUB_TUNE, "model: %-8s %-6s latency %.3f us/step%s, bandwidth %.2f GB/s", algo_names[a],
              proto_names[p], m->lat_us[a][p],
              m->oversub_step_us > 0 && !m->fitted_here[a][p] ? " (+ oversubscribed cores' per step)" : "",
              m->bw_gbps[a][p]);
  if (m->oversub_step_us > 0)
    GW_INFO(GW_SUB_TUNE, "model: cores oversubscribed on some rank's machine: %.1f us more per step", m->oversub_step_us);
  GW_INFO(GW_SUB_TUNE, "model: allreduce on %d ranks, us: %10s %9s %9s %9s %9s %9s  pick", base->nranks, "bytes",
          "ring", "ring/ll", "tree", "tree/ll", "exch");
  for (size_t bytes = 8; bytes <= (64u << 20); bytes *= 8) {
    struct gw_pick_args a = *base;
    a.coll = GW_COLL_ALLREDUCE, a.bytes = bytes;
    int algo, proto;
    gw__model_pick(m, &a, &algo, &proto);
    char t[5][16]; /* "-" where the pair is not allowed for this communicator */
    for (int i = 0; i < 5; i++) {
      int ai = i < 2 ? GW_ALGO_RING : i < 4 ? GW_ALGO_TREE : GW_ALGO_EXCHANGE, pi = i % 2;
      a.algo = ai;
      bool ok = algo_allowed(&a, ai) && (pi == GW_PROTO_SIMPLE || a.ll_ok);
      snprintf(t[i], sizeof t[i], ok ? "%.2f" : "-", gw__model_time(m, ai, pi, a.coll, bytes, a.nranks, a.tree_levels));
    }
    GW_INFO(GW_SUB_TUNE, "model: %32zu %9s %9s %9s %9s %9s  %s/%s", bytes, t[0], t[1], t[2], t[3], t[4],
            algo_names[algo], proto_names[proto]);
  }
}

/* ---- fitting (gw-perf --tune) ------------------------------------------------------ */

/* t = a + b x by least squares on the relative error (weights 1 / t^2), so
 * the small sizes fix the latency and the large ones the bandwidth. */
static void fit_line(const double *x, const double *t, int n, double *a, double *b) {
  double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (int i = 0; i < n; i++) {
    double w = 1.0 / (t[i] * t[i]);
    s += w, sx += w * x[i], sxx += w * x[i] * x[i], st += w * t[i], sxt += w * x[i] * t[i];
  }
  double det = s * sxx - sx * sx;
  *b = det > 0 ? (s * sxt - sx * st) / det : 0; /* <= 0: noise hid the slope (the caller drops the row) */
  *a = (st - GW_MAX(*b, 0.0) * sx) / s;
  if (*a < 0) *a = 0;
}

#define FIT_MAX 64

/* Fits the samples of one (algorithm, protocol); false when fewer than 2. */
static bool fit_row(const struct gw_tune_sample *s, int ns, const char *algo, const char *proto, int nranks,
                    int tree_levels, double *lat, double *bw) {
  double x[FIT_MAX], t[FIT_MAX];
  int n = 0;
  for (int i = 0; i < ns && n < FIT_MAX; i++)
    if (!strcasecmp(s[i].algo, algo) && !strcasecmp(s[i].proto, proto) && s[i].time_us > 0)
      x[n] = (double)s[i].bytes, t[n++] = s[i].time_us;
  if (n < 2) return false;
  double a, b, steps, factor;
  fit_line(x, t, n, &a, &b);
  /* A slope at or below zero (a large size measured faster than the trend):
   * no bandwidth can be read off, and a huge one would make the model pick
   * this row for every size; the built-in row stays. */
  if (!(b > 0)) {
    GW_WARN(GW_SUB_TUNE, "gw-perf --tune: %s %s: the times do not grow with the size (noise?): no row written, the "
            "built-in one stays; measure again on a quieter machine", algo, proto);
    return false;
  }
  shape(gw__algo_from_name(algo), GW_COLL_ALLREDUCE, nranks, tree_levels, &steps, &factor);
  *lat = a / steps;
  *bw = GW_MIN(factor / (b * 1e3), 9e4);
  return true;
}

/* Whether a row is one the loader takes, beside the rows already kept (seen):
 * a bad one, or a second row for the same algorithm, protocol, world size and
 * transport, kept or written would have every later load refuse the whole
 * file. */
static bool row_ok(const char *row, struct rows_seen *seen) {
  char copy[512];
  snprintf(copy, sizeof copy, "%s", row);
  cut_comment(copy); /* the loader takes a row with a comment after it: so is it kept */
  struct gw_model scratch;
  memset(&scratch, 0, sizeof scratch);
  const char *why = NULL;
  return parse_row(copy, &scratch, 2, GW_TCLASS_NONE, 0, seen, NULL, &why) == GW_SUCCESS;
}

/* The rows of an existing tuning file that gw_tune_write keeps: every good row
 * but those the new rows replace (tagged nranks with tclass, or with nranks
 * and no transport: measured over one unknown; every row tagged nranks for a
 * write of no transport, whose untagged-by-transport rows would lose to a
 * transport's), verbatim
 * (with a comment after it); none when there is no file.  A bad row is
 * dropped, said unless quiet.  NULL with why set when the file is there and
 * is no tuning file to replace (a FIFO, a device, a directory, over 1 MiB:
 * its writer hung on a FIFO, spun on /dev/zero and replaced /dev/null with a
 * regular file; a NUL byte, or lines of which none is a row the loader takes:
 * a checkpoint or someone's notes, which gw-perf --tune replaced with its
 * rows, unless the file starts with the writer's header: a tuning file a
 * crash or an older writer left damaged is rewritten) or cannot be read. */
static char *kept_rows(const char *path, int nranks, int tclass, bool quiet, char *why, size_t why_cap) {
  struct tuning_text f;
  if (!read_tuning(path, &f, why, why_cap)) return errno == ENOENT ? calloc(1, 1) : NULL;
  size_t cap = 4096, len = 0;
  char *out = malloc(cap), line[512], first[64] = "";
  struct rows_seen seen = {0};
  const char *bad;
  int lineno = 0, content = 0, rows = 0, nul_line = 0, first_line = 0;
  bool ours = false; /* written by gw__tune_write (its header): whatever a crash left of it */
  while (out && next_line(&f, line, sizeof line, &bad)) {
    char copy[512], *save, *fld[7];
    lineno++;
    if (lineno == 1) ours = !strncmp(line, TUNING_HEADER, strlen(TUNING_HEADER));
    if (bad && strstr(bad, "NUL") && !nul_line) nul_line = lineno;
    snprintf(copy, sizeof copy, "%s", line);
    cut_comment(copy);
    int nf = 0;
    for (char *t = strtok_r(copy, " \t\r\n", &save); t && nf < 7; t = strtok_r(NULL, " \t\r\n", &save)) fld[nf++] = t;
    if (nf == 0) continue; /* blank, or a comment */
    if (!content++) first_line = lineno, snprintf(first, sizeof first, "%.60s", line);
    const bool replaced = (nf == 5 || (nf == 6 && (tclass == GW_TCLASS_NONE || tclass_from_name(fld[5]) == tclass))) &&
                          atoi(fld[4]) == nranks;
    if (replaced) { /* by the new rows */
      struct rows_seen fresh = {0};
      rows += row_ok(line, &fresh);
      free(fresh.tagged);
      continue;
    }
    if (bad || nf < 4 || nf > 6 || !row_ok(line, &seen)) {
      if (!quiet) GW_WARN(GW_SUB_TUNE, "gw-perf --tune: %s: dropped a row the loader would refuse: %.200s", path, line);
      continue;
    }
    rows++;
    size_t n = strlen(line);
    if (len + n + 2 > cap) {
      char *grown = realloc(out, cap *= 2);
      if (!grown) { /* (writing what fit would drop the other rows) */
        free(out);
        out = NULL;
        break;
      }
      out = grown;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    memcpy(out + len, line, n);
    len += n;
    out[len++] = '\n';
  }
  free(f.buf);
  free(seen.tagged);
  if (out && !ours && (nul_line || (content > 0 && rows == 0))) {
    free(out);
    for (char *c = first; *c; c++)
      if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    if (nul_line) snprintf(why, why_cap, "holds a NUL byte (line %d): not a tuning file (remove it, or name "
                           "another file)", nul_line);
    else snprintf(why, why_cap, "has none of a tuning file's rows (line %d of %d: \"%.50s\"): not a tuning file "
                  "(remove it, or name another file)", first_line, lineno, first);
    return NULL;
  }
  if (out) out[len] = 0;
  else snprintf(why, why_cap, "could not be read in: out of memory");
  return out;
}

int gw__tune_replaceable(const char *path, char *why, size_t why_cap) {
  char *kept = kept_rows(path, -1, GW_TCLASS_NONE, true, why, why_cap);
  free(kept);
  return kept ? 0 : -1;
}

/* The rows fitted from the samples, one per algorithm and protocol measured
 * at two sizes or more, into out (cap bytes); how many. */
static int fit_rows(const struct gw_tune_sample *samples, int nsamples, int nranks, int tree_levels, int tclass,
                    char *out, size_t cap) {
  int n = 0;
  size_t len = 0;
  out[0] = 0;
  for (int a = GW_ALGO_RING; a < GW_MODEL_NALGOS; a++)
    for (int p = 0; p < GW_MODEL_NPROTOS; p++) {
      double lat, bw;
      char row[160];
      struct rows_seen fresh = {0}; /* one row per algorithm and protocol: never a second */
      if (!fit_row(samples, nsamples, algo_names[a], proto_names[p], nranks, tree_levels, &lat, &bw)) continue;
      /* bandwidth to 4 significant digits: %.3f wrote a slow link's 0.0004 GB/s as 0.000, a row refused */
      /* (and below 1e5, the loader's bound, which %.4g rounds 99995 up to) */
      snprintf(row, sizeof row, "%s %s %.4f %.4g %d%s%s\n", algo_names[a], proto_names[p], lat,
               bw < 99990 ? bw : 99990.0, nranks, tclass != GW_TCLASS_NONE ? " " : "",
               tclass != GW_TCLASS_NONE ? gw__tclass_name(tclass) : "");
      const bool good = row_ok(row, &fresh);
      free(fresh.tagged);
      if (good && len + strlen(row) < cap) {
        memcpy(out + len, row, strlen(row) + 1);
        len += strlen(row), n++;
      } else {
        GW_WARN(GW_SUB_TUNE, "gw-perf --tune: %s %s: fitted %.4g us, %.4g GB/s are out of the loader's range: no "
                "row written", algo_names[a], proto_names[p], lat, bw);
      }
    }
  return n;
}

/* Writes the file whole or not at all, and one writer at a time: a new file
 * next to it, synced, renamed over it (a crash or a full disk used to leave it
 * empty or cut, which loads as the built-in table or as a wrong row), under
 * an flock on PATH.lock (two --tune runs at different world sizes, which the
 * README invites, read, merged and wrote over each other's rows). */
gw_result_t gw__tune_write(const char *path, int nranks, int tree_levels, int tclass,
                           const struct gw_tune_sample *samples, int nsamples, const char *note) {
  struct gw_errctx err;
  const char *bad = !path ? "a NULL path" : !samples ? "NULL samples" : nranks < 2 ? "fewer than 2 ranks"
                  : nranks > GW_MAX_NRANKS ? "more ranks than a communicator may have (2^20)"
                  : nsamples < 2 ? "fewer than 2 samples"
                  : tclass < GW_TCLASS_NONE || tclass > GW_TCLASS_TCP ? "a transport class that is none"
                  : note && (strpbrk(note, "\n\r") || strlen(note) > 200) ? "a note of several lines or over 200 characters"
                  : NULL;
  if (bad) {
    gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_tune_write: %s (needs a path, samples measured at 2 ranks or more, "
            "at least 2 of them, and a one-line note)", bad);
    return gw__set_thread_error(err.msg), GW_ERR_INVALID_ARGUMENT;
  }
  for (int i = 0; i < nsamples; i++) {
    const struct gw_tune_sample *t = &samples[i];
    if (!t->algo || !t->proto || gw__algo_from_name(t->algo) <= GW_ALGO_AUTO || gw__proto_from_name(t->proto) < 0) {
      gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_tune_write: sample %d names algorithm '%s' and protocol '%s' (ring, "
              "tree or exchange; simple or ll)", i, t->algo ? t->algo : "(null)", t->proto ? t->proto : "(null)");
      return gw__set_thread_error(err.msg), GW_ERR_INVALID_ARGUMENT;
    }
  }
  /* Nothing fitted (each pair needs two sizes with rising times): the file
   * is left as it was (a header and no rows was written, and success said) */
  char fitted[GW_MODEL_NALGOS * GW_MODEL_NPROTOS * 160];
  if (fit_rows(samples, nsamples, nranks, tree_levels, tclass, fitted, sizeof fitted) == 0) {
    gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_tune_write: no algorithm and protocol could be fitted from these %d "
            "samples (each needs two sizes or more, with finite times rising with the size): %s not written",
            nsamples, path);
    return gw__set_thread_error(err.msg), GW_ERR_INVALID_ARGUMENT;
  }
  /* A symbolic link: the file it names is the one rewritten (the rename
   * would put a regular file in the link's place). */
  struct stat lsb;
  const bool link = lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode);
  char *real = link ? realpath(path, NULL) : NULL;
  if (link && !real) {
    gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_tune_write: %s is a symbolic link that cannot be followed: %s", path,
            strerror(errno));
    return gw__set_thread_error(err.msg), GW_ERR_INVALID_ARGUMENT;
  }
  if (real) path = real;
  char lock[4200], tmp[4200], why[200];
  snprintf(lock, sizeof lock, "%s.lock", path);
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  struct stat sb; /* checked before the lock file goes next to it */
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_tune_write: %s %s: not replaced (a tuning file is a regular file)",
            path, S_ISDIR(sb.st_mode) ? "is a directory" : "is not a regular file (a device, FIFO or socket)");
    free(real);
    return gw__set_thread_error(err.msg), GW_ERR_INVALID_ARGUMENT;
  }
  int lk = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0666);
  if (lk >= 0) while (flock(lk, LOCK_EX) != 0 && errno == EINTR) {}
  char *kept = kept_rows(path, nranks, tclass, false, why, sizeof why);
  if (!kept) {
    if (lk >= 0) close(lk);
    gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_tune_write: %s %s: not replaced", path, why);
    free(real);
    return gw__set_thread_error(err.msg), GW_ERR_INVALID_ARGUMENT;
  }
  char head[768];
  snprintf(head, sizeof head, TUNING_HEADER "%s%s\n"
           "# time(bytes, n) = latency_us x steps(n) + bytes x share(n) / bandwidth\n"
           "# algo proto latency_us bandwidth_GBps [ranks [transport]: this row only for that world size (and the "
           "transport: the slowest the ring crosses)]\n",
           note ? ": " : "", note ? note : "");
  const size_t whole = strlen(head) + strlen(kept) + strlen(fitted);
  if (whole > TUNING_FILE_MAX) { /* the loader would refuse it all, and the next --tune would not replace it */
    free(kept);
    if (lk >= 0) close(lk);
    gw__err(&err, GW_ERR_INVALID_ARGUMENT, "gw_tune_write: %s would be %zu bytes with the new rows, more than the "
            "1 MiB a tuning file may have: not replaced (remove rows of world sizes no longer used)", path, whole);
    free(real);
    return gw__set_thread_error(err.msg), GW_ERR_INVALID_ARGUMENT;
  }
  FILE *f = fopen(tmp, "w");
  if (!f) {
    const int e = errno;
    free(kept);
    if (lk >= 0) close(lk);
    gw__err(&err, GW_ERR_SYSTEM, "gw_tune_write: cannot write %s: %s", tmp, strerror(e));
    free(real);
    return gw__set_thread_error(err.msg), GW_ERR_SYSTEM;
  }
  fputs(head, f);
  if (kept && *kept) fprintf(f, "%s", kept);
  free(kept);
  fputs(fitted, f);
  bool ok = !ferror(f) && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = (fclose(f) == 0) && ok;
  ok = ok && rename(tmp, path) == 0;
  const int saved = errno;
  if (ok) { /* the rename itself on disk */
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) fsync(dfd), close(dfd);
  } else {
    unlink(tmp);
  }
  if (lk >= 0) close(lk);
  if (!ok)
    gw__err(&err, GW_ERR_SYSTEM, "gw_tune_write: writing %s failed: %s (the file is as it was)", path, strerror(saved));
  free(real);
  if (ok) return GW_SUCCESS;
  return gw__set_thread_error(err.msg), GW_ERR_SYSTEM;
}

gw_result_t gw_tune_write(const char *path, int nranks, const struct gw_tune_sample *samples, int nsamples,
                          const char *note) {
  return gw__tune_write(path, nranks, 0, GW_TCLASS_NONE, samples, nsamples, note);
}

gw_result_t gw_tune_write_comm(gw_comm_t comm, const char *path, const struct gw_tune_sample *samples, int nsamples,
                               const char *note) {
  if (!comm)
    return gw__set_thread_error("gw_tune_write_comm: no communicator"), GW_ERR_INVALID_ARGUMENT;
  /* Its fields read through the gate: a destroyed one's wrote a row for
   * the world size it had (1-rank: a misleading "fewer than 2 ranks"). */
  if (!gw__comm_peek(comm, "gw_tune_write_comm")) return GW_ERR_INVALID_ARGUMENT;
  const int nranks = comm->nranks, levels = comm->tree_levels, tclass = comm->tclass;
  gw__comm_unpeek(comm);
  return gw__tune_write(path, nranks, levels, tclass, samples, nsamples, note);
}
