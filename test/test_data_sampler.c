/* test_data_sampler.c - the distributed sampler against PyTorch
 * DistributedSampler's rules: every rank's shard interleaved back is the
 * padded (or cut, drop_last) list PyTorch builds, the same on every call,
 * every sample once per epoch; epochs and seeds give other orders.  Part of
 * test_data's "sampler" case. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"
#include "test_data.h"

/* ---- sampler ---------------------------------------------------------------------- */

/* Every rank's shard, interleaved back into the padded list PyTorch builds. */
static int64_t *gather_shards(int64_t n, int world, int shuffle, int drop_last, uint64_t seed, int64_t epoch,
                              int64_t *total) {
  struct gw_sampler s;
  ck_assert_int_eq(gw_sampler_init(&s, n, world, 0, shuffle, drop_last, seed), GW_SUCCESS);
  *total = s.num_samples * world;
  int64_t *all = malloc((size_t)*total * sizeof *all), *shard = malloc((size_t)s.num_samples * sizeof *shard);
  for (int r = 0; r < world; r++) {
    ck_assert_int_eq(gw_sampler_init(&s, n, world, r, shuffle, drop_last, seed), GW_SUCCESS);
    ck_assert_int_eq(gw_sampler_shard(&s, epoch, shard), GW_SUCCESS);
    for (int64_t i = 0; i < s.num_samples; i++) all[r + i * world] = shard[i];
  }
  free(shard);
  return all;
}

START_TEST(sampler_unshuffled_matches_pytorch) {
  /* list(DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False)) */
  const int64_t expect[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  int64_t total;
  int64_t *all = gather_shards(10, 4, 0, 0, 0, 0, &total);
  ck_assert_int_eq(total, 12);
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < 3; i++) ck_assert_int_eq(all[r + 4 * i], expect[r][i]);
  free(all);
  all = gather_shards(10, 4, 0, 1, 0, 0, &total); /* drop_last: [0, 4], [1, 5], [2, 6], [3, 7] */
  ck_assert_int_eq(total, 8);
  for (int k = 0; k < 8; k++) ck_assert_int_eq(all[k], k);
  free(all);
  all = gather_shards(2, 5, 0, 0, 0, 0, &total); /* fewer samples than ranks: 0 1 0 1 0 */
  ck_assert_int_eq(total, 5);
  for (int k = 0; k < 5; k++) ck_assert_int_eq(all[k], k % 2);
  free(all);
}
END_TEST

START_TEST(sampler_shuffled_epochs) {
  const int64_t ns[] = {1, 7, 10, 64, 1001};
  const int worlds[] = {1, 2, 3, 4, 8};
  for (int a = 0; a < 5; a++)
    for (int b = 0; b < 5; b++)
      for (int drop = 0; drop < 2; drop++) {
        int64_t n = ns[a], total, total2;
        if (drop && n < worlds[b]) continue;
        int64_t *all = gather_shards(n, worlds[b], 1, drop, 42, 3, &total);
        int64_t *order = malloc((size_t)n * sizeof *order);
        struct gw_sampler s;
        gw_sampler_init(&s, n, worlds[b], 0, 1, drop, 42);
        gw_sampler_order(&s, 3, order);
        /* The padded list is the epoch's order, then its start repeated (or cut). */
        ck_assert_int_eq(total, drop ? n / worlds[b] * worlds[b] : (n + worlds[b] - 1) / worlds[b] * worlds[b]);
        for (int64_t k = 0; k < total; k++) ck_assert_int_eq(all[k], order[k % n]);
        char *seen = calloc((size_t)n, 1);
        for (int64_t k = 0; k < n; k++) seen[order[k]]++;
        for (int64_t k = 0; k < n; k++) ck_assert_int_eq(seen[k], 1);
        int64_t *again = gather_shards(n, worlds[b], 1, drop, 42, 3, &total2);
        ck_assert(memcmp(all, again, (size_t)total * sizeof *all) == 0);
        free(again), free(seen), free(order), free(all);
      }
}
END_TEST

START_TEST(sampler_orders_differ) {
  struct gw_sampler s;
  ck_assert_int_eq(gw_sampler_init(&s, 1000, 1, 0, 1, 0, 7), GW_SUCCESS);
  int64_t e0[1000], e1[1000], other[1000];
  gw_sampler_order(&s, 0, e0);
  gw_sampler_order(&s, 1, e1);
  ck_assert(memcmp(e0, e1, sizeof e0) != 0);
  s.seed = 8;
  gw_sampler_order(&s, 0, other);
  ck_assert(memcmp(e0, other, sizeof e0) != 0);
  s.shuffle = 0;
  gw_sampler_order(&s, 5, other);
  for (int i = 0; i < 1000; i++) ck_assert_int_eq(other[i], i);
  expect_error(gw_sampler_init(&s, 10, 4, 4, 1, 0, 0), "sampler", "rank 4 of 4");
  expect_error(gw_sampler_init(&s, 3, 4, 0, 1, 1, 0), "sampler", "drop_last");
}
END_TEST

void add_sampler_tests(TCase *tc) {
  tcase_add_test(tc, sampler_unshuffled_matches_pytorch);
  tcase_add_test(tc, sampler_shuffled_epochs);
  tcase_add_test(tc, sampler_orders_differ);
}
