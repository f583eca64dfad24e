/*
 * gw-run.h: what the four files of the gw-run launcher share.
 *
 * What it is: the rank and stream structs, the job state that more than one
 * file reads or writes, and the gw__run_ functions each file offers the
 * others. gw-run.c parses arguments, sets up the environment, spawns the ranks
 * and runs the main loop; gw-run-io.c forwards their output; gw-run-teardown.c
 * handles signals, failures, teardown and reaping; gw-run-net.c is the
 * launcher control channel between the nodes of a multi-node job.
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
    int global;         /* global rank */
    char prefix[128];   /* before each line it prints: "[global] ", or --log-line-prefix-template's */
    bool stopped_by_us; /* gw-run stopped it: its exit is not a failure */
    struct stream s[2]; /* [0] stdout, [1] stderr */
    int exec_fd;        /* the exec report's read end (close-on-exec in the child: it holds
                           an errno when exec failed, nothing when the program started); -1 none */
    int64_t done_ms;    /* when it exited with code 0 of itself (gw__run_now_ms); 0: it has not */
};

/* The job as the three files see it; the one instance, gw__run, lives in
 * gw-run.c. State that only one file needs stays static in that file. */
struct job {
    const char *run_id; /* --rdzv-id, the workers' TORCHELASTIC_RUN_ID ("none" without) */
    struct rank *ranks;
    int nranks;      /* ranks spawned (N unless a fork failed) */
    int alive;       /* spawned and not yet reaped */
    int open_streams;

    bool have_failure;
    int exit_code;     /* of the first failure that gw-run did not cause */
    bool not_started;  /* a rank's program could not be started (exec failed): no restart helps */
    int fail_weight;   /* what exit_code says of the cause: 2 a rank killed by a signal, 1 an exit (0 unset) */
    int got_signal;    /* first SIGINT/SIGTERM/SIGHUP received, 0 if none */
    int own_signal;    /* the first of those that reached this gw-run itself (not another node's STOP) */
    /* A stop signal came once every rank here was gone: output that our
     * stdout or stderr does not take is given up at once, not after
     * GW_RUN_OUT_STUCK_MS (gw__run_io_stuck_ms). */
    bool out_hurry;
    double kill_grace_s;
    int64_t kill_deadline_ms; /* SIGKILL the remaining ranks then; 0: none */
    /* When each signal last went to the ranks (0: never) and whether another
     * node's gw-run sent it: one that reaches several nodes' gw-run within a
     * second (scancel, a time limit) reaches every rank once, not once per
     * node (gw__run_once_per_signal). */
    int64_t sig_ms[32];
    bool sig_remote[32];

    const char *prefix_template, *role; /* --log-line-prefix-template (NULL: none), --role */
    long attempt;     /* 0, then 1, 2, ... for each restart (--max-restarts) */
    bool may_restart; /* restarts are left after this attempt */
};

extern struct job gw__run;

/* gw-run.c: why this node's part of the attempt that ended cannot start
 * again (NULL: it can; "": nothing to say), and saying it. */
const char *gw__run_restart_refusal(void);
void gw__run_say_no_restart(const char *why, long max_restarts);

/* The launcher control channel's frames: gw-run-io.c encodes them and moves
 * them through non-blocking sockets, gw-run-net.c decides what they mean. */
enum {
    GW_RUN_MAX_FRAME = 4096, /* body bytes; a larger length prefix is garbage */
    GW_RUN_MAX_STR = 1024,   /* bytes in one string field */
};
/* The hello's first field: "GWL" and the protocol's version ('2': with
 * --max-restarts; '3': the token proven by challenge and response, never
 * sent; '4': the welcome gives the node its number, nodes numbered by
 * arrival; '5': CAUSE frames and the FAIL frame's record kind, where a
 * failure began; '6': the hello's kill grace; '7': node 0 answers a READY
 * with the longest kill grace, WAIT; '8': BEAT, heartbeats both ways; '9':
 * LOST says whether the node's link ended or went silent, RESTART 0 says
 * why not).  Another version is refused by name. */
#define GW_RUN_HELLO_MAGIC 0x47574c39u
/* net_config.node of a node started without --node-rank, and the number its
 * hello gives then. */
enum { GW_RUN_NODE_AUTO = -1 };
#define GW_RUN_NODE_ANY 0xffffffffu
enum {
    F_HELLO = 1, F_WELCOME, F_REFUSE, F_FAIL, F_LOST, F_ABORT, F_STOP, F_DONE, F_READY, F_RESTART, F_PASS,
    F_CHALLENGE, F_CAUSE, F_WAIT, F_BEAT
};
/* The challenge's nonce and the proofs (HMAC-SHA256 under the job token). */
enum { GW_RUN_NONCE = 16, GW_RUN_PROOF = 32 };
/* What reading a connection came to. */
enum { R_OPEN, R_GONE, R_BAD, R_CLOSED };

struct frame {
    unsigned char b[4 + GW_RUN_MAX_FRAME];
    size_t n;
};

/* A frame's fields: v[] the integers in layout order, tok the raw bytes
 * (nonces, proofs: pointing into the frame), s the string, control bytes made '?' so a
 * peer cannot send escape sequences to our terminal. */
struct msg {
    unsigned type;
    uint32_t v[6];
    const unsigned char *tok;
    size_t toklen;
    char s[GW_RUN_MAX_STR + 1];
};

/* One end of a control connection between two nodes' gw-runs. */
struct conn {
    int fd;              /* -1 once closed */
    int node;            /* node 0: the peer's node rank once joined, else -1 */
    bool connecting;     /* the other nodes: connect() in progress */
    bool broken;         /* too much unsent output: to be closed */
    int64_t deadline_ms; /* hello due (node 0) or this connect attempt over */
    int64_t accepted_ms; /* node 0: when it was accepted */
    char peer[80];       /* the other end's address, for messages */
    unsigned char in[4 + GW_RUN_MAX_FRAME]; /* [inlen]: the start of the next frames */
    size_t inlen;
    unsigned char *out; /* [outlen], capacity outcap: frames not yet sent */
    size_t outlen, outcap;
    /* The challenge and response: the nonce this end sent and the one the
     * other end sent (node 0: from the hello; the others: the challenge). */
    unsigned char nonce[GW_RUN_NONCE], peer_nonce[GW_RUN_NONCE];
    bool challenged; /* the other nodes: the challenge came and the hello went */
    int64_t heard_ms; /* when bytes last came from the other end (a BEAT at least every GW_RUN_BEAT_MS) */
    bool silence_said; /* silent, its machine not answering either: said once (the network's; keepalive ends it) */
};

/* What the control channel needs from the command line (gw-run.c). */
struct net_config {
    int node, nnodes, nproc; /* --node-rank (GW_RUN_NODE_AUTO: none given), --nnodes, -n */
    bool not_host;           /* --rdzv-conf is_host=0: with no --node-rank, never node 0 */
    const char *host;        /* the master HOST, without IPv6 brackets */
    int lport;               /* the launcher port: master PORT + 1 or --launcher-port */
    const char *token;       /* GW_JOB_TOKEN */
    double join_timeout_s;   /* GW_RUN_JOIN_TIMEOUT */
    double silence_s;        /* GW_RUN_HEARTBEAT_TIMEOUT: a joined launcher silent this long is lost; 0: never */
    int max_restarts;        /* --max-restarts: every node must give the same */
};

/* gw-run-io.c: output forwarding, and control-channel frames. Lines go out
 * through writer threads started by gw__run_io_start (before that, and in
 * their absence, directly); gw__run_say is gw-run's own stderr, in order with
 * the ranks' lines. *held: a destination's queue is full, so pipes feeding
 * it were left out (the loop checks again soon). */
void gw__run_io_start(void);
/* gw-run-loop.c: runs one attempt of the job started by spawn_all until every
 * rank and stray is gone (or given up on). */
void gw__run_loop(void);
/* Writes out what is queued and ends the writers (also run at exit).
 * After a stop signal it waits no longer than the output moves: a
 * destination that took nothing for GW_RUN_OUT_STUCK_MS (a paused `| less`,
 * a reader that never reads), or at once after a signal with no rank left
 * (out_hurry), is left behind, named on the other one where it can be. */
void gw__run_io_finish(void);
enum { GW_RUN_OUT_STUCK_MS = 5000, GW_RUN_OUT_HURRY_MS = 250 };
/* gw-run-teardown.c: a SIGINT/TERM/HUP/QUIT came and was not handled yet
 * (the loop is over: gw__run_io_finish asks). */
bool gw__run_stop_signal_pending(void);
/* How long a destination has had bytes to take and taken none (0: it is not
 * behind). */
int64_t gw__run_io_stuck_ms(void);
void gw__run_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int gw__run_io_pollfds(struct pollfd *pfds, int nfds, struct stream **owner,
                       struct rank **owner_rank, bool *held);
bool gw__run_pump(const struct rank *r, struct stream *s);
void gw__run_abandon_output(void);
/* After a stop signal, every rank gone: our own output took nothing for
 * too long; the ranks' pipes are closed and what they held is lost. */
void gw__run_abandon_stuck_output(int64_t stuck_ms);
void gw__run_pack(struct frame *f, const struct msg *m);
/* n random bytes (getrandom); false when the kernel has none to give. */
bool gw__run_random(void *buf, size_t n);
void gw__run_tune_socket(int fd);
bool gw__run_out_add(struct conn *c, const void *p, size_t n);
void gw__run_conn_send(struct conn *c, const struct frame *f);
bool gw__run_conn_flush(struct conn *c);
int gw__run_conn_read(struct conn *c, bool (*handle)(struct conn *, const struct msg *),
                      const char **why);
void gw__run_conn_close(struct conn *c);

/* gw-run-net.c: the launcher control channel (nothing at all with one node);
 * gw__run_net_restart and gw__run_net_reset are gw-run-restart.c's. */
void gw__run_test_restart_hold(void); /* gw-run-restart.c: tests' hold between attempts */
bool gw__run_net_init(const struct net_config *cfg);
/* A node started without --node-rank that is not node 0: waits for node 0's
 * welcome and returns the number it gave; -1 when none came (said), or when
 * a SIGINT, SIGTERM, SIGHUP or SIGQUIT is pending (*sig; said).  Node 0 and
 * numbered nodes: their number at once. */
int gw__run_net_join(int *sig);
int gw__run_net_max_fds(void);
int gw__run_net_pollfds(struct pollfd *pfds, int nfds, int64_t *deadline_ms);
void gw__run_net_events(const struct pollfd *pfds, int nfds);
void gw__run_net_tick(void);
bool gw__run_net_finish(void);
void gw__run_net_rank_failed(int global, bool signaled, int value, int recorded);
void gw__run_net_launch_failed(int code, const char *text);
void gw__run_net_signal(int sig);
void gw__run_net_pass(int sig); /* SIGUSR1/SIGUSR2 to every node's ranks, the job going on */
void gw__run_net_close(void);
/* gw-run-cause.c: the rank a failed job's failure began at (each rank's
 * GW_ERROR_FILE record).  init makes the records' folder (once), env sets a
 * rank's GW_ERROR_FILE (in its child), read takes a rank's record as it exits
 * (failed: a non-zero exit or a signal, the teardown's included), send is the
 * other nodes' (their earliest origin to node 0, once their ranks are gone),
 * heard node 0's for another node's CAUSE frame, named marks the failure
 * gw-run named (-1: no rank's) with what that rank recorded, say ends an
 * attempt (saying the earliest origin when the named rank recorded none of
 * its own and it came before), cleanup removes the folder. */
enum { GW_RUN_CAUSE_NONE, GW_RUN_CAUSE_ORIGIN, GW_RUN_CAUSE_CONSEQUENCE };
void gw__run_cause_init(void);
void gw__run_cause_env(int global);
int gw__run_cause_read(int global, long pid, bool failed); /* the record's kind (GW_RUN_CAUSE_*) */
/* Whether rank global's record (not consumed) says the failure was its own. */
bool gw__run_cause_own(int global);
void gw__run_cause_send(void);
void gw__run_cause_heard(const struct msg *m, const char *host);
void gw__run_cause_named(int global, int kind);
void gw__run_cause_say(void);
void gw__run_cause_cleanup(void);
/* After an attempt's loop ended: the attempt every node starts next (node 0
 * decided it once every node's ranks were gone), 0 for none; and the
 * channel's state made ready for that attempt. */
long gw__run_net_restart(void);
void gw__run_net_reset(void);

/* gw-run-teardown.c: signals, failures, teardown, reaping. */
int64_t gw__run_now_ms(void);
/* Names the ranks here that exited with code 0 before the job's failure
 * (at most 4, then a count), leaving out global rank failed (-1: none). */
void gw__run_say_done_before(int failed);
const char *gw__run_signal_name(int sig);
bool gw__run_fail(int code);
/* Another node's failure heard while stopping: whether it replaces the one
 * the job ended with (see gw-run-teardown.c), having done so. */
bool gw__run_refail(int code, int weight, bool from_node0);
void gw__run_remote_signal(int sig);
void gw__run_pass_signal(int sig, int from_node);
bool gw__run_setup_signals(void);
int gw__run_signal_fd(void);
void gw__run_drain_signals(bool *child_event);
void gw__run_child_signals(void);
void gw__run_index_ranks(void);
void gw__run_teardown(void);
void gw__run_escalate(void);
/* When gw-run stops waiting for processes SIGKILL did not end (0: not yet
 * escalated), and the giving up: each is named, the job fails. */
int64_t gw__run_give_up_deadline(void);
void gw__run_give_up(void);
/* A signal arrived while the ranks were being forked (spawn_all): it is passed
 * on to every rank even if it came from the terminal. */
void gw__run_signal_during_spawn(void);
/* Just before the ranks of an attempt start: a SIGUSR1/SIGUSR2 held since
 * the launcher's setup or the last attempt is dropped, and said so (passed
 * on, it would kill ranks that have no handler for it yet). */
void gw__run_drop_early_passes(void);
void gw__run_reap(void);
bool gw__run_stopping(void);
void gw__run_scan_strays(void);
/* Before the first rank: the children gw-run has already (inherited across
 * exec), which gw__run_scan_strays leaves alone. */
void gw__run_note_inherited_children(void);
bool gw__run_waiting_for_strays(void);
void gw__run_remove_leftover_shm(const char *token);
/* Whether pid is one of the ranks gw-run started in this attempt (gw-run-teardown.c). */
bool gw__run_started_pid(pid_t pid);
/* FNV-1a 64 of a string, as the library hashes the job token. */
uint64_t gw__run_fnv1a(const char *s);
/* Between two attempts of a job (--max-restarts): the teardown's state of
 * the one that ended is forgotten. */
void gw__run_teardown_reset(void);
/* gw-run-reap.c: the attempt's index forgotten (gw__run_teardown_reset);
 * whether pid is a running rank's; pid's /proc/<pid>/stat from its state on,
 * read into buf (NULL where it cannot be). */
void gw__run_reap_reset(void);
bool gw__run_is_rank(pid_t pid);
const char *gw__run_proc_stat_fields(pid_t pid, char *buf, size_t len);

/* ---- gw-run-setup.c: what gw-run prepares before spawning */
enum {
    GW_RUN_MAX_LOCAL_RANKS = 4096,
    GW_RUN_TOKEN_MAX = 128, /* the library's longest GW_JOB_TOKEN (comm/bootstrap.h) */
};
int gw__run_free_port(void);
void gw__run_job_env(long world, long local_n, long nnodes, long node_rank, const char *host, long port,
                     long lport, bool multi, const char *token);
int gw__run_ranks_by_kind(const char *kind, long *n);
double gw__run_env_seconds(const char *name, double dflt, bool zero_ok);
/* Sets the names given (b and c may be NULL) to v in decimal. */
void gw__run_setenv_long(const char *a, const char *b, const char *c, long v);
/* ---- gw-run-args.c: the command line.  The usage error says fmt (with
 * arg), then the help text, and exits 2.  Strict decimal numbers within
 * [lo, hi]; HOST:PORT or [v6addr]:PORT (a bare IPv6 address is refused: its
 * last colon cannot be told from the port's). */
extern const char gw__run_usage_text[];
void gw__run_usage_error(const char *fmt, const char *arg) __attribute__((noreturn));
/* The same with the message made (msg), arg being the value it is about: a
 * value that came from a PET_ variable is named as such. */
void gw__run_usage_error_for(const char *msg, const char *arg) __attribute__((noreturn));
/* " (FLAG from VAR in the environment, ...)" where FLAG's value came from
 * torchrun's PET_ variable VAR (gw__run_pet_argv), else "": in buf. */
const char *gw__run_pet_note(const char *flag, char *buf, size_t cap);
/* --standalone: refused with --nnodes above 1; a master or endpoint given
 * beside it is said and dropped (torchrun's --standalone runs on localhost
 * whatever else is given; one unreachable held the job until the bootstrap
 * deadline).  Returns the master to use. */
const char *gw__run_standalone(bool standalone, long nnodes, const char *master);
/* argv with torchrun's PET_* environment variables put before the options as
 * the flags they stand for (PET_NPROC_PER_NODE as --nproc-per-node, ...),
 * those whose flag (getopt code in given[]) the command line has left out;
 * the master's (address, port, endpoint) only when the command line names
 * none of them.  argc is updated; argv itself when there are none. */
char **gw__run_pet_argv(const char given[128], int *argc, char **argv);
bool gw__run_parse_long(const char *s, long lo, long hi, long *out);
bool gw__run_parse_master(const char *s, char *host, size_t hostsz, long *port);
/* torchrun's --nnodes (N, or MIN:MAX with MIN = MAX), --rdzv-backend (c10d
 * and static) and --rdzv-conf (join_timeout in seconds; is_host: 1 node 0, 0
 * never node 0; other keys said and ignored): false with the reason in err. */
bool gw__run_parse_nnodes(const char *v, long *out, char *err, size_t errsz);
bool gw__run_check_rdzv_backend(const char *v, char *err, size_t errsz);
bool gw__run_parse_rdzv_conf(const char *v, double *join_timeout_s, int *is_host, char *err, size_t errsz);
/* What runs for PROGRAM ARGS: as given (DIRECT, torchrun's --no-python), or
 * as torchrun runs it, the interpreter (GW_RUN_PYTHON, else python3) with -u
 * and the script (AUTO: where PROGRAM ends in .py; else as given) or -m and
 * the module (MODULE).  argv itself, or a new array; NULL: out of memory. */
enum { GW_RUN_PROG_AUTO, GW_RUN_PROG_DIRECT, GW_RUN_PROG_MODULE };
char **gw__run_program_argv(char **argv, int mode);
/* torchrun's --local-ranks-filter: local ranks separated by commas; shown[local]
 * for the -n local ranks (ranks past it ignored); false with the reason. */
bool gw__run_parse_ranks_filter(const char *v, int local_n, bool *shown, char *err, size_t errsz);
/* torchrun's flags that change nothing here, their values checked:
 * --monitor-interval (gw-run sees a rank's exit at once, by SIGCHLD) and
 * --start-method (every rank is a fresh process, torchrun's spawn). */
bool gw__run_check_ignored(const char *flag, const char *v, char *err, size_t errsz);
/* A rank's line prefix: "[RANK] ", or torchrun's --log-line-prefix-template
 * with ${role_name}, ${rank} and ${local_rank} (or $name; $$ is $) put in.
 * Returns whether it was cut to fit cap. */
bool gw__run_format_prefix(const char *tmpl, const char *role, int rank, int local, char *out, size_t cap);

/* ---- gw-run-logs.c: the ranks' log files (--log-dir, --tee, --redirects).
 * Setup takes the options as given (NULL: absent): 0, or the reason in err
 * and -2 (a bad value: gw-run's usage follows) or 1 (out of memory).  Start
 * makes the run's directory (0, or 1 with the system's reason). */
int gw__run_logs_setup(const char *dir, const char *tee, const char *redirects, const char *filter, int local_n,
                       int node_rank, int nnodes, char *err, size_t errsz);
int gw__run_logs_start(int node_rank, char *err, size_t errsz); /* node_rank: setup's, or the one node 0 gave */
/* Whether any stream goes to a file. */
bool gw__run_logs_on(void);
/* The file stream k (0 stdout, 1 stderr) of local rank `local` goes to alone (redirected), or NULL. */
const char *gw__run_logs_file_only(int local, int k);
/* Opens the files of local rank `local` (global rank `global`) for an attempt. */
bool gw__run_logs_open(int local, int global, long attempt, char *why, size_t whysz);
/* Writes what stream k read to its file; how many of those bytes the console skips. */
size_t gw__run_logs_write(int local, int k, int global, const char *p, size_t n);
void gw__run_logs_close(int local, int k);
/* A failed rank hidden by --local-ranks-filter: the end of its stderr, said. */
void gw__run_logs_say_hidden(int local, int global, const char *prefix);
/* Whether the console takes nothing of local rank `local`'s stream k
 * (--local-ranks-filter hides it, and its log file did not fail, which
 * sends it there): read even while the console's queue is full. */
bool gw__run_logs_console_skips(int local, int k);
bool gw__run_make_token(char out[33]);
void gw__run_attempt_token(const char *token, long k, char *out, size_t cap);

#endif
