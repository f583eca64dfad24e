/* gw-perf.h - gw-perf's inputs and their expected results (gw-perf-values.c):
 * each rank fills its input with gwp_input_elem and checks the output with
 * gwp_reduce_ok (reductions) or against the inputs' bytes (data moves). */
#ifndef GW_PERF_H
#define GW_PERF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gradwire.h"

/* 0 for the checked runs; the timed runs take another set of inputs (1), so
 * one that wrote nothing leaves the checked run's result, which is wrong. */
extern uint64_t gwp_value_salt;

/* The inputs for one collective (a reduction: allreduce or reduce_scatter,
 * else a data move), dtype and op, over job_ranks ranks. */
void gwp_choose_values(bool reduction, gw_dtype_t dt, int op, int job_ranks);
/* Rank r's input element i as the dtype's bytes (its size of out). */
void gwp_input_elem(gw_dtype_t dt, int r, size_t i, uint8_t out[8]);
/* Whether element i of out is the reduction over every rank of element `at`. */
bool gwp_reduce_ok(gw_dtype_t dt, int op, const void *out, size_t i, size_t at);
/* A value (its dtype's bytes into out) that gwp_reduce_ok refuses at `at`. */
void gwp_wrong_elem(gw_dtype_t dt, int op, size_t at, uint8_t out[8]);
/* One value (into out) that gwp_reduce_ok refuses at every element for these
 * inputs, when there is one: false means gwp_wrong_elem per element. */
bool gwp_wrong_fixed(gw_dtype_t dt, int op, uint8_t out[8]);
bool gwp_is_float(gw_dtype_t dt);
#endif
