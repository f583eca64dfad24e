/*
 * gw-run-restart.c: how the nodes of a multi-node job agree on a restart
 * (--max-restarts), on the launcher control channel of gw-run-net.c.
 *
 * What it is: after a failed attempt, each other node, its ranks gone, says
 * READY (whether it can start again) and waits for node 0's verdict; node 0,
 * its own ranks gone, waits for every READY and sends them all RESTART with
 * the next attempt's number, or 0 (a signal anywhere, a lost node, a node
 * that cannot, none left).  gw-run.c's loop then starts the attempt.  Node 0
 * answers each READY with the longest kill grace of any node (WAIT), by
 * which the node bounds its wait for the verdict.
 *
 * Also the tests' hold between two attempts (GW_RUN_TEST_RESTART_DELAY_MS).
 *
 * And why an attempt that ended cannot start again (gw__run_restart_refusal,
 * which single-node restarts ask too).
 *
 * What it is not: the channel itself (joining, frames, failures, signals:
 * gw-run-net.c) nor the single-node restart loop (gw-run.c).
 */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gw-run.h"
#include "gw-run-net.h"

/* Why this node's part of the attempt that ended cannot start again, or NULL
 * if it can: a failure, no signal to gw-run, no process gw-run gave up on, a
 * program that could be started, restarts left.  "" where nothing needs
 * saying (success, a signal with no restart due anyway).  Single-node and multi-node restarts both ask. */
static const char no_restarts_left[] = "no restarts left";

const char *gw__run_restart_refusal(void)
{
    static char stopped[64];
    if (!gw__run.have_failure)
        return "";
    if (gw__run.got_signal) { /* said where a restart was due (it came as the failed attempt ended: unsaid) */
        if (!gw__run.may_restart || gw__run.not_started)
            return "";
        snprintf(stopped, sizeof stopped, "stopped by %s", gw__run_signal_name(gw__run.got_signal));
        return stopped;
    }
    if (gw__run.alive > 0 || gw__run_waiting_for_strays())
        return "processes of the failed attempt are still there";
    if (gw__run.not_started)
        return "the program could not be started";
    if (!gw__run.may_restart)
        return no_restarts_left;
    return NULL;
}

/* The sentence for why (NULL or "": none) into buf ("" then). */
static void no_restart_text(char *buf, size_t len, const char *why, long max_restarts)
{
    if (!why || !*why)
        buf[0] = '\0';
    else if (why == no_restarts_left)
        snprintf(buf, len, "the job failed again; no restarts left (%ld used)", max_restarts);
    else
        snprintf(buf, len, "not restarting the job: %s", why);
}

void gw__run_say_no_restart(const char *why, long max_restarts)
{
    char text[600];
    no_restart_text(text, sizeof text, why, max_restarts);
    if (text[0])
        gw__run_say("gw-run: %s\n", text);
}

/* How long node 0 waits for every node's READY, and a node for the verdict:
 * their teardowns take up to the grace, SIGKILL and the give-up after it.
 * Every node counts the longest grace of any node: node 0 from the hellos,
 * the others from node 0's WAIT, its answer to their READY (before, they
 * counted their own: one with a far shorter grace than another's gave up
 * on the verdict while node 0 still waited for that other node, and ended
 * while the rest of the job started again).  GW_RUN_TEST_VERDICT_SLACK_MS
 * (tests; 0 to an hour) replaces the 30 s added. */
static int64_t verdict_wait_ms(void)
{
    const int64_t own = (int64_t)(gw__run.kill_grace_s * 1000.0);
    const int64_t grace = (int64_t)net.others_grace_ms > own ? net.others_grace_ms : own;
    const char *hook = getenv("GW_RUN_TEST_VERDICT_SLACK_MS");
    const long slack = hook && *hook ? atol(hook) : 30000;
    return 3 * grace + (slack < 0 ? 0 : slack > 3600000 ? 3600000 : slack);
}

void gw__run_net_tell_wait(struct conn *c)
{
    const uint32_t own = gw__run_grace_ms(gw__run.kill_grace_s);
    struct msg m = {.type = F_WAIT, .v = {net.others_grace_ms > own ? net.others_grace_ms : own}};
    struct frame f;
    gw__run_pack(&f, &m);
    gw__run_conn_send(c, &f);
}

void gw__run_net_heard_wait(uint32_t grace_ms)
{
    if (grace_ms > net.others_grace_ms)
        net.others_grace_ms = grace_ms;
    if (net.ready_sent && !net.verdict_known)
        net.verdict_deadline_ms = net.ready_ms + 2 * verdict_wait_ms();
}

/* Node 0, its ranks gone after a failure, with --max-restarts: waits for every
 * other node's READY (false meanwhile), then tells them all whether the job
 * starts again (RESTART with the next attempt, or 0). */
bool gw__run_net_decide_restart(int64_t now)
{
    const char *why = gw__run_restart_refusal();
    const bool can = !why && !net.no_restart;
    int waiting = 0, first = 0;
    for (int n = 1; n < net.cfg.nnodes; n++)
        if (net.state[n] != N_READY && !waiting++)
            first = n;
    char text[600] = ""; /* said here, and sent with the verdict: the other nodes said nothing of why */
    if (can && waiting) {
        if (!net.verdict_deadline_ms)
            net.verdict_deadline_ms = now + verdict_wait_ms();
        if (now < net.verdict_deadline_ms)
            return false;
        snprintf(text, sizeof text, "not restarting the job: node %d%s did not say within %.0f s that its ranks ended",
                 first, waiting > 1 ? " and others" : "", (double)verdict_wait_ms() / 1000.0);
    } else if (why && *why) {
        no_restart_text(text, sizeof text, why, net.cfg.max_restarts);
    } else if (!can && !gw__run.got_signal) {
        snprintf(text, sizeof text, "not restarting the job: %s",
                 net.no_restart_why[0] ? net.no_restart_why : "a node was stopped, lost or cannot start again");
    }
    if (text[0])
        gw__run_say("gw-run: %s\n", text);
    net.verdict_known = true;
    net.verdict_deadline_ms = 0;
    net.restart_to = can && !waiting ? gw__run.attempt + 1 : 0;
    struct msg m = {.type = F_RESTART, .v = {(uint32_t)net.restart_to}};
    if (!net.restart_to)
        snprintf(m.s, sizeof m.s, "%s", text);
    struct frame f;
    gw__run_pack(&f, &m);
    for (int i = 0; i < net.nconns; i++)
        if (net.conns[i]->node > 0)
            gw__run_conn_send(net.conns[i], &f);
    return true;
}

/* Another node, its ranks gone after a failure, with --max-restarts: says so
 * (READY) and waits for node 0's verdict (false meanwhile). */
bool gw__run_net_await_verdict(int64_t now)
{
    if (!net.ready_sent) {
        const char *why = gw__run_restart_refusal();
        if (why != no_restarts_left) /* (node 0 says that one with its verdict: every node has the same count) */
            gw__run_say_no_restart(why, net.cfg.max_restarts);
        struct msg m = {.type = F_READY, .v = {(uint32_t)net.cfg.node, why == NULL}};
        gw__run_net_report(&m);
        net.ready_sent = true;
        net.ready_ms = now;
        net.verdict_deadline_ms = now + 2 * verdict_wait_ms();
    }
    if (net.verdict_known) {
        net.verdict_deadline_ms = 0;
        return true;
    }
    if (now < net.verdict_deadline_ms)
        return false;
    net.verdict_deadline_ms = 0;
    gw__run_say("gw-run: node %d: no word from node 0 at %s on restarting the job; ending this node\n",
                net.cfg.node, net.where);
    net.verdict_known = true;
    net.restart_to = 0;
    return true;
}

long gw__run_net_restart(void)
{
    return net.on && !net.given_up ? net.restart_to : 0;
}

void gw__run_net_reset(void)
{
    if (!net.on)
        return;
    net.done = 0;
    net.have_end = false;
    net.flush_ms = net.linger_ms = net.verdict_deadline_ms = net.others_end_ms = net.done_note_ms = 0;
    net.final_sent = net.ready_sent = net.verdict_known = net.no_restart = net.done_linger = false;
    net.no_restart_why[0] = '\0';
    net.restart_to = 0;
    /* Node 0: every node whose connection is still there takes part again; a
     * node that left after the verdict leaves this attempt unable to run
     * (its ranks' rendezvous fails), and no restart after it. */
    for (int n = 1; n < net.cfg.nnodes && net.state; n++) {
        bool connected = false;
        for (int i = 0; i < net.nconns; i++)
            connected = connected || (net.conns[i]->node == n && net.conns[i]->fd >= 0);
        net.state[n] = connected ? N_JOINED : N_ENDED;
        if (!connected)
            gw__run_net_no_restart("node %d (host %s) left after the verdict", n, net.hosts[n] ? net.hosts[n] : "?");
    }
}

/* Tests: GW_RUN_TEST_RESTART_DELAY_MS holds gw-run between two attempts, its
 * signals blocked, up to that long: said when it begins, over as soon as a
 * signal it handles is pending (a test signals once it read the line, instead
 * of racing the hold with a sleep). */
void gw__run_test_restart_hold(void)
{
    const char *hook = getenv("GW_RUN_TEST_RESTART_DELAY_MS");
    if (!hook || !*hook)
        return;
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    gw__run_say("gw-run: test hook: holding the restart (signals blocked) up to %s ms\n", hook);
    for (long ms = 0; ms < atol(hook); ms += 10) {
        sigset_t pend;
        if (sigpending(&pend) == 0)
            for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
                if (sigismember(&pend, sigs[i]))
                    return;
        usleep(10000);
    }
}
