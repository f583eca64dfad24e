/*
 * gw-run-net-end.c: what a node of a multi-node job tells the others as
 * things happen and as its job ends (gw-run-net.c is the channel and what
 * the frames mean): reports of rank failures, launch failures, signals and
 * passed signals, and the end of the channel: flushing what is still queued,
 * waiting for node 0's verdict, closing.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/types.h>

#include "gw-run.h"
#include "gw-run-net.h"

/* Tells the other nodes about this one (m->s: this host unless the caller
 * set a message): node 0 tells them all, the others tell node 0, keeping the frame until node 0 welcomed them, so that a
 * reconnect sends it again. */
void gw__run_net_report(struct msg *m)
{
    struct frame f;
    if (!m->s[0])
        snprintf(m->s, sizeof m->s, "%s", net.myhost);
    gw__run_pack(&f, m);
    if (net.cfg.node == 0) {
        gw__run_net_announce_end(&f, -1);
        return;
    }
    if (!net.welcomed)
        gw__run_out_add(&net.pending, f.b, f.n);
    /* Not before the hello (node 0 drops a connection whose first frame is
     * another): up_hello sends the pending frames after it. */
    if (!net.up->connecting && (net.welcomed || net.up->challenged))
        gw__run_conn_send(net.up, &f);
}

/* Whether every frame went out, or we waited long enough for that. */
static bool flushed(int64_t now)
{
    bool empty = true; /* a closed connection has nothing to send */
    for (int i = 0; i < net.nconns; i++)
        empty = empty && net.conns[i]->outlen == 0;
    if (empty)
        return true;
    if (!net.flush_ms)
        net.flush_ms = now + FLUSH_MS;
    return now >= net.flush_ms;
}

/* Node 0, the job over: whether to stay for nodes that have not joined yet,
 * to tell them how it ended (their hello is answered with it). */
static bool late_to_tell(int64_t now)
{
    int missing = 0;
    for (int n = 1; n < net.cfg.nnodes; n++)
        missing += net.state[n] == N_ABSENT;
    if (!net.have_end || net.join_reported || now >= net.join_deadline_ms || missing == 0)
        return false;
    if (net.stop_waiting) {
        /* A signal here ended the job or the wait (^C, a scheduler's or
         * timeout's SIGTERM): one signal stops gw-run, not two, and the
         * late nodes fail at their own join deadline. */
        if (!net.waiting_late)
            gw__run_say("gw-run: %d node%s not joined yet; not waiting to tell %s the job ended (stopped by a "
                        "signal)\n", missing, missing == 1 ? " has" : "s have", missing == 1 ? "it" : "them");
        net.waiting_late = true;
        return false;
    }
    if (!net.waiting_late) {
        net.waiting_late = true;
        gw__run_say("gw-run: %d node%s not joined yet; waiting up to %.0f s (GW_RUN_JOIN_TIMEOUT) "
                    "to tell %s the job ended (interrupt to stop waiting)\n",
                    missing, missing == 1 ? " has" : "s have",
                    (double)(net.join_deadline_ms - now) / 1000.0, missing == 1 ? "it" : "them");
    }
    return true;
}

/* Node 0, the job failed and its own ranks are gone: whether to stay until
 * the other nodes' launchers have ended (closed their connections), so that
 * news still on its way is heard.  A crash on another node whose news comes
 * after a local rank exited of it (the peers of a crashed rank exit 1 within
 * milliseconds) is then still taken as the job's failure and named
 * (gw__run_refail), and passed on to the nodes still there.  Bounded by the
 * longest kill grace of any node (their teardown's own bound: each node's
 * hello says its own) and 5 s more; node 0's own bounded it before, and a
 * node given a longer GW_RUN_KILL_GRACE was left behind, its news lost. */
static bool others_ending(int64_t now)
{
    if (!gw__run.have_failure || gw__run.got_signal || net.restart_to)
        return false; /* a restart: the other nodes stay too */
    int open = 0;
    for (int i = 0; i < net.nconns; i++)
        open += net.conns[i]->fd >= 0 && net.conns[i]->node > 0;
    if (open == 0)
        return false;
    const int64_t own = (int64_t)(gw__run.kill_grace_s * 1000.0), theirs = net.others_grace_ms;
    if (!net.others_end_ms)
        net.others_end_ms = now + (own > theirs ? own : theirs) + 5000;
    return now < net.others_end_ms;
}

/* A wait after this node's ranks are done is said after 10 s, and every
 * minute after: whether that note is due now (its first deadline is set by
 * the first call; the next is set here). */
static bool done_note_due(int64_t now)
{
    if (!net.done_note_ms) {
        const char *t = getenv("GW_RUN_TEST_DONE_NOTE_MS"); /* tests: sooner */
        net.done_note_ms = now + (t && *t ? atoi(t) : 10000);
        return false;
    }
    if (now < net.done_note_ms)
        return false;
    net.done_note_ms = now + 60000;
    return true;
}

/* Node 0, its own ranks done and the job not failed: after 10 s without
 * every other node's DONE, and every minute after, it names the nodes it
 * waits for.  Their ranks may still be at work (rank 0's finished first);
 * their gw-run may be stopped (SIGSTOP, a hung machine), which its kernel's
 * answers to keepalive do not show: the wait was silent, and endless. */
static void note_waiting(int64_t now)
{
    if (!done_note_due(now))
        return;
    char list[600] = "";
    int k = 0;
    for (int n = 1; n < net.cfg.nnodes; n++) {
        if (net.state[n] == N_DONE)
            continue;
        size_t used = strlen(list);
        if (k++ < 4)
            snprintf(list + used, sizeof list - used, "%snode %d (host %.100s)", k > 1 ? ", " : "", n,
                     net.hosts[n] ? net.hosts[n] : "?");
    }
    if (k > 4)
        snprintf(list + strlen(list), sizeof list - strlen(list), " and %d more", k - 4);
    gw__run_say("gw-run: this node's ranks are done; waiting for %s to report %s ranks' end (still at work, or "
                "%s gw-run stopped: SIGSTOP, a hung machine; interrupt to stop waiting)\n", list,
                k == 1 ? "its" : "their", k == 1 ? "its" : "their");
}

/* A node other than 0 staying after its DONE: after 10 s, and every minute
 * after, it says why (it was silent, as if hung). */
static void linger_note(int64_t now)
{
    if (!done_note_due(now))
        return;
    gw__run_say("gw-run: node %d: this node's ranks are done; staying until node 0 (host %s) ends the job, so that a "
                "failure elsewhere starts every node again (--max-restarts; interrupt to leave: the job goes on "
                "without this node, and cannot start again)\n", net.cfg.node, net.host0);
}

/* Called once the local ranks are all gone: whether gw-run may exit now. */
bool gw__run_net_finish(void)
{
    if (!net.on)
        return true;
    gw__run_cause_send(); /* before READY or DONE, and before the links close */
    int64_t now = gw__run_now_ms();
    bool stopping = gw__run_stopping();
    if (net.cfg.node != 0 && stopping)
        net.done_note_ms = 0; /* it no longer stays after a DONE (a deadline passed would spin the loop) */
    /* A failed attempt with restarts allowed: the nodes agree on the next. */
    if (stopping && gw__run.have_failure && net.cfg.max_restarts > 0 && !net.verdict_known &&
        (net.cfg.node == 0 ? !gw__run_net_decide_restart(now)
                            : net.welcomed && !net.given_up && !gw__run_net_await_verdict(now)))
        return false;
    if (net.cfg.node == 0) { /* success is every node's DONE; a failure was told */
        if (stopping && (late_to_tell(now) || others_ending(now)))
            return false;
        if (!stopping && net.done < net.cfg.nnodes - 1)
            note_waiting(now);
        else
            net.done_note_ms = 0; /* (a deadline passed would spin the loop) */
        return (stopping || net.done == net.cfg.nnodes - 1) && flushed(now);
    }
    if (net.given_up)
        return true;
    if (!net.welcomed) {
        if (!stopping)
            return false; /* keep trying until the join deadline */
        /* This node failed or was stopped before node 0 answered: try a
         * little longer to tell it, but do not hold the user for minutes. */
        if (!net.linger_ms)
            net.linger_ms = now + LINGER_MS;
        if (now < net.linger_ms)
            return false;
        gw__run_say("gw-run: node %d: could not tell node 0 at %s that this node stopped\n",
                net.cfg.node, net.where);
        gw__run_net_give_up();
        return true;
    }
    struct msg m = {.type = F_DONE, .v = {(uint32_t)net.cfg.node}};
    if (!net.final_sent && !stopping)
        gw__run_net_report(&m);
    net.final_sent = true;
    /* Its ranks done, restarts left: it stays until node 0 ends the job
     * (closes the connection), so that a failure elsewhere restarts this
     * node too; it left at once, and node 0, without it, could not restart
     * (whether a job restarted depended on which node's ranks finished
     * first: a helper's probe).  Node 0's silence is watched meanwhile. */
    net.done_linger = !stopping && net.cfg.max_restarts > 0 && gw__run.may_restart;
    if (!net.done_linger)
        return flushed(now);
    net.flush_ms = 0; /* (a deadline passed spun the loop: the DONE goes out as the link takes it) */
    linger_note(now);
    return false;
}

/* A local rank failed (the first failure, not after a signal). */
void gw__run_net_rank_failed(int global, bool signaled, int value, int recorded)
{
    struct msg m = {.type = F_FAIL,
                    .v = {(uint32_t)global, (uint32_t)net.cfg.node, signaled, (uint32_t)value, (uint32_t)recorded}};
    /* Tests: the news is late, as over a slow network (the other nodes'
     * own ranks may fail first, of it). */
    const char *hold = getenv("GW_RUN_TEST_FAIL_HOLD_MS");
    if (hold && *hold && net.on)
        usleep((useconds_t)atoi(hold) * 1000u);
    if (net.on)
        gw__run_net_report(&m);
}

/* This node's launcher failed on its own (it could not start every rank):
 * the other nodes stop with `text` as the reason, not a lost node. */
void gw__run_net_launch_failed(int code, const char *text)
{
    struct msg m = {.type = F_ABORT, .v = {(uint32_t)code}};
    snprintf(m.s, sizeof m.s, "gw-run: node %d (host %.255s): %.700s", net.cfg.node, net.myhost,
             text);
    if (net.on)
        gw__run_net_report(&m);
}

/* SIGUSR1 or SIGUSR2 reached this gw-run: for every node's ranks. */
void gw__run_net_pass(int sig)
{
    if (!net.on)
        return;
    struct msg m = {.type = F_PASS, .v = {(uint32_t)net.cfg.node, (uint32_t)sig}};
    snprintf(m.s, sizeof m.s, "%s", net.myhost);
    struct frame f;
    gw__run_pack(&f, &m);
    if (net.cfg.node == 0) {
        for (int i = 0; i < net.nconns; i++)
            if (net.conns[i]->node > 0 && net.conns[i]->fd >= 0)
                gw__run_conn_send(net.conns[i], &f);
    } else if (net.welcomed && !net.up->connecting) {
        gw__run_conn_send(net.up, &f);
    }
}

/* SIGINT, SIGTERM, SIGHUP or SIGQUIT reached this gw-run. */
void gw__run_net_signal(int sig)
{
    if (net.done_linger) { /* its ranks are done: it leaves, and the job goes on without it */
        net.done_linger = false;
        gw__run_say("gw-run: node %d: leaving; its ranks are done, the job goes on without this node (and cannot "
                    "start again)\n", net.cfg.node);
        return;
    }
    struct msg m = {.type = F_STOP, .v = {(uint32_t)net.cfg.node, (uint32_t)sig}};
    net.stop_waiting = true; /* a signal before or while node 0 waits for late nodes: it does not wait */
    if (net.on)
        gw__run_net_report(&m);
}

/* What is still queued (a STOP for a signal between attempts) leaves before
 * the connections close, within FLUSH_MS. */
static void flush_all(void)
{
    const int64_t until = gw__run_now_ms() + FLUSH_MS;
    for (int i = 0; i < net.nconns; i++) {
        struct conn *c = net.conns[i];
        while (c->fd >= 0 && !c->connecting && c->outlen && gw__run_conn_flush(c) && c->outlen) {
            int64_t left = until - gw__run_now_ms();
            if (left <= 0)
                break;
            struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
            poll(&pf, 1, (int)left);
        }
    }
}

void gw__run_net_close(void)
{
    if (net.on)
        flush_all();
    for (int i = 0; i < net.nconns; i++)
        gw__run_conn_close(net.conns[i]);
    for (int l = 0; l < net.nlfd; l++)
        close(net.lfds[l]);
    net.nlfd = 0;
}
