/*
 * gw-run-net.c: the launcher control channel that ties together the gw-run
 * processes of a multi-node job.
 *
 * What it is: one TCP connection from each other node's gw-run to node 0's,
 * on the launcher port (the master port + 1 unless --launcher-port says
 * otherwise). Node 0 listens on the master address only and admits a node
 * once it said hello with the job token and the same --nnodes and -n. From
 * then on the nodes report rank failures, SIGINT/SIGTERM/SIGHUP and success to node
 * 0, which passes failures and signals on to every other node, so that a
 * failure anywhere stops the whole job on every machine. Node 0 also fails
 * the job when a node does not join in time or its launcher goes away.
 *
 * What it is not: it starts nothing on other machines (one gw-run per node is
 * still started by ssh, Slurm or by hand) and carries no rank traffic: the
 * ranks meet in the library's own rendezvous and start without waiting for
 * the nodes to join. Nothing here blocks, name resolution before the ranks
 * start aside: the sockets are non-blocking and gw-run.c's poll loop drives
 * them. With one node none of this exists.
 *
 * The frames themselves (their layouts, encoding, buffering) are in
 * gw-run-io.c; this file decides what they mean.  The handshake (challenge,
 * hello, welcome or refusal) is in gw-run-net-hello.c.  What a node tells the
 * others as its job ends (reports, the last flush, the verdict) is in
 * gw-run-net-end.c.
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "gw-run.h"
#include "gw-run-net.h"
#include "hmac.h"

struct run_net gw__run_net;

static const char *why; /* what a frame handler found wrong */

bool gw__run_net_bad(const char *what)
{
    why = what;
    return false;
}

/* "node N" for messages, or "this node" before node 0 numbered it (a node
 * numbered by arrival, before its welcome). */
static const char *me(void)
{
    static char buf[32];
    if (net.cfg.node < 0)
        return "this node";
    snprintf(buf, sizeof buf, "node %d", net.cfg.node);
    return buf;
}

/* Range checks that do not depend on who sent the frame. */
static bool sane(const struct msg *m)
{
    uint32_t nn = (uint32_t)net.cfg.nnodes, sig = m->v[1];
    switch (m->type) {
    case F_FAIL:
        return m->v[0] < nn * (uint32_t)net.cfg.nproc && m->v[1] < nn && m->v[2] <= 1 &&
               m->v[3] >= 1 && m->v[3] <= (m->v[2] ? 64u : 255u) && m->v[4] <= GW_RUN_CAUSE_CONSEQUENCE;
    case F_STOP:
        return m->v[0] < nn && (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT);
    case F_PASS:
        return m->v[0] < nn && (sig == SIGUSR1 || sig == SIGUSR2);
    case F_LOST:
        return m->v[0] < nn && m->v[1] <= 1;
    case F_DONE:
        return m->v[0] < nn;
    case F_READY:
        return m->v[0] < nn && m->v[1] <= 1;
    case F_ABORT:
        return m->v[0] >= 1;
    case F_CAUSE:
        return m->v[0] < nn * (uint32_t)net.cfg.nproc && m->v[1] < nn && m->v[4] < 1000000u;
    case F_WAIT:
        return m->v[0] <= GW_RUN_MAX_GRACE_MS;
    default:
        return true;
    }
}

static void fmt_addr(char *dst, size_t cap, const char *host, const char *port)
{
    snprintf(dst, cap, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
}

/* ---- what every node does with news from the others ---- */

void gw__run_net_no_restart(const char *fmt, ...)
{
    net.no_restart = true;
    if (net.no_restart_why[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(net.no_restart_why, sizeof net.no_restart_why, fmt, ap);
    va_end(ap);
}

/* A LOST frame's how (v[1]) in words. */
static const char *lost_how(uint32_t how)
{
    return how ? "its gw-run went silent while its machine answered (stopped or hung: GW_RUN_HEARTBEAT_TIMEOUT)"
               : "its launcher exited or the network failed";
}

/* A failed attempt whose restart is not settled yet (--max-restarts). */
static bool verdict_pending(void)
{
    return net.cfg.max_restarts > 0 && gw__run.have_failure && !gw__run.got_signal && !net.verdict_known;
}

/* Node 0: tells every other node (but except) how the job ended, keeping it
 * for nodes that join later. */
void gw__run_net_announce_end(const struct frame *f, int except)
{
    for (int i = 0; i < net.nconns; i++)
        if (net.conns[i]->node > 0 && net.conns[i]->node != except)
            gw__run_conn_send(net.conns[i], f);
    if (!net.have_end) {
        net.end = *f;
        net.have_end = true;
    }
}

/* A FAIL, LOST, ABORT or STOP that came from node `from`: acted on here as a
 * local failure or signal would be, and passed on by node 0. Only the first
 * failure counts (later ones are consequences of the teardown), unless a
 * later one says more of the cause: a rank killed by a signal after one that
 * exited (gw__run_refail; node 0 passes such a correction on too). */
void gw__run_net_apply(const struct msg *m, int from)
{
    /* a signal, a lost node (a node's launch failure restarts, as on node 0) */
    if (m->type == F_STOP)
        gw__run_net_no_restart("node %u (host %s) received %s", m->v[0], m->s, gw__run_signal_name((int)m->v[1]));
    else if (m->type == F_LOST)
        gw__run_net_no_restart("lost node %u (host %s): %s", m->v[0], m->s, lost_how(m->v[1]));
    /* Local ranks that ended before this news was read (their SIGCHLD came in
     * the same wake-up) are judged first, as gw__run_fail does: a crash here
     * is then this node's failure, reported as such, and the news only
     * replaces it if it says more of the cause (gw__run_refail below). */
    if (!gw__run_stopping())
        gw__run_reap();
    const bool again = m->type != F_STOP && gw__run_stopping();
    /* An ABORT that changes no verdict is still said: its reason may be why
     * this node ends as it does (another node gave this one up, say).  A
     * lost node then is said by node 0's verdict on restarting (the reason
     * kept by gw__run_net_no_restart), or by up_ended. */
    if (again && m->type == F_ABORT)
        gw__run_say("%s\n", m->s);
    if (again && (m->type != F_FAIL ||
                  !gw__run_refail(m->v[2] ? 128 + (int)m->v[3] : (int)m->v[3], m->v[2] ? 2 : 1, net.cfg.node != 0)))
        return;
    int code = 1;
    if (m->type == F_FAIL && m->v[2]) {
        gw__run_say("gw-run: rank %u on node %u (host %s) was killed by signal %u (%s)\n",
                m->v[0], m->v[1], m->s, m->v[3], gw__run_signal_name((int)m->v[3]));
        code = 128 + (int)m->v[3];
    } else if (m->type == F_FAIL) {
        gw__run_say("gw-run: rank %u on node %u (host %s) exited with code %u\n", m->v[0],
                m->v[1], m->s, m->v[3]);
        code = (int)m->v[3];
    } else if (m->type == F_LOST) {
        gw__run_say("gw-run: lost node %u (host %s): %s\n", m->v[0], m->s, lost_how(m->v[1]));
    } else if (m->type == F_ABORT) {
        gw__run_say("%s\n", m->s);
        code = (int)m->v[0];
    } else {
        gw__run_say("gw-run: node %u (host %s) received %s; stopping %s\n", m->v[0], m->s,
                gw__run_signal_name((int)m->v[1]),
                net.cfg.node == 0 ? "the job" : "this node too");
    }
    if (m->type != F_STOP)
        gw__run_cause_named(m->type == F_FAIL ? (int)m->v[0] : -1, m->type == F_FAIL ? (int)m->v[4] : 0);
    if (m->type == F_FAIL && !again)
        gw__run_say_done_before(-1); /* this node's ranks that ended early, if they are why */
    if (net.cfg.node == 0) {
        struct frame f;
        gw__run_pack(&f, m);
        gw__run_net_announce_end(&f, from);
        if (again)
            net.end = f; /* the corrected verdict, for nodes that join later */
    }
    if (again)
        return;
    if (m->type == F_STOP) {
        net.stop_waiting = true; /* a signal ended the job (on another node): node 0 does not wait for late nodes */
        gw__run_remote_signal((int)m->v[1]);
    }
    else
        gw__run_fail(code);
}

/* A PASS from node `from`: node 0 passes it on to the other nodes; every
 * node's ranks get the signal, and the job goes on. */
static void pass_on(const struct msg *m, int from)
{
    if (net.cfg.node == 0) {
        struct frame f;
        gw__run_pack(&f, m);
        for (int i = 0; i < net.nconns; i++)
            if (net.conns[i]->node > 0 && net.conns[i]->node != from && net.conns[i]->fd >= 0)
                gw__run_conn_send(net.conns[i], &f);
    }
    gw__run_pass_signal((int)m->v[1], (int)m->v[0]);
}

/* ---- node 0 ---- */

/* WELCOME (for node `node`), or REFUSE and the end of the connection. */
void gw__run_net_answer(struct conn *c, unsigned type, uint32_t node, const char *text, const unsigned char *tok,
                   size_t toklen)
{
    struct msg m = {.type = type, .v = {node}, .tok = tok, .toklen = toklen};
    struct frame f;
    snprintf(m.s, sizeof m.s, "%s", text);
    gw__run_pack(&f, &m);
    gw__run_conn_send(c, &f);
    if (type == F_REFUSE) {
        gw__run_conn_flush(c);
        gw__run_conn_close(c);
    }
}

static bool frame0(struct conn *c, const struct msg *m)
{
    if (!sane(m))
        return gw__run_net_bad("field out of range");
    if (c->node < 0)
        return m->type == F_HELLO ? gw__run_net_hello0(c, m) : gw__run_net_bad("expected a hello");
    int n = c->node;
    if (m->type == F_BEAT)
        return true; /* (heard_ms is set by the read) */
    if (m->type == F_READY) {
        if (m->v[0] != (uint32_t)n || net.cfg.max_restarts == 0)
            return gw__run_net_bad("unexpected frame from a joined node");
        if (net.state[n] == N_DONE) /* its ranks ended well; another node's failed after */
            net.done--;
        if (net.state[n] == N_JOINED || net.state[n] == N_ENDED || net.state[n] == N_DONE)
            net.state[n] = m->v[1] ? N_READY : N_ENDED;
        if (!m->v[1])
            gw__run_net_no_restart("node %d (host %s) cannot start its ranks again (it says why)", n,
                                   net.hosts[n] ? net.hosts[n] : "?");
        gw__run_net_tell_wait(c);
        return true;
    }
    if (m->type == F_PASS) {
        if (m->v[0] != (uint32_t)n)
            return gw__run_net_bad("unexpected frame from a joined node");
        pass_on(m, n);
        return true;
    }
    if (m->type == F_CAUSE) { /* one of its ranks' own failure (gw-run-cause.c) */
        if (m->v[1] != (uint32_t)n || m->v[0] / (uint32_t)net.cfg.nproc != (uint32_t)n)
            return gw__run_net_bad("unexpected frame from a joined node");
        gw__run_cause_heard(m, net.hosts[n]);
        return true;
    }
    if (m->type == F_ABORT) {
        /* Its launcher failed (it could not start its ranks): the message says how. */
    } else if ((m->type != F_FAIL && m->type != F_STOP && m->type != F_DONE) ||
               m->v[m->type == F_FAIL ? 1 : 0] != (uint32_t)n) {
        return gw__run_net_bad("unexpected frame from a joined node");
    }
    if (net.state[n] == N_JOINED) {
        net.state[n] = m->type == F_DONE ? N_DONE : N_ENDED;
        net.done += m->type == F_DONE;
    }
    if (m->type != F_DONE)
        gw__run_net_apply(m, n);
    return true;
}

/* A connection ended: after EOF or an error (badly == NULL) or a bad frame,
 * or (silent) its gw-run's heartbeat stopped. */
static void conn0_ended(struct conn *c, const char *badly, bool silent)
{
    int n = c->node;
    if (badly)
        gw__run_say("gw-run: closing the launcher connection from %s%s: %s\n", c->peer,
                n > 0 ? " (a joined node)" : "", badly);
    gw__run_conn_close(c);
    if (n > 0 && net.cfg.max_restarts > 0) /* the job cannot start again without that node */
        gw__run_net_no_restart("node %d (host %s): %s", n, net.hosts[n] ? net.hosts[n] : "?",
                               badly ? badly : "its launcher connection ended (it exited, or the network failed)");
    if (n > 0 && net.state[n] == N_READY)
        net.state[n] = N_ENDED;
    if (n <= 0 || net.state[n] != N_JOINED)
        return; /* a stranger, or a node that already said how it ended */
    net.state[n] = N_ENDED;
    struct msg m = {.type = F_LOST, .v = {(uint32_t)n, silent}};
    snprintf(m.s, sizeof m.s, "%s", net.hosts[n]);
    gw__run_net_apply(&m, n); /* nothing if the job is ending anyway and nodes leave as they stop */
}

/* Every waiting place held by a connection that has not said hello: the
 * oldest goes once it has waited PUSH_AGE_MS (a node says hello within
 * milliseconds of its challenge, a retransmission later; with no age, 100
 * nodes starting at once pushed out one another's hellos), and the next pass
 * accepts the connection waiting in the backlog (the array's room frees at
 * compact).  The listener was not polled while the places were full, and
 * strangers that kept them so kept every node out. */
#define PUSH_AGE_MS 1000
static struct conn *oldest_pending(void)
{
    struct conn *old = NULL;
    for (int i = 0; i < net.nconns; i++) {
        struct conn *c = net.conns[i];
        if (c->fd >= 0 && c->node < 0 && (!old || c->accepted_ms < old->accepted_ms))
            old = c;
    }
    return old;
}

static void evict_oldest(void)
{
    struct conn *old = oldest_pending();
    if (!old || gw__run_now_ms() - old->accepted_ms < PUSH_AGE_MS)
        return;
    static bool said;
    if (!said)
        gw__run_say("gw-run: all %d places for launcher connections that have not said hello are "
                    "held: closing the oldest for each new one (first the one from %s)\n",
                    MAX_PENDING, old->peer);
    said = true;
    gw__run_conn_close(old);
}

static void accept_all(void)
{
    if (net.npending >= MAX_PENDING) {
        evict_oldest();
        return;
    }
    while (net.npending < MAX_PENDING) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = -1;
        for (int l = 0; l < net.nlfd && fd < 0; l++)
            while ((fd = accept4(net.lfds[l], (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC)) < 0 &&
                   errno == EINTR)
                len = sizeof ss;
        if (fd < 0)
            return; /* EAGAIN on every listener, or a peer that gave up already */
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            return;
        }
        c->fd = fd;
        c->node = -1;
        c->accepted_ms = gw__run_now_ms();
        c->deadline_ms = c->accepted_ms + HELLO_TIMEOUT_MS;
        char h[NI_MAXHOST], s[NI_MAXSERV];
        if (getnameinfo((struct sockaddr *)&ss, len, h, sizeof h, s, sizeof s,
                        NI_NUMERICHOST | NI_NUMERICSERV) == 0)
            fmt_addr(c->peer, sizeof c->peer, h, s);
        else
            snprintf(c->peer, sizeof c->peer, "an unknown address");
        gw__run_tune_socket(fd);
        net.conns[net.nconns++] = c; /* room: joined nodes + MAX_PENDING */
        net.npending++;
        if (!gw__run_random(c->nonce, sizeof c->nonce)) {
            gw__run_say("gw-run: closing the launcher connection from %s: no random bytes for its "
                        "challenge: %s\n", c->peer, strerror(errno));
            gw__run_conn_close(c);
            continue;
        }
        struct msg m = {.type = F_CHALLENGE, .v = {GW_RUN_HELLO_MAGIC}, .tok = c->nonce,
                        .toklen = sizeof c->nonce};
        struct frame f;
        gw__run_pack(&f, &m);
        gw__run_conn_send(c, &f);
    }
}

static void compact(void)
{
    int k = 0;
    for (int i = 0; i < net.nconns; i++) {
        struct conn *c = net.conns[i];
        if (c->fd >= 0) {
            net.conns[k++] = c;
            continue;
        }
        if (c->node < 0)
            net.npending--;
        free(c->out);
        free(c);
    }
    net.nconns = k;
}

static void report_missing(void)
{
    char list[256];
    size_t len = 0;
    int shown = 0, missing = 0;
    for (int n = 1; n < net.cfg.nnodes; n++)
        if (net.state[n] == N_ABSENT && ++missing <= 16)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", shown++ ? ", " : "", n);
    if (missing > shown)
        snprintf(list + len, sizeof list - len, " and %d more", missing - shown);
    struct msg m = {.type = F_ABORT, .v = {1}};
    snprintf(m.s, sizeof m.s, "gw-run: node(s) %s did not join within %g s (launcher port %s)",
             list, net.cfg.join_timeout_s, net.where);
    gw__run_net_no_restart("%s", m.s + strlen("gw-run: "));
    gw__run_net_apply(&m, -1);
}

static int resolve(void)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    char port[16];
    snprintf(port, sizeof port, "%d", net.cfg.lport);
    int rc = getaddrinfo(net.cfg.host, port, &hints, &net.ai);
    if (rc != 0)
        net.ai = NULL;
    return rc;
}

/* Binds the master HOST's own address, not every interface: the launcher
 * port is only for the job's nodes, which reach node 0 there anyway.
 * Returns 0, or the errno of the last address tried. */
/* A listener on every address of the master HOST (as the rendezvous' own,
 * comm/bootstrap.c root_listen); the last failure's errno when none. */
static int bind_launcher(void)
{
    int err = 0, one = 1;
    for (struct addrinfo *a = net.ai; a && net.nlfd < GW_RUN_MAX_LISTEN; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        /* its own address alone: [::] beside 0.0.0.0 (not a v4-mapped one: bind refuses that then) */
        if (fd >= 0 && a->ai_family == AF_INET6 &&
            !IN6_IS_ADDR_V4MAPPED(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr))
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
            bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            net.lfds[net.nlfd++] = fd;
            continue;
        }
        err = errno;
        if (fd >= 0)
            close(fd);
    }
    return net.nlfd ? 0 : err;
}

static bool listen0(int err)
{
    if (net.nlfd == 0)
        gw__run_say("gw-run: node 0 (host %s) cannot listen on the launcher port %s: %s\n",
                net.myhost, net.where,
                err == EADDRNOTAVAIL ? "the master HOST is not an address of this machine; start "
                                       "node 0 on the machine that --master names"
                : err == EADDRINUSE ? "the port is in use; choose another --master port or "
                                      "--launcher-port"
                                    : strerror(err));
    return net.nlfd > 0;
}

/* ---- the other nodes ---- */

static void schedule_retry(void)
{
    gw__run_conn_close(net.up);
    net.retry_at_ms = gw__run_now_ms() + net.retry_ms;
    net.retry_ms = net.retry_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : net.retry_ms * 2;
}

void gw__run_net_give_up(void)
{
    net.given_up = true;
    gw__run_conn_close(net.up);
}

/* Connected: node 0's challenge is due within HELLO_TIMEOUT_MS. */
static void up_connected(void)
{
    struct conn *c = net.up;
    c->connecting = false;
    c->challenged = false;
    c->deadline_ms = gw__run_now_ms() + HELLO_TIMEOUT_MS;
    gw__run_tune_socket(c->fd);
}

static void up_connect(void)
{
    struct conn *c = net.up;
    if (!net.ai && resolve() != 0) {
        schedule_retry(); /* a transient failure (EAI_AGAIN): try again later */
        return;
    }
    struct addrinfo *a = net.ai_next ? net.ai_next : net.ai;
    net.ai_next = a->ai_next;
    c->fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    c->broken = false;
    if (c->fd >= 0 && connect(c->fd, a->ai_addr, a->ai_addrlen) == 0) {
        up_connected();
    } else if (c->fd >= 0 && errno == EINPROGRESS) {
        c->connecting = true;
        c->deadline_ms = gw__run_now_ms() + CONNECT_ATTEMPT_MS;
    } else {
        schedule_retry();
    }
}

/* This node's connection to node 0 ended: after EOF or an error (badly ==
 * NULL) or a bad frame, or (silent) node 0's heartbeat stopped. */
static void up_ended(const char *badly, bool silent)
{
    if (badly)
        gw__run_say("gw-run: %s: closing the launcher connection to node 0 at %s: %s\n", me(),
                net.where, badly);
    gw__run_conn_close(net.up);
    if (net.given_up)
        return;
    if (!net.welcomed) {
        schedule_retry(); /* not node 0's gw-run after all, or it was restarting */
        return;
    }
    net.given_up = true;
    /* (gw__run_net_apply says nothing of a loss while this node stops; a
     * node that stayed after its DONE may wait for a verdict too) */
    if (verdict_pending())
        gw__run_say("gw-run: %s: lost node 0 (host %s) before its word on restarting the job: not restarting; "
                    "ending this node\n", me(), net.host0);
    if (net.final_sent)
        return; /* our DONE is out: node 0 had no more to say to us */
    struct msg m = {.type = F_LOST, .v = {0, silent}};
    snprintf(m.s, sizeof m.s, "%s", net.host0);
    gw__run_net_apply(&m, 0);
}

static bool frame_up(struct conn *c, const struct msg *m)
{
    if (!sane(m))
        return gw__run_net_bad("field out of range");
    if (net.welcomed) {
        if (m->type == F_BEAT)
            return true;
        if (m->type == F_RESTART && net.cfg.max_restarts > 0) {
            net.verdict_known = true;
            net.restart_to = (long)m->v[0];
            if (!m->v[0] && m->s[0]) /* why not, as node 0 said it */
                gw__run_say("gw-run: node 0 (host %s): %s\n", net.host0, m->s);
            return true;
        }
        if (m->type == F_WAIT && net.cfg.max_restarts > 0) {
            gw__run_net_heard_wait(m->v[0]);
            return true;
        }
        if (m->type == F_PASS) {
            pass_on(m, 0);
            return true;
        }
        if (m->type != F_FAIL && m->type != F_LOST && m->type != F_ABORT && m->type != F_STOP)
            return gw__run_net_bad("unexpected frame type");
        gw__run_net_apply(m, 0);
        return true;
    }
    if (m->type == F_CHALLENGE && !c->challenged)
        return gw__run_net_up_hello(c, m);
    if (m->type == F_WELCOME && c->challenged) {
        if (!gw__run_net_welcome_proven(c, m))
            return gw__run_net_bad("its welcome does not prove the job token: another program answers on the "
                       "launcher port, or node 0 has another GW_JOB_TOKEN");
        if (net.cfg.node < 0 ? m->v[0] < 1 || m->v[0] >= (uint32_t)net.cfg.nnodes
                             : m->v[0] != (uint32_t)net.cfg.node)
            return gw__run_net_bad("its welcome gives another node number");
        if (net.cfg.node < 0) {
            net.cfg.node = (int)m->v[0];
            gw__run_say("gw-run: this node is node %d of %d (numbered by node 0, host %.255s, as it joined)\n",
                        net.cfg.node, net.cfg.nnodes, m->s);
        }
        net.welcomed = true;
        net.linger_ms = 0; /* it lingered to be heard: it is now */
        net.pending.outlen = 0;
        snprintf(net.host0, sizeof net.host0, "%.255s", m->s);
        if (net.verbose)
            gw__run_say("gw-run: node %d joined node 0 (host %s) at %s\n", net.cfg.node,
                    net.host0, net.where);
        return true;
    }
    if (m->type != F_REFUSE)
        return gw__run_net_bad(c->challenged ? "expected a welcome" : "expected a challenge");
    gw__run_say("gw-run: %s: node 0 at %s refused this node: %s\n", me(), net.where, m->s);
    gw__run_net_give_up();
    gw__run_fail(1);
    return true;
}

/* ---- the interface to the loop ---- */

bool gw__run_net_init(const struct net_config *cfg)
{
    if (cfg->nnodes <= 1)
        return true;
    net.on = true;
    net.cfg = *cfg;
    if (gethostname(net.myhost, sizeof net.myhost - 1) != 0)
        snprintf(net.myhost, sizeof net.myhost, "unknown");
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->lport);
    fmt_addr(net.where, sizeof net.where, cfg->host, port);
    const char *d = getenv("GW_DEBUG");
    net.verbose = d && (strcasecmp(d, "INFO") == 0 || strcasecmp(d, "TRACE") == 0);
    net.join_deadline_ms = gw__run_now_ms() + (int64_t)(cfg->join_timeout_s * 1000.0);
    /* Tests: GW_RUN_TEST_JOIN_NOTE_MS (1 ms to an hour) replaces the 10 s
     * before a node not yet welcomed first says it is still trying. */
    const char *note = getenv("GW_RUN_TEST_JOIN_NOTE_MS");
    const long note_ms = note && *note ? atol(note) : 0;
    net.join_note_ms = gw__run_now_ms() + (note_ms > 0 && note_ms <= 3600000 ? note_ms : JOIN_NOTE_MS);
    /* Another node may retry a transient failure (EAI_AGAIN) as it connects;
     * node 0, and a node that must find out whether it is node 0, may not. */
    int rc = resolve();
    if (rc != 0 && (rc != EAI_AGAIN || cfg->node == 0 || (cfg->node < 0 && !cfg->not_host))) {
        gw__run_say("gw-run: %s cannot resolve the master host '%s': %s\n", me(), cfg->host, gai_strerror(rc));
        return false;
    }
    /* No --node-rank: node 0 is the gw-run that can listen on the launcher
     * port at the master HOST; where HOST is not this machine's, or the port
     * is taken (node 0's gw-run on this machine, as nodes tried on one
     * machine), this node joins node 0 and is numbered as it arrives. */
    int err = 0;
    if (cfg->node == GW_RUN_NODE_AUTO && !cfg->not_host) {
        err = bind_launcher();
        if (net.nlfd > 0)
            net.cfg.node = 0;
        else if (err != EADDRNOTAVAIL && err != EADDRINUSE)
            return listen0(err);
        net.port_in_use = err == EADDRINUSE;
    }
    /* Node 0: every joined node and MAX_PENDING strangers; the others: the
     * one connection to node 0, kept (closed) between connect attempts. */
    net.pmap = calloc((size_t)gw__run_net_max_fds(), sizeof *net.pmap);
    net.conns = calloc((size_t)gw__run_net_max_fds(), sizeof *net.conns);
    if (net.cfg.node == 0) {
        net.state = calloc((size_t)cfg->nnodes, 1);
        net.hosts = calloc((size_t)cfg->nnodes, sizeof *net.hosts);
    } else if (net.conns && (net.up = net.conns[0] = calloc(1, sizeof *net.up)) != NULL) {
        net.nconns = 1;
        net.up->fd = -1;
        net.retry_ms = RETRY_MIN_MS;
        net.retry_at_ms = gw__run_now_ms();
    }
    if (!net.pmap || !net.conns || (net.cfg.node == 0 ? !net.state || !net.hosts : !net.up)) {
        gw__run_say("gw-run: out of memory\n");
        return false;
    }
    if (net.cfg.node != 0)
        return true;
    bool ok = net.nlfd > 0 || listen0(bind_launcher());
    freeaddrinfo(net.ai);
    net.ai = NULL;
    return ok;
}

int gw__run_net_join(int *sig)
{
    *sig = 0;
    if (!net.on)
        return 0;
    struct pollfd pfds[1];
    while (net.cfg.node < 0) {
        if (net.given_up)
            return -1; /* refused, or no node 0 in time: said */
        static const int stops[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
        sigset_t pend;
        if (sigpending(&pend) == 0)
            for (int i = 0; i < 4; i++)
                if (sigismember(&pend, stops[i])) {
                    gw__run_say("gw-run: %s before node 0 numbered this node: no rank was started\n",
                                gw__run_signal_name(stops[i]));
                    *sig = stops[i];
                    return -1;
                }
        int64_t deadline = 0;
        const int n = gw__run_net_pollfds(pfds, 0, &deadline);
        const int64_t left = deadline ? deadline - gw__run_now_ms() : 100; /* signals are held: look again soon */
        if (poll(pfds, (nfds_t)n, left < 0 ? 0 : left > 100 ? 100 : (int)left) > 0)
            gw__run_net_events(pfds, n);
        gw__run_net_tick();
    }
    return net.cfg.node;
}

int gw__run_net_max_fds(void)
{
    if (!net.on)
        return 0;
    /* node 0: its listeners, the joined nodes, the strangers (a node numbered by arrival: not 0) */
    return net.cfg.node == 0 ? net.cfg.nnodes + MAX_PENDING + GW_RUN_MAX_LISTEN - 1 : 1;
}

static void lower(int64_t *deadline, int64_t t)
{
    if (t && (!*deadline || t < *deadline))
        *deadline = t;
}

/* ---- heartbeats ----
 * A launcher stopped (SIGSTOP, Ctrl-Z, a debugger) or hung keeps its
 * connections open and its kernel answers keepalive, so nothing but its
 * silence tells: node 0 whose ranks were done waited for such a node's DONE
 * for good, and the other nodes for a stopped node 0.  Every joined
 * connection carries a BEAT each GW_RUN_BEAT_MS both ways, and a side that
 * hears nothing for GW_RUN_HEARTBEAT_TIMEOUT while the other machine's kernel
 * still acknowledges what it is sent gives the launcher up as lost.  Where
 * the kernel does not answer either, the network is down: that is
 * keepalive's to end (GW_SOCKET_KEEPALIVE rides out outages it is set to). */

/* A connection of a joined node: node 0's to a node, a node's to node 0 once welcomed. */
static bool beating(const struct conn *c)
{
    if (c->fd < 0 || c->connecting)
        return false;
    return net.cfg.node == 0 ? c->node > 0 : c == net.up && net.welcomed && !net.given_up;
}

static int64_t silence_ms(void)
{
    return (int64_t)(net.cfg.silence_s * 1000.0);
}

/* Whose silence ends it: a node that has not said how it ended, or that
 * waits for the verdict on a restart (node 0's view), or node 0 while this
 * node's DONE is not out or it stays for node 0's end (a restart). */
static bool watched(const struct conn *c)
{
    if (silence_ms() <= 0 || !beating(c) || !c->heard_ms)
        return false;
    return net.cfg.node == 0 ? net.state[c->node] == N_JOINED || net.state[c->node] == N_READY
                             : !net.final_sent || net.done_linger;
}

/* Whether the other machine's kernel acknowledged what this end sent within
 * the last half of the silence (BEATs are always in flight), so the silence
 * is its gw-run's; true when it cannot be told. */
static bool kernel_answers(const struct conn *c)
{
    struct tcp_info ti;
    socklen_t sl = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &sl) != 0)
        return true;
    return (int64_t)ti.tcpi_last_ack_recv < silence_ms() / 2;
}

/* c silent past the timeout: a stopped or hung launcher is given up, told
 * why first (once it goes on it reads that, not a bare end of the
 * connection); where the network is down too, said once and left to
 * keepalive.  True when c was given up. */
static bool silence_ends(struct conn *c, int64_t now)
{
    if (!watched(c) || now - c->heard_ms < silence_ms())
        return false;
    int unread = 0; /* its frames came, and wait to be read (this loop was held up): not silent */
    if (ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0)
        return false;
    const char *whose = net.cfg.node == 0 ? "it" : "node 0";
    if (!kernel_answers(c)) {
        if (!c->silence_said)
            gw__run_say("gw-run: nothing from node %d for %.0f s, and its machine does not acknowledge what this node "
                        "sends either: the network between them is down; waiting on it (GW_SOCKET_KEEPALIVE)\n",
                        net.cfg.node == 0 ? c->node : 0, net.cfg.silence_s);
        c->silence_said = true;
        return false;
    }
    struct msg m = {.type = F_ABORT, .v = {1}};
    snprintf(m.s, sizeof m.s, "gw-run: node %d gave node %d up: nothing from its gw-run for %.0f s "
             "(GW_RUN_HEARTBEAT_TIMEOUT: stopped, or hung?)", net.cfg.node == 0 ? 0 : net.cfg.node,
             net.cfg.node == 0 ? c->node : 0, net.cfg.silence_s);
    struct frame f;
    gw__run_pack(&f, &m);
    gw__run_conn_send(c, &f);
    gw__run_conn_flush(c);
    char what[200];
    snprintf(what, sizeof what, "nothing from %s for %.0f s (GW_RUN_HEARTBEAT_TIMEOUT) while its machine answers: "
             "its gw-run is stopped or hung", whose, net.cfg.silence_s);
    if (net.cfg.node == 0)
        conn0_ended(c, what, true);
    else
        up_ended(what, true);
    return true;
}

/* The BEATs, on every joined connection at once (one wake-up for all), but
 * where bytes wait to go already (a peer that takes nothing: they piled up
 * behind a stopped one until the connection counted as broken). */
static void beat(int64_t now)
{
    if (now < net.beat_ms)
        return;
    net.beat_ms = now + GW_RUN_BEAT_MS;
    struct msg m = {.type = F_BEAT};
    struct frame f;
    gw__run_pack(&f, &m);
    for (int i = 0; i < net.nconns; i++)
        if (beating(net.conns[i]) && net.conns[i]->outlen == 0)
            gw__run_conn_send(net.conns[i], &f);
}

/* Adds our descriptors to pfds from nfds on and lowers *deadline_ms to our
 * next timer; returns the new count. */
int gw__run_net_pollfds(struct pollfd *pfds, int nfds, int64_t *deadline_ms)
{
    if (!net.on)
        return nfds;
    int k = 0;
    bool zero = net.cfg.node == 0, joining = !net.welcomed && !net.given_up;
    lower(deadline_ms, net.flush_ms);
    lower(deadline_ms, net.linger_ms);
    lower(deadline_ms, net.verdict_deadline_ms);
    lower(deadline_ms, net.others_end_ms);
    lower(deadline_ms, net.done_note_ms);
    if (zero ? !net.join_reported && net.joined < net.cfg.nnodes - 1 : joining)
        lower(deadline_ms, net.join_deadline_ms);
    if (!zero && joining && net.up->fd < 0)
        lower(deadline_ms, net.retry_at_ms);
    if (!zero && joining)
        lower(deadline_ms, net.join_note_ms);
    /* with every waiting place held, once the oldest may be pushed out
     * (accept_all makes room) */
    const struct conn *old = zero && net.npending >= MAX_PENDING ? oldest_pending() : NULL;
    if (old && gw__run_now_ms() - old->accepted_ms < PUSH_AGE_MS)
        lower(deadline_ms, old->accepted_ms + PUSH_AGE_MS);
    else if (zero) {
        for (int l = 0; l < net.nlfd; l++) {
            net.pmap[k++] = NULL;
            pfds[nfds++] = (struct pollfd){.fd = net.lfds[l], .events = POLLIN};
        }
    }
    for (int i = 0; i < net.nconns; i++) {
        struct conn *c = net.conns[i];
        if (c->fd < 0)
            continue;
        if (beating(c)) /* (and the silences are looked at then too) */
            lower(deadline_ms, net.beat_ms);
        net.pmap[k++] = c;
        pfds[nfds++] = (struct pollfd){
            .fd = c->fd, .events = c->connecting ? POLLOUT : c->outlen ? POLLIN | POLLOUT : POLLIN};
        if (c->node < 0 || c->connecting || (!zero && !net.welcomed))
            lower(deadline_ms, c->deadline_ms); /* hello, challenge or welcome due, or connect attempt over */
    }
    return nfds;
}

/* Acts on what poll() reported for the descriptors gw__run_net_pollfds added. */
void gw__run_net_events(const struct pollfd *pfds, int nfds)
{
    bool zero = net.cfg.node == 0, accept = false;
    for (int i = 0; i < nfds; i++) {
        short ev = pfds[i].revents;
        struct conn *c = net.pmap[i];
        if (!ev || (c && c->fd < 0))
            continue;
        if (!c) {
            accept = true; /* after the connections' frames: a hello read is no connection to push out */
        } else if (c->connecting) {
            int err = 0;
            socklen_t len = sizeof err;
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0 ||
                !(ev & POLLOUT))
                schedule_retry();
            else
                up_connected();
        } else {
            int rc = R_OPEN;
            if (ev & (POLLIN | POLLHUP | POLLERR))
                rc = gw__run_conn_read(c, zero ? frame0 : frame_up, &why);
            if (rc == R_OPEN && (ev & POLLOUT) && !gw__run_conn_flush(c))
                rc = R_GONE;
            if ((rc == R_GONE || rc == R_BAD) && zero)
                conn0_ended(c, rc == R_BAD ? why : NULL, false);
            else if (rc == R_GONE || rc == R_BAD)
                up_ended(rc == R_BAD ? why : NULL, false);
        }
    }
    if (accept)
        accept_all();
    if (net.on && zero)
        compact();
}

/* The timers: hello and join deadlines, connect attempts. */
void gw__run_net_tick(void)
{
    if (!net.on)
        return;
    int64_t now = gw__run_now_ms();
    /* This gw-run did not run for a while (SIGSTOP or Ctrl-Z, a job
     * suspended whole: scontrol suspend, a frozen cgroup, docker pause; or
     * a machine starved): the other launchers' silence meanwhile is not
     * theirs.  Each gets a whole GW_RUN_HEARTBEAT_TIMEOUT from now (a job
     * suspended and resumed whole was ended at once, each node giving the
     * others up, and a node stopped alone blamed node 0 on waking). */
    if (net.tick_ms && now - net.tick_ms > OWN_GAP_MS)
        for (int i = 0; i < net.nconns; i++) {
            /* (only the stall is forgiven: a gw-run held up again and again,
             * gang-scheduled, still gives a stopped peer up in the end) */
            struct conn *c = net.conns[i];
            if (c->heard_ms)
                c->heard_ms += now - net.tick_ms - GW_RUN_BEAT_MS;
            if (c->heard_ms > now)
                c->heard_ms = now;
        }
    net.tick_ms = now;
    beat(now);
    if (net.cfg.node == 0) {
        for (int i = 0; i < net.nconns; i++) {
            struct conn *c = net.conns[i];
            if (c->broken) {
                conn0_ended(c, "it does not read what node 0 sends", false);
            } else if (silence_ends(c, now)) {
                /* given up */
            } else if (c->node < 0 && now >= c->deadline_ms) {
                gw__run_say(
                        "gw-run: closing the launcher connection from %s: no hello within %d s\n",
                        c->peer, HELLO_TIMEOUT_MS / 1000);
                gw__run_conn_close(c);
            }
        }
        compact();
        if (!net.join_reported && net.joined < net.cfg.nnodes - 1 && now >= net.join_deadline_ms) {
            net.join_reported = true;
            if (!gw__run_stopping())
                report_missing();
        }
        return;
    }
    struct conn *c = net.up;
    if (c->fd >= 0 && c->broken)
        up_ended("node 0 does not read what this node sends", false);
    else if (c->fd >= 0)
        silence_ends(c, now);
    if (net.welcomed || net.given_up)
        return;
    /* Silent until the deadline, a node whose node 0 had gone (a wrong
     * address, a job already over, its place taken) looked hung. */
    if (now < net.join_deadline_ms && now >= net.join_note_ms) {
        gw__run_say("gw-run: %s: no answer from node 0 at %s yet; trying for %.0f s more (GW_RUN_JOIN_TIMEOUT)\n",
                    me(), net.where, ceil((double)(net.join_deadline_ms - now) / 1000.0));
        net.join_note_ms = now + JOIN_NOTE_EVERY_MS;
    }
    if (now >= net.join_deadline_ms) {
        gw__run_say("gw-run: %s: no answer from node 0 at %s after %g s%s\n", me(), net.where,
                net.cfg.join_timeout_s, net.cfg.node < 0 && net.port_in_use
                ? " (with no --node-rank, this node took the program that holds the launcher port here for "
                  "node 0: is that another job's gw-run, or not a gw-run?)" : "");
        gw__run_net_give_up();
        gw__run_fail(1);
    } else if (c->fd >= 0 && c->connecting && now >= c->deadline_ms) {
        schedule_retry();
    } else if (c->fd >= 0 && now >= c->deadline_ms) {
        char what[120];
        snprintf(what, sizeof what, c->challenged ? "no welcome or refusal within %d s"
                 : "no challenge within %d s (is node 0's gw-run an older one?)", HELLO_TIMEOUT_MS / 1000);
        up_ended(what, false);
    } else if (c->fd < 0 && now >= net.retry_at_ms) {
        up_connect();
    }
}
