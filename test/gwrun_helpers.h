/*
 * gwrun_helpers: shared helpers for the gw-run Check suites (test_gwrun.c,
 * test_gwrun_multinode.c, test_gwrun_restart.c).
 *
 * What it is: running the built gw-run binary (GW_RUN_BIN) with its stdout
 * and stderr captured in temporary files and a timeout guard, so that a
 * broken gw-run fails a test instead of hanging the suite; searching the
 * captured output by line; finding free loopback ports; reading the pid
 * files that test ranks write; and starting one gw-run per node of a job on this machine; and the
 * suites' common main().
 *
 * What it is not: a test itself, nor anything specific to one suite. The helpers fail the calling test through Check's
 * assertions, so they may only be called from inside a test.
 */
#ifndef GWRUN_HELPERS_H
#define GWRUN_HELPERS_H

#include <check.h>
#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

/* Generous: the CI machines have 2 shared cores. */
#define GWRUN_TIMEOUT_S 40.0

struct run {
    pid_t pid;
    char out_path[64], err_path[64];
    char tmp_path[64]; /* the run's TMPDIR (unless env sets one): removed with all it holds by gwrun_wait */
    struct timespec t0;
    int status;
    int code;       /* exit code, or 128 + signal when gw-run itself was killed */
    bool timed_out; /* gw-run did not finish in time and was killed */
    double elapsed; /* seconds from start to exit */
    double cpu_s;   /* CPU time of gw-run and the children it reaped (user + system) */
    char *out, *err;
};

double gwrun_seconds_since(const struct timespec *t0);
void gwrun_sleep(double s);

/* Starts gw-run with args (NULL-terminated, without argv[0]). env holds
 * "NAME=VALUE" to set and "NAME" to unset in the child, NULL-terminated.
 * gw-run gets a TMPDIR of its own (env may set another), so that what a
 * killed gw-run leaves there (its records' folder) goes with the run. */
void gwrun_start(struct run *r, const char *const *env, const char *const *args);
/* The same with gw-run's stdout on out_fd instead (r->out then stays empty). */
void gwrun_start_out(struct run *r, int out_fd, const char *const *env, const char *const *args);
/* The same with prog in gw-run's place (a program run alone: args are its own). */
void gwrun_start_prog(struct run *r, const char *prog, const char *const *env, const char *const *args);
/* The same in a session of its own whose controlling terminal is ctty (a pty's
 * slave): a ^C written to the master reaches gw-run and its ranks as the
 * terminal's SIGINT. */
void gwrun_start_ctty(struct run *r, const char *ctty, const char *const *env, const char *const *args);
/* Waits for gw-run, killing it after timeout_s, then collects its output. */
void gwrun_wait(struct run *r, double timeout_s);
/* gwrun_start, then gwrun_wait with GWRUN_TIMEOUT_S; fails the test on a timeout. */
void gwrun_run(struct run *r, const char *const *env, const char *const *args);
void gwrun_free(struct run *r);

/* Starts node `node` of an nnodes-node job on this machine (master
 * 127.0.0.1:port), nproc ranks of `sh -c script` each; extra: more gw-run
 * options before the program (NULL-terminated; NULL: none). */
void gwrun_node_start(struct run *r, const char *const *env, int port, int nnodes, int node, const char *nproc,
                      const char *const *extra, const char *script);
/* Waits for every run (each killed after timeout_s from its start) before any
 * assertion, so that a failed check leaves no gw-run behind. */
void gwrun_nodes_wait(struct run *r, int n, double timeout_s);
void gwrun_nodes_free(struct run *r, int n);

/* Whether a running gw-run's stderr file holds needle within timeout_s. */
bool gwrun_stderr_has(const struct run *r, const char *needle, double timeout_s);
/* Whether text holds exactly this line (without its newline). */
bool gwrun_has_line(const char *text, const char *line);
int gwrun_count_lines(const char *text);
/* Calls fn on each line of text, copied into a NUL-terminated buffer. */
void gwrun_for_each_line(const char *text, void (*fn)(const char *line, void *arg), void *arg);

/* A port P with P and P + 1 both free on 127.0.0.1 (master and launcher port). */
int gwrun_free_port_pair(void);
/* The pid on the first, complete line of path; 0 if there is none yet. */
pid_t gwrun_read_pid_file(const char *path);
/* A fresh directory for a test's files, as env_dir = "GWT_DIR=<dir>" (the
 * directory itself at env_dir + 8); gwt_dir_remove removes it and all in it. */
void gwt_dir(char *env_dir, size_t cap);
void gwt_dir_remove(const char *env_dir);
/* The pid in file <GWT_DIR>/name (gwrun_read_pid_file), 0 if none. */
pid_t gwt_pid(const char *env_dir, const char *name);
/* The process with the pid in file <GWT_DIR>/name is gone: asserted (a
 * survivor is killed first, naming `what`). */
void gwt_assert_gone(const char *env_dir, const char *name, const char *what);
/* Whether pid is a zombie: ended, not yet reaped (its parent stopped). */
bool gwrun_is_zombie(pid_t pid);

/* main() of a gw-run suite: checks GW_RUN_BIN (prog names the binary in the
 * message), runs the suite make_suite builds, and returns the exit status. */
int gwrun_main(const char *prog, Suite *(*make_suite)(void));

/* test_gwrun_output.c's cases, added to test_gwrun's test case. */
void gwrun_add_output_tests(TCase *tc);
/* test_gwrun_env.c's cases: the ranks' environment. */
void gwrun_add_env_tests(TCase *tc);
/* test_gwrun_logs.c's cases: --log-dir, --tee, --redirects. */
void gwrun_add_log_tests(TCase *tc);
/* test_gwrun_cause.c's cases: where a failure began (GW_ERROR_FILE records). */
void gwrun_add_cause_tests(TCase *tc);

/* What gw-run adds to a fork refused with EAGAIN. */
#define GWRUN_FORK_LIMIT_HINT " (this user's or container's limit on processes and threads: ulimit -u, the cgroup's pids.max)"

#endif
