/* comm_settings.c - the settings every rank must share (GW_ALGO, GW_PROTO,
 * GW_TRANSPORT, channels, chunk sizes, the cost model): gathered at init and
 * compared, naming the rank and the setting that differ; and GW_ALGO's and
 * GW_PROTO's words, and the settings init refuses for what they are. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm.h"

/* GW_ALGO, GW_PROTO, GW_TRANSPORT, GW_NCHANNELS, GW_EXCHANGE_MAX_BYTES,
 * GW_CHANNEL_MIN_BYTES and the cost model's table decide which connections exist and how each call
 * runs, so ranks that disagree would hang in the rendezvous or in an
 * operation, or (the exchange against the ring at 2 ranks) compute different
 * results; GW_SHM_SLOTS / GW_SHM_SLOT_BYTES set the chunk size every
 * algorithm cuts by (over tcp a difference failed mid-run, as a malformed
 * frame or an internal error): find out here and say which rank differs. */
struct settings {
  int32_t algo, nchannels, proto, transport;
  uint64_t model_hash, exchange_max, channel_min;
  uint32_t nslots, slot_bytes;
};

static void add_text(char *buf, size_t len, size_t *n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add_text(char *buf, size_t len, size_t *n, const char *fmt, ...) {
  if (*n >= len) return;
  va_list ap;
  va_start(ap, fmt);
  const int m = vsnprintf(buf + *n, len - *n, fmt, ap);
  va_end(ap);
  *n = m < 0 ? len : GW_MIN(len, *n + (size_t)m);
}

/* s's settings that differ from o's, as "GW_X=v, GW_Y=w" (every one, when
 * listed beside another rank's, ran to 700 characters that hid the one
 * that differed). */
static void describe_settings(const struct settings *s, const struct settings *o, const struct gw_comm *here,
                              char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  const char *sep = "";
  if (s->algo != o->algo) add_text(buf, len, &n, "%sGW_ALGO=%s", sep, gw__algo_name(s->algo)), sep = ", ";
  if (s->proto != o->proto) add_text(buf, len, &n, "%sGW_PROTO=%s", sep, gw__proto_name(s->proto)), sep = ", ";
  if (s->transport != o->transport)
    add_text(buf, len, &n, "%sGW_TRANSPORT=%s", sep, gw__transport_wanted_name(s->transport)), sep = ", ";
  if (s->nchannels != o->nchannels) add_text(buf, len, &n, "%sGW_NCHANNELS=%d", sep, s->nchannels), sep = ", ";
  if (s->exchange_max != o->exchange_max) {
    if (s->exchange_max == UINT64_MAX) add_text(buf, len, &n, "%sGW_EXCHANGE_MAX_BYTES=auto", sep);
    else add_text(buf, len, &n, "%sGW_EXCHANGE_MAX_BYTES=%llu", sep, (unsigned long long)s->exchange_max);
    sep = ", ";
  }
  if (s->channel_min != o->channel_min)
    add_text(buf, len, &n, "%sGW_CHANNEL_MIN_BYTES=%llu", sep, (unsigned long long)s->channel_min), sep = ", ";
  if (s->nslots != o->nslots) add_text(buf, len, &n, "%sGW_SHM_SLOTS=%u", sep, s->nslots), sep = ", ";
  if (s->slot_bytes != o->slot_bytes) add_text(buf, len, &n, "%sGW_SHM_SLOT_BYTES=%u", sep, s->slot_bytes), sep = ", ";
  if (s->model_hash != o->model_hash) {
    /* (said for this rank only: a file refused here left the built-in one,
     * which the message named as the file's) */
    const char *file = here ? getenv("GW_TUNING_FILE") : NULL;
    add_text(buf, len, &n, "%sthe cost model %016llx", sep, (unsigned long long)s->model_hash);
    if (here && here->model_from_file) add_text(buf, len, &n, " (from GW_TUNING_FILE=%s)", file);
    else if (here && file && *file) add_text(buf, len, &n, " (the built-in one: GW_TUNING_FILE=%s was refused)", file);
    else if (here) add_text(buf, len, &n, " (the built-in one)");
  }
}

gw_result_t gw__check_settings_agree(struct gw_comm *c, struct gw_errctx *err) {
  struct settings mine = {(int32_t)c->algo, c->nchannels, c->proto, gw__transport_wanted(), gw__model_hash(&c->model),
                          c->exchange_max,
                          c->channel_min_bytes, c->conn_params.nslots, c->conn_params.slot_bytes};
  struct settings *all = calloc((size_t)c->nranks, sizeof *all);
  if (!all) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->rank);
  gw_result_t res = gw__bootstrap_allgather(c->bs, &mine, all, sizeof mine, err);
  for (int r = 0; r < c->nranks && res == GW_SUCCESS; r++) {
    if (!memcmp(&all[r], &mine, sizeof mine)) continue;
    char here[240], there[200]; /* the message holds 512 */
    describe_settings(&mine, &all[r], c, here, sizeof here);
    describe_settings(&all[r], &mine, NULL, there, sizeof there);
    res = gw__err(err, GW_ERR_INVALID_ARGUMENT,
                  "rank %d: %s here, but rank %d has %s; set them (and GW_TUNING_FILE) alike on every rank", c->rank,
                  here, r, there);
  }
  free(all);
  /* a name that is no transport, alike everywhere: said as such (it read as
   * "no transport connects it with rank 1: GW_TRANSPORT restricts ...") */
  if (res == GW_SUCCESS && mine.transport < 0)
    res = gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_TRANSPORT=%s is not a transport: shm, ib or tcp (or unset: "
                  "each link picks the best)", c->rank, getenv("GW_TRANSPORT"));
  return res;
}

/* GW_ALGO and GW_PROTO: a word that is none of theirs is refused at init
 * (gw__settings_refused; it ran as auto with a warning, while GW_TRANSPORT's was
 * refused), auto meanwhile. */
enum gw_algo gw__settings_algo(int nranks) {
  int a = gw__algo_from_name(gw__env_str("GW_ALGO", "auto"));
  if (a < 0) return GW_ALGO_AUTO;
  if (a == GW_ALGO_EXCHANGE && nranks < 2) return GW_ALGO_AUTO; /* nothing to exchange with */
  return (enum gw_algo)a;
}

int gw__settings_proto(void) {
  int p = gw__proto_from_name(gw__env_str("GW_PROTO", "auto"));
  return p < 0 ? -1 : p;
}

/* A setting init refuses whatever its value's range: GW_ALGO or GW_PROTO
 * naming none of theirs, or an integer setting whose value is no number
 * (those out of range are refused below; "12abc" ran as the default, with
 * a warning, while "16" failed init).  Its message into buf; false if none. */
bool gw__settings_refused(int rank, char *buf, size_t len) {
  const char *algo = gw__env_str("GW_ALGO", "auto"), *proto = gw__env_str("GW_PROTO", "auto");
  if (gw__algo_from_name(algo) < 0) {
    snprintf(buf, len, "rank %d: GW_ALGO=%.60s is not one of auto, ring, tree, exchange", rank, algo);
    return true;
  }
  if (gw__proto_from_name(proto) == -1) {
    snprintf(buf, len, "rank %d: GW_PROTO=%.60s is not one of auto, simple, ll", rank, proto);
    return true;
  }
  static const char *const ints[] = {"GW_SHM_SLOT_BYTES", "GW_SHM_SLOTS", "GW_NCHANNELS", "GW_SOCKET_NSTREAMS",
                                     "GW_EXCHANGE_MAX_BYTES", "GW_CHANNEL_MIN_BYTES", "GW_IB_QPS_PER_CONN"};
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
    const char *v = getenv(ints[i]);
    if (!strcmp(ints[i], "GW_EXCHANGE_MAX_BYTES") && v && !strcasecmp(v, "auto")) continue; /* its default's name */
    if (!gw__env_int_parses(ints[i])) {
      snprintf(buf, len, "rank %d: %s=%.60s is not an integer of at most 64 bits (digits, or 0x and hex digits, "
               "and K, M or G after them if you like)", rank, ints[i], v);
      return true;
    }
  }
  return false;
}
