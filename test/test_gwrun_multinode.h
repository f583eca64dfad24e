/* test_gwrun_multinode.h - what test_gwrun_multinode.c shares with
 * test_gwrun_multinode_signals.c: gw-runs as nodes on this machine, and the
 * ranks' pid files. */
#ifndef GW_TEST_GWRUN_MULTINODE_H
#define GW_TEST_GWRUN_MULTINODE_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>

#include "gwrun_helpers.h"

/* Every multi-node run ends within seconds unless gw-run is broken; this
 * bound only keeps a broken one from stalling the suite. */
#define NODE_TIMEOUT_S 20.0

/* Starts node `node` of an nnodes-node job with master 127.0.0.1:port. */
void node_start(struct run *r, const char *const *env, int port, int nnodes, int node, const char *nproc,
                const char *script);
/* Waits for n gw-runs (NODE_TIMEOUT_S each at most). */
void nodes_wait(struct run *r, int n);
const char *hostname(void);
/* Whether every pid in dir/pid.0 .. pid.(n-1) is gone (after a moment). */
bool ranks_gone(const char *dir, int n);
/* How many of dir/pid.0 .. pid.(n-1) are written, waiting up to 10 s for all. */
int pid_files_written(const char *dir, int n);
/* Removes dir/pid.* and dir. */
void remove_pid_files(const char *dir, int n);
/* A 2-node job whose ranks write their pids and wait; true once node 1 joined. */
bool start_joined_pair(struct run *r, char *dir, char *dir_env, size_t dir_env_size, const char *token);

/* A socket listening where the nodes look for node 0's gw-run (the launcher
 * port: the master port + 1), for a test's own node 0. */
int launcher_listen(int port);

/* test_gwrun_multinode_signals.c's, test_gwrun_multinode_handshake.c's and
 * test_gwrun_arrival.c's cases. */
void add_multinode_signal_tests(TCase *tc);
void add_multinode_handshake_tests(TCase *tc);
void add_multinode_arrival_tests(TCase *tc);

#endif
