/* gw-perf-run.h - gw-perf.c's run state and exits, for its other files
 * (gw-perf-tune.c): the communicator, this rank and the world size, the
 * failure exit (status 1, the message on stderr), a check of a gradwire call,
 * the monotonic clock and pre-faulted buffers; gw-perf-args.c's help text
 * and value parsers; gw-perf-json.c's --json writer. */
#ifndef GW_PERF_RUN_H
#define GW_PERF_RUN_H

#include <stddef.h>
#include <stdio.h>

#include "gradwire.h"

gw_comm_t gwp_comm(void);
int gwp_rank(void);
int gwp_nranks(void);
void gwp_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void gwp_check(gw_result_t r, const char *what);
double gwp_now(void); /* seconds, CLOCK_MONOTONIC */
void *gwp_alloc_prefaulted(size_t bytes);
/* A flag's value or a combination of flags refused: the message, exit 2. */
void gwp_bad_use(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* gw-perf-args.c: the help text, a size (K/M/G, at most 64G, whole bytes)
 * and an integer in lo..hi, WHAT naming the flag in a refusal. */
void gwp_usage(FILE *f);
size_t gwp_parse_size(const char *s, const char *what);
int gwp_parse_int_arg(const char *s, int lo, int hi, const char *what);
/* --tune FILE, after the options were checked (every rank): 0, or exits. */
int gwp_tune(const char *path);
/* gw-perf-json.c: --json, a whole document after each row (rank 0): its
 * head, a row (its text, with the comma before it but the first), the end. */
void gwp_json_begin(FILE *json, const char *coll, int nranks);
void gwp_json_row(FILE *json, const char *row);
void gwp_json_end(FILE *json, double avg_busbw, int check, const char *wrong);

#endif
