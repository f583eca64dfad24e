/* bucket.h - the bucketer's internal pieces shared by bucket.c and
 * bucket_agree.c. */
#ifndef GW_BUCKET_H
#define GW_BUCKET_H

#include <stddef.h>
#include <stdint.h>

#include "gradwire.h"

/* The bucketer's error: fmt's message, "rank N: " before it when it does not
 * say its rank, as comm's last error (the thread's when comm is NULL);
 * returns code. */
gw_result_t gw__bucket_fail(gw_comm_t comm, gw_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* gw_bucketer_create's agreement with the other ranks (bucket_agree.c), each
 * a collective every rank calls.  The layouts: GW_SUCCESS when every rank's
 * (count, dtype, op, bounds, mem: its gradients are device memory) is rank
 * 0's, else refused on every rank naming a rank that differs and how; a rank
 * whose own arguments were refused passes that as `refused` and still takes
 * part (its peers then fail at once naming it), and gets it back. */
gw_result_t gw__bucket_agree_layout(gw_comm_t comm, size_t count, gw_dtype_t dtype, gw_op_t op, const size_t *bounds,
                                    int nbuckets, int mem, gw_result_t refused);
/* The new bucketer's number on comm: the lowest no live bucketer holds on
 * any rank (1 to GW_BUCKETER_NUMBERS - 1), else refused on every rank. */
gw_result_t gw__bucket_agree_number(gw_comm_t comm, uint32_t *number);

#endif
