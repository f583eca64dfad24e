/* bucket_agree.c - what gw_bucketer_create agrees on with the other ranks
 * (bucket.c makes the bucketer): every rank's layout compared (count, dtype,
 * op, bounds and the side the gradients are on), and the bucketer's number
 * on the communicator, the lowest free on every rank. */
#include <stdint.h>
#include <stdio.h>

#include "bucket.h"
#include "comm.h"
#include "core.h"
#include "gradwire.h"

#define fail gw__bucket_fail /* bucket.h */

/* A collective of create's agreement failed (a peer that never calls create
 * timed out the first): its message under create's name, which the caller
 * called (it named only an internal "broadcast(count=6, int64, root=0)"). */
static gw_result_t agreement_failed(gw_comm_t comm, gw_result_t res) {
  char why[GW_ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", gw_comm_last_error(comm));
  return fail(comm, res, "gw_bucketer_create: agreeing with the other ranks failed (every rank must call it): %s",
              why);
}

/* The lowest bucketer number from `from` that no live bucketer of comm holds
 * on this rank; GW_BUCKETER_NUMBERS when every one is held. */
static int64_t free_number(gw_comm_t comm, int64_t from) {
  for (int64_t k = from; k < GW_BUCKETER_NUMBERS; k++)
    if (!(atomic_load(&comm->bucketer_numbers[k / 64]) >> (k % 64) & 1)) return k;
  return GW_BUCKETER_NUMBERS;
}

/* The new bucketer's number (gw__desc_bucket_tag): the lowest that is free on
 * every rank (their live bucketers may differ: destroy is a rank's own),
 * agreed by rounds of one allreduce: each rank's lowest free number from the
 * last round's, the largest of them; when that is every rank's own, it is
 * free everywhere.  Numbers of destroyed bucketers are taken again, as file
 * descriptors are.  After the layouts agreed: every rank is here. */
gw_result_t gw__bucket_agree_number(gw_comm_t comm, uint32_t *number) {
  for (int64_t c = 1;;) {
    int64_t f = free_number(comm, c);
    gw_result_t res = comm->nranks > 1 ? gw_allreduce(&f, &f, 1, GW_INT64, GW_MAX, comm, NULL) : GW_SUCCESS;
    if (res != GW_SUCCESS) return agreement_failed(comm, res);
    if (f >= GW_BUCKETER_NUMBERS)
      return fail(comm, GW_ERR_INVALID_ARGUMENT, "rank %d: gw_bucketer_create: every bucketer number (1 to %d) is "
                  "held by a live bucketer of this communicator (on this rank or another): destroy the bucketers "
                  "no longer in use", comm->rank, GW_BUCKETER_NUMBERS - 1);
    if (f == c) {
      *number = (uint32_t)c;
      return GW_SUCCESS;
    }
    c = f;
  }
}

/* Every rank's layout (a hash of count, dtype, op, bounds and where the
 * gradients are, with its parts for the message), compared: buckets pair up
 * by order, and two layouts whose bucket sizes coincide ran without a word,
 * each step summing one rank's bucket with another's (a model configured
 * differently on one rank).  Rank
 * 0's is broadcast, each rank compares its own, and one allreduce finds the
 * first rank that refused and the first that differs, whose layout is then
 * broadcast for the message: fixed sizes, nothing allocated (a rank out of
 * memory for an allgather's nranks records left its peers waiting for it
 * until GW_TIMEOUT). */
/* A rank whose own arguments were refused still takes part (with this mark
 * for a layout), so its peers fail at once naming it instead of waiting for
 * it until GW_TIMEOUT; it keeps its own error. */
#define REFUSED_LAYOUT INT64_MAX
/* L_MEM: the gradients are device memory (1) or host memory (0).  A rank
 * with host gradients against one with device gradients failed the
 * communicator at the first bucket: on a device ring every call says
 * whether its buffers are device memory (GW_DESC_DEVICE), and through host
 * staging a device call larger than a staging piece runs as several calls.
 * (Buckets small enough for one piece would pair up, but a model on the
 * host on one rank and on a device on another is a mistake to name.) */
enum { L_HASH, L_COUNT, L_NBUCKETS, L_DTYPE, L_OP, L_BOUNDS, L_MEM, L_WORDS };
static int64_t fnv_words(uint64_t h, const uint64_t *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 8; k++) h = (h ^ (v[i] >> 8 * k & 0xff)) * 1099511628211ull;
  return (int64_t)(h >> 1); /* non-negative (refusals travel in the allreduce, not here) */
}

gw_result_t gw__bucket_agree_layout(gw_comm_t comm, size_t count, gw_dtype_t dtype, gw_op_t op, const size_t *bounds,
                                    int nbuckets, int mem, gw_result_t refused) {
  if (comm->nranks < 2) return refused;
  int64_t mine[L_WORDS] = {REFUSED_LAYOUT, (int64_t)count, nbuckets, (int64_t)dtype, (int64_t)op, 0, mem},
          r0[L_WORDS], other[L_WORDS];
  if (refused == GW_SUCCESS) {
    const uint64_t head[] = {count, (uint64_t)dtype, (uint64_t)op, (uint64_t)nbuckets};
    uint64_t bv[64];
    int64_t hb = fnv_words(1469598103934665603ull, NULL, 0);
    for (int i = 0; i <= nbuckets; i += 64) { /* the bounds' hash, 64 at a time */
      const int k = nbuckets + 1 - i < 64 ? nbuckets + 1 - i : 64;
      for (int j = 0; j < k; j++) bv[j] = bounds[i + j];
      hb = fnv_words((uint64_t)hb, bv, (size_t)k);
    }
    mine[L_BOUNDS] = hb;
    const uint64_t all[] = {head[0], head[1], head[2], head[3], (uint64_t)hb, (uint64_t)mem};
    mine[L_HASH] = fnv_words(1469598103934665603ull, all, 6);
  }
  gw_result_t res = gw_broadcast(mine, r0, L_WORDS, GW_INT64, 0, comm, NULL);
  int64_t first[2] = {refused != GW_SUCCESS ? comm->rank : INT64_MAX,
                      res == GW_SUCCESS && refused == GW_SUCCESS && r0[L_HASH] != mine[L_HASH] ? comm->rank : INT64_MAX};
  if (res == GW_SUCCESS) res = gw_allreduce(first, first, 2, GW_INT64, GW_MIN, comm, NULL);
  if (refused != GW_SUCCESS) return refused; /* its own message stands */
  if (res != GW_SUCCESS) return agreement_failed(comm, res);
  if (first[0] != INT64_MAX)
    return fail(comm, GW_ERR_INVALID_ARGUMENT, "rank %d: gw_bucketer_create: rank %lld refused its own arguments "
                "or had no memory for its bucketer (its error says why), so no rank makes the bucketer", comm->rank,
                (long long)first[0]);
  if (first[1] == INT64_MAX) return GW_SUCCESS;
  res = gw_broadcast(mine, other, L_WORDS, GW_INT64, (int)first[1], comm, NULL);
  if (res != GW_SUCCESS) return agreement_failed(comm, res);
  /* a rank that differs from rank 0 says rank 0's layout; the others the first that differs */
  const bool off = mine[L_HASH] != r0[L_HASH];
  const int64_t *them = off ? r0 : other;
  const int them_rank = off ? 0 : (int)first[1];
  const bool same_sizes = them[L_COUNT] == mine[L_COUNT] && them[L_NBUCKETS] == mine[L_NBUCKETS] &&
                          them[L_DTYPE] == mine[L_DTYPE] && them[L_OP] == mine[L_OP];
  if (same_sizes && them[L_BOUNDS] == mine[L_BOUNDS])
    return fail(comm, GW_ERR_INVALID_ARGUMENT,
                "rank %d: gw_bucketer_create: this rank's gradients are in %s memory, rank %d's in %s memory; "
                "every rank's must be on the same side (is the model on the wrong device on one of them?)",
                comm->rank, mem ? "device" : "host", them_rank, them[L_MEM] ? "device" : "host");
  return fail(comm, GW_ERR_INVALID_ARGUMENT,
              "rank %d: gw_bucketer_create: the bucket layouts differ across ranks: this rank has %d bucket%s over "
              "%zu %s elements (%s), rank %d has %lld over %lld %s elements (%s)%s; every rank must create its "
              "bucketer with the same count, dtype, op and bounds (buckets pair up by their order)",
              comm->rank, nbuckets, nbuckets == 1 ? "" : "s", count, gw_dtype_name(dtype), gw_op_name(op), them_rank,
              (long long)them[L_NBUCKETS], (long long)them[L_COUNT], gw_dtype_name((gw_dtype_t)them[L_DTYPE]),
              gw_op_name((gw_op_t)them[L_OP]), same_sizes ? ": the bounds between the buckets differ" : "");
}
