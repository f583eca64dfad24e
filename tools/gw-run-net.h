/*
 * gw-run-net.h: the launcher control channel's state, shared by gw-run-net.c
 * (joining, frames, failures and signals between the nodes) and
 * gw-run-restart.c (agreeing on a restart).  Nothing else includes it.
 */
#ifndef GW_RUN_NET_H
#define GW_RUN_NET_H

#include <netdb.h>
#include <stdbool.h>
#include <stdint.h>

#include "gw-run.h"

enum {
    MAX_PENDING = 64, /* accepted connections that have not said hello */
    HELLO_TIMEOUT_MS = 5000,
    CONNECT_ATTEMPT_MS = 3000, /* one connect() to a host that does not answer */
    RETRY_MIN_MS = 50,
    RETRY_MAX_MS = 1000,
    LINGER_MS = 5000, /* a node that failed, still trying to tell node 0 */
    FLUSH_MS = 2000,  /* sending the last frames before exiting */
    JOIN_NOTE_MS = 10000, /* a node not yet welcomed says it is still trying, first after this */
    JOIN_NOTE_EVERY_MS = 30000,
    GW_RUN_BEAT_MS = 500, /* a BEAT on every joined connection this often, both ways */
    OWN_GAP_MS = 2000,
    GW_RUN_MAX_LISTEN = 8, /* node 0's listeners: one per address of the master HOST, as the rendezvous' */ /* ticks this far apart: this gw-run did not run meanwhile (its loop wakes every beat) */
};

/* What node 0 knows of each other node. ENDED: it failed, stopped or left.
 * READY: its ranks of a failed attempt are gone and it can start again. */
enum { N_ABSENT, N_JOINED, N_DONE, N_ENDED, N_READY };

struct run_net {
    bool on, verbose;
    struct net_config cfg;
    char where[320];  /* HOST:LPORT, for messages */
    char myhost[256]; /* this machine's hostname */
    int64_t join_deadline_ms, flush_ms, linger_ms;
    int64_t others_end_ms; /* node 0, the job failed: how long it waits for the other launchers to end */
    /* node 0: the longest kill grace of a node that joined (its hello); the
     * others: the longest of any node, as node 0's WAIT said (0: none yet) */
    uint32_t others_grace_ms;
    struct conn **pmap;  /* the connection behind each polled descriptor; NULL: listener */
    struct conn **conns; /* [nconns]: node 0's pending and joined ones, or up */
    int nconns;
    /* node 0: a listener on each address of the master HOST (it listened on
     * the first alone, and a node whose lookup or route took another, the
     * IPv4 one of a name with an IPv6 one first, was refused until the join
     * deadline, and the job ended though its ranks had met) */
    int lfds[GW_RUN_MAX_LISTEN], nlfd;
    int npending, joined, done;
    unsigned char *state; /* [nnodes] N_* */
    char **hosts;         /* [nnodes] each node's hostname from its hello */
    struct frame end;     /* how the job ended, for nodes that join after that */
    bool have_end, join_reported;
    /* The job ended before every node joined: node 0 stays (until the join
     * deadline, or a signal) to tell the late ones, which would otherwise
     * retry until their own deadline; not where a signal ended the job. */
    bool waiting_late, stop_waiting;
    /* node 0, its ranks done: when it next says which nodes it waits for
     * (a node's gw-run stopped by SIGSTOP held it without a word for good) */
    int64_t done_note_ms;
    /* the other nodes */
    struct conn *up;
    struct addrinfo *ai, *ai_next;
    struct conn pending; /* only .out: frames sent again after a reconnect */
    char host0[256];
    bool welcomed, given_up, final_sent;
    bool port_in_use; /* no --node-rank, and the launcher port was taken here */
    int64_t retry_at_ms;
    int retry_ms;
    int64_t join_note_ms; /* when a node not yet welcomed next says it is still trying */
    /* --max-restarts: node 0 waits for every node's READY, then sends its
     * verdict (RESTART); the others send READY and wait for it.  no_restart:
     * something happened that a restart cannot mend (a signal, a lost node). */
    bool no_restart, ready_sent, verdict_known;
    char no_restart_why[400]; /* node 0: the first thing that set no_restart, said with the verdict */
    /* the last gw__run_net_tick: a gap far over GW_RUN_BEAT_MS since is time
     * this gw-run did not run (stopped, a suspended job), not the others' silence */
    int64_t tick_ms;
    /* a node other than 0, its ranks done and its DONE out, restarts left:
     * it stays until node 0 ends the job (a failure there restarts every
     * node, this one too) */
    bool done_linger;
    long restart_to;           /* the attempt to start next; 0: none */
    int64_t verdict_deadline_ms; /* node 0: READYs due; the others: the verdict due */
    int64_t ready_ms;            /* the others: when this node sent its READY */
    int64_t beat_ms;             /* when the next BEATs go, on every joined connection at once */
};

/* The one instance (gw-run-net.c), called `net` in both files. */
extern struct run_net gw__run_net;
#define net gw__run_net
/* Node 0: tells every other node (but except) how the job ended, keeping it
 * for nodes that join later (gw-run-net.c, used by gw-run-net-end.c too). */
void gw__run_net_announce_end(const struct frame *f, int except);
/* A node other than 0 stops trying to reach node 0. */
void gw__run_net_give_up(void);

/* Node 0: no restart after this attempt, for the reason printf-formatted
 * (the first one given is said with the verdict, and sent with it). */
void gw__run_net_no_restart(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sends m to the other nodes (node 0: all of them; the others: node 0). */
void gw__run_net_report(struct msg *m);
/* gw-run-restart.c, for gw__run_net_finish: false while still waiting. */
bool gw__run_net_decide_restart(int64_t now);
bool gw__run_net_await_verdict(int64_t now);
/* Node 0, a node's READY in: tells it the longest kill grace (WAIT).  A
 * node, node 0's WAIT in: waits for the verdict by that grace. */
void gw__run_net_tell_wait(struct conn *c);
void gw__run_net_heard_wait(uint32_t grace_ms);
/* A kill grace in whole milliseconds, at most GW_RUN_MAX_GRACE_MS. */
enum { GW_RUN_MAX_GRACE_MS = 86400000 };
uint32_t gw__run_grace_ms(double s);

/* gw-run-net.c's pieces the handshake (gw-run-net-hello.c) uses: a frame
 * handler's complaint (false), node 0's WELCOME or REFUSE (which closes the
 * connection), and what a frame means to this node. */
bool gw__run_net_bad(const char *what);
void gw__run_net_answer(struct conn *c, unsigned type, uint32_t node, const char *text, const unsigned char *tok,
                        size_t toklen);
void gw__run_net_apply(const struct msg *m, int from);
/* gw-run-net-hello.c: node 0's reading of a hello (false: a broken frame;
 * a refusal is answered and true); a node's hello on node 0's challenge;
 * whether node 0's welcome proves the token. */
bool gw__run_net_hello0(struct conn *c, const struct msg *h);
bool gw__run_net_up_hello(struct conn *c, const struct msg *ch);
bool gw__run_net_welcome_proven(const struct conn *c, const struct msg *m);

#endif
