/* test_device.h - what test_device.c shares with test_device_streams.c (the
 * device suite's cases on several streams and hardware queues),
 * test_device_bucket.c (the bucketer case), test_device_settings.c and
 * test_device_failures.c. */
#ifndef GW_TEST_DEVICE_H
#define GW_TEST_DEVICE_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "dev.h"
#include "gradwire.h"

/* The device layer of the rank (set by each case's body). */
extern const struct gw_dev_ops *dv;

#define DCHECK(call) EXPECT((call) == 0, "%s: %s", #call, dv->error())
#define GWCHECK(call, comm) EXPECT((call) == GW_SUCCESS, "%s: %s", #call, gw_comm_last_error(comm))

/* Whether the device's streams share one hardware queue (GW_DEV_EMU_CONNECTIONS=1,
 * CUDA_DEVICE_MAX_CONNECTIONS=1): then no device ring, and a stream waiting
 * for the host holds up every other. */
int one_queue(void);
/* A stream and a device buffer of count int32, and one allreduce through them
 * that completed (every rank in, the communicator working). */
int warm_stream(gw_comm_t comm, int rank, size_t count, gw_dev_stream_t *s, int32_t **d);
/* The misuse case's second half, on the emulator (a raw body for run_ranks_raw). */
int device_setup_retry(int rank, int n, const char *master, void *arg);
/* Adds the cases of test_device_streams.c to the suite. */
void device_add_stream_cases(Suite *s);
/* A case named `name` of one test, with a 300 s limit, in s. */
void device_add_case(Suite *s, const char *name, const TTest *test);
/* Adds test_device_bucket.c's cases: bucketer, bucketer_fault, bucketer_sides. */
void device_add_bucketer_case(Suite *s);
/* Adds test_device_settings.c's "settings" case. */
void device_add_settings_case(Suite *s);
/* Adds test_device_failures.c's cases: dead-peer, dead-midop, destroy,
 * peer-fails-first, teardown, stopped-async. */
void device_add_failure_cases(Suite *s);
/* GW_TEST_NRANKS, or 2. */
int nranks_env(void);

#endif
