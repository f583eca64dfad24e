/*
 * gw-run.h: what the three files of the gw-run launcher share.
 *
 * What it is: the rank and stream structs, the job state that more than one
 * file reads or writes, and the gw__run_ functions each file offers the
 * others. gw-run.c parses arguments, sets up the environment, spawns the ranks
 * and runs the main loop; gw-run-io.c forwards their output; gw-run-teardown.c
 * handles signals, failures, teardown and reaping.
 *
 * What it is not: an interface for anything outside tools/gw-run*.c. gw-run
 * links nothing from gradwire, and nothing else includes this header.
 */
#ifndef GW_RUN_H
#define GW_RUN_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* One of a rank's two output pipes and the unfinished line read from it. */
struct stream {
    int fd;      /* read end, -1 once it reached EOF and was closed */
    int out_fd;  /* where its lines go: 1 or 2 */
    char *partial; /* bytes after the last newline; [len], capacity cap */
    size_t len, cap;
};

struct rank {
    pid_t pid;          /* 0 when never started or already reaped */
    int global;         /* global rank, printed as the line prefix */
    bool stopped_by_us; /* gw-run stopped it: its exit is not a failure */
    struct stream s[2]; /* [0] stdout, [1] stderr */
};

/* The job as the three files see it; the one instance, gw__run, lives in
 * gw-run.c. State that only one file needs stays static in that file. */
struct job {
    struct rank *ranks;
    int nranks;      /* ranks spawned (N unless a fork failed) */
    int alive;       /* spawned and not yet reaped */
    int open_streams;

    bool have_failure;
    int exit_code;     /* of the first failure that gw-run did not cause */
    int got_signal;    /* first SIGINT/SIGTERM received, 0 if none */
    double kill_grace_s;
    int64_t kill_deadline_ms; /* SIGKILL the remaining ranks then; 0: none */
};

extern struct job gw__run;

/* gw-run-io.c: output forwarding. */
int gw__run_io_pollfds(struct pollfd *pfds, int nfds, struct stream **owner,
                       struct rank **owner_rank);
bool gw__run_pump(const struct rank *r, struct stream *s);
void gw__run_abandon_output(void);

/* gw-run-teardown.c: signals, failures, teardown, reaping. */
int64_t gw__run_now_ms(void);
bool gw__run_setup_signals(void);
int gw__run_signal_fd(void);
void gw__run_drain_signals(bool *child_event);
void gw__run_child_signals(void);
void gw__run_index_ranks(void);
void gw__run_teardown(void);
void gw__run_escalate(void);
void gw__run_reap(void);
bool gw__run_stopping(void);
void gw__run_scan_strays(void);
bool gw__run_waiting_for_strays(void);

#endif
