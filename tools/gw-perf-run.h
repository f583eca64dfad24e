/* gw-perf-run.h - gw-perf.c's run state and exits, for its other files
 * (gw-perf-tune.c): the communicator, this rank and the world size, the
 * failure exit (status 1, the message on stderr), a check of a gradwire call,
 * the monotonic clock and pre-faulted buffers. */
#ifndef GW_PERF_RUN_H
#define GW_PERF_RUN_H

#include <stddef.h>

#include "gradwire.h"

gw_comm_t gwp_comm(void);
int gwp_rank(void);
int gwp_nranks(void);
void gwp_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void gwp_check(gw_result_t r, const char *what);
double gwp_now(void); /* seconds, CLOCK_MONOTONIC */
void *gwp_alloc_prefaulted(size_t bytes);
/* --tune FILE, after the options were checked (every rank): 0, or exits. */
int gwp_tune(const char *path);

#endif
