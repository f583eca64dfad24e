/*
 * gw-run-net-hello.c: the launcher control channel's handshake (gw-run-net.c
 * is the rest): node 0 challenges each connection with a nonce, the node
 * answers with a hello (its node rank, nnodes, -n, --max-restarts, kill
 * grace and an HMAC proof of the job token over both nonces and those
 * numbers), and node 0 checks it, refuses a node that disagrees (or ends the
 * job, for a node it waits for) and welcomes the others with a proof of its
 * own, which the node checks before it believes anything node 0 sends.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw-run.h"
#include "gw-run-net.h"
#include "hmac.h"

/* The job token never travels: each end proves it has it by an HMAC-SHA256
 * under the token of both ends' nonces (fresh per connection, so a proof
 * replayed on another connection fails) and what the frame says.  what:
 * "hello" (the node's, over node 0's nonce first) or "welcome" (node 0's,
 * over the node's nonce first); v[0..nv) the frame's numbers. */
static void proof(const char *what, const unsigned char first[GW_RUN_NONCE],
                  const unsigned char second[GW_RUN_NONCE], const uint32_t *v, int nv,
                  unsigned char out[GW_RUN_PROOF])
{
    unsigned char nums[6 * 4];
    for (int i = 0; i < nv; i++)
        for (int k = 0; k < 4; k++)
            nums[4 * i + k] = (unsigned char)(v[i] >> (24 - 8 * k));
    const void *parts[] = {"gw-run ", what, first, second, nums};
    const size_t lens[] = {7, strlen(what), GW_RUN_NONCE, GW_RUN_NONCE, 4 * (size_t)nv};
    gw__hmac_sha256(net.cfg.token, strlen(net.cfg.token), parts, lens, 5, out);
}

/* A kill grace in whole milliseconds for the hello and WAIT (a day at
 * most: past it, node 0 would wait as long as the node for nothing it could
 * not see sooner in the node's closed connection). */
uint32_t gw__run_grace_ms(double s)
{
    return s >= 86400.0 ? GW_RUN_MAX_GRACE_MS : (uint32_t)(s * 1000.0);
}

/* Whether the hello proves the token (the comparison in constant time, so a
 * stranger learns nothing from how fast we answer). */
static bool hello_proven(struct conn *c, const struct msg *h)
{
    if (h->toklen != GW_RUN_NONCE + GW_RUN_PROOF)
        return false;
    unsigned char want[GW_RUN_PROOF];
    memcpy(c->peer_nonce, h->tok, GW_RUN_NONCE);
    proof("hello", c->nonce, c->peer_nonce, h->v, 6, want);
    return gw__equal_ct(want, h->tok + GW_RUN_NONCE, GW_RUN_PROOF);
}

bool gw__run_net_hello0(struct conn *c, const struct msg *h)
{
    uint32_t node = h->v[1], nnodes = h->v[2], nproc = h->v[3];
    char reason[1024];
    if ((h->v[0] & 0xffffff00u) == (GW_RUN_HELLO_MAGIC & 0xffffff00u) && h->v[0] != GW_RUN_HELLO_MAGIC) {
        snprintf(reason, sizeof reason, "this node's gw-run speaks version %c of the launcher protocol, node 0's "
                 "(host %s) version %c: use the same gw-run on every node", (char)(h->v[0] & 0xff), net.myhost,
                 (char)(GW_RUN_HELLO_MAGIC & 0xff));
        gw__run_say("gw-run: refused a launcher connection from %s: %s\n", c->peer, reason);
        gw__run_net_answer(c, F_REFUSE, 0, reason, NULL, 0);
        return true;
    }
    if (h->v[0] != GW_RUN_HELLO_MAGIC)
        return gw__run_net_bad("not a gw-run hello");
    if (!hello_proven(c, h)) {
        gw__run_say(
                "gw-run: refused a launcher connection from %s (says node %u, host %s): wrong job "
                "token; every node needs the same GW_JOB_TOKEN\n",
                c->peer, node, h->s);
        gw__run_net_answer(c, F_REFUSE, 0, "wrong job token (GW_JOB_TOKEN differs from node 0's)", NULL, 0);
        return true;
    }
    const bool by_arrival = node == GW_RUN_NODE_ANY;
    if (by_arrival) { /* the lowest number no node has taken (or been refused with) */
        node = 0;
        for (uint32_t n = 1; n < (uint32_t)net.cfg.nnodes && !node; n++)
            if (net.state[n] == N_ABSENT && !net.hosts[n])
                node = n;
        if (!node) {
            snprintf(reason, sizeof reason, "all %d nodes of the job joined already (or were refused): this "
                     "one (host %.255s, no --node-rank) has no number left; another job with the same token "
                     "and --master?", net.cfg.nnodes, h->s);
            gw__run_say("gw-run: refused a launcher connection from %s: %s\n", c->peer, reason);
            gw__run_net_answer(c, F_REFUSE, 0, reason, NULL, 0);
            return true;
        }
    }
    if (nnodes != (uint32_t)net.cfg.nnodes || nproc != (uint32_t)net.cfg.nproc ||
        h->v[4] != (uint32_t)net.cfg.max_restarts) {
        /* The job cannot run: the ranks would disagree on the world size, or
         * the nodes on whether a failure ends the job. */
        bool nn = nnodes != (uint32_t)net.cfg.nnodes, np = nproc != (uint32_t)net.cfg.nproc;
        const char *flag = nn ? "--nnodes" : np ? "-n" : "--max-restarts";
        snprintf(reason, sizeof reason,
                 "node %u (host %.255s) was started with %s %u but node 0 (host %s) with %s %d; "
                 "every node must use the same -n, --nnodes and --max-restarts",
                 node, h->s, flag, nn ? nnodes : np ? nproc : h->v[4], net.myhost, flag,
                 nn ? net.cfg.nnodes : np ? net.cfg.nproc : net.cfg.max_restarts);
        /* Only a node this job still waits for ends it: a launch for
         * another job that reuses the token and --master (another -n), or a
         * node rank this job does not have or already has, is refused as an
         * "already joined" one is, and the job runs on. */
        if (node < 1 || node >= (uint32_t)net.cfg.nnodes || net.state[node] != N_ABSENT) {
            gw__run_say("gw-run: refused a launcher connection from %s (says node %u, host %s): %s\n", c->peer,
                        node, h->s, reason);
            gw__run_net_answer(c, F_REFUSE, 0, reason, NULL, 0);
            return true;
        }
        gw__run_net_answer(c, F_REFUSE, 0, reason, NULL, 0);
        net.state[node] = N_ENDED; /* told by the refusal: not a node to wait for */
        struct msg m = {.type = F_ABORT, .v = {1}};
        snprintf(m.s, sizeof m.s, "gw-run: %.1000s", reason);
        gw__run_net_no_restart("%s", reason); /* nodes that disagree cannot run any attempt */
        gw__run_net_apply(&m, -1); /* (said even while the job stops) */
        return true;
    }
    if (node < 1 || node >= nnodes || net.state[node] != N_ABSENT) {
        if (node < 1 || node >= nnodes)
            snprintf(reason, sizeof reason, "node rank %u is out of range 1..%d", node,
                     net.cfg.nnodes - 1);
        else if (!net.hosts[node]) /* refused before (its flags differed from node 0's): the job ended then */
            snprintf(reason, sizeof reason,
                     "node %u was refused before (its options differed from node 0's) and the job ended "
                     "then; start the whole job again", node);
        else
            snprintf(reason, sizeof reason,
                     "node %u already joined (host %s); is --node-rank %u given twice?", node,
                     net.hosts[node], node);
        gw__run_say("gw-run: refused a launcher connection from %s (host %s): %s\n", c->peer,
                h->s, reason);
        gw__run_net_answer(c, F_REFUSE, 0, reason, NULL, 0);
        return true;
    }
    if (!(net.hosts[node] = strdup(h->s)))
        return gw__run_net_bad("out of memory");
    c->node = (int)node;
    net.npending--;
    net.state[node] = N_JOINED;
    net.joined++;
    /* how long node 0 waits for the launchers to end (gw-run-net-end.c) and
     * for their READY (gw-run-restart.c); a day at most, as GW_RUN_KILL_GRACE */
    if (h->v[5] > net.others_grace_ms) {
        net.others_grace_ms = h->v[5] < GW_RUN_MAX_GRACE_MS ? h->v[5] : GW_RUN_MAX_GRACE_MS;
        /* a node already waiting for the verdict (it joined before this
         * one; ranks start before every node joined) waits longer too */
        for (int i = 0; i < net.nconns; i++)
            if (net.conns[i]->node > 0 && net.state[net.conns[i]->node] == N_READY)
                gw__run_net_tell_wait(net.conns[i]);
    }
    unsigned char mine[GW_RUN_PROOF];
    proof("welcome", c->peer_nonce, c->nonce, &node, 1, mine);
    gw__run_net_answer(c, F_WELCOME, node, net.myhost, mine, sizeof mine);
    if (net.have_end)
        gw__run_conn_send(c, &net.end);
    if (net.verbose)
        gw__run_say("gw-run: node %u (host %s) joined from %s%s%s\n", node, h->s, c->peer,
                by_arrival ? " (numbered by arrival: it gave no --node-rank)" : "",
                net.joined == net.cfg.nnodes - 1 ? "; all nodes joined" : "");
    return true;
}

/* Node 0's challenge came: the hello with this node's proof, then what
 * waited for the connection. */
bool gw__run_net_up_hello(struct conn *c, const struct msg *ch)
{
    if (ch->v[0] != GW_RUN_HELLO_MAGIC) {
        static char reason[160];
        if ((ch->v[0] & 0xffffff00u) != (GW_RUN_HELLO_MAGIC & 0xffffff00u))
            return gw__run_net_bad("not a gw-run challenge");
        snprintf(reason, sizeof reason, "node 0's gw-run speaks version %c of the launcher protocol, this "
                 "node's version %c: use the same gw-run on every node", (char)(ch->v[0] & 0xff),
                 (char)(GW_RUN_HELLO_MAGIC & 0xff));
        return gw__run_net_bad(reason);
    }
    if (ch->toklen != GW_RUN_NONCE)
        return gw__run_net_bad("a challenge of the wrong size");
    memcpy(c->peer_nonce, ch->tok, GW_RUN_NONCE);
    if (!gw__run_random(c->nonce, sizeof c->nonce))
        return gw__run_net_bad("no random bytes for this node's nonce");
    unsigned char tok[GW_RUN_NONCE + GW_RUN_PROOF];
    struct msg h = {.type = F_HELLO,
                    .v = {GW_RUN_HELLO_MAGIC, (uint32_t)net.cfg.node, (uint32_t)net.cfg.nnodes,
                          (uint32_t)net.cfg.nproc, (uint32_t)net.cfg.max_restarts, gw__run_grace_ms(gw__run.kill_grace_s)},
                    .tok = tok, .toklen = sizeof tok};
    memcpy(tok, c->nonce, GW_RUN_NONCE);
    proof("hello", c->peer_nonce, c->nonce, h.v, 6, tok + GW_RUN_NONCE);
    struct frame f;
    snprintf(h.s, sizeof h.s, "%s", net.myhost);
    gw__run_pack(&f, &h);
    gw__run_conn_send(c, &f);
    if (!gw__run_out_add(c, net.pending.out, net.pending.outlen))
        c->broken = true;
    c->challenged = true;
    c->deadline_ms = gw__run_now_ms() + HELLO_TIMEOUT_MS; /* the welcome due */
    return true;
}

/* Whether node 0's welcome proves the token: another program on the
 * launcher port (started first, or at a wrong --master) cannot.  The proof
 * covers the node number it gives (this node's own, or by arrival). */
bool gw__run_net_welcome_proven(const struct conn *c, const struct msg *m)
{
    if (m->toklen != GW_RUN_PROOF)
        return false;
    unsigned char want[GW_RUN_PROOF];
    const uint32_t node = m->v[0];
    proof("welcome", c->nonce, c->peer_nonce, &node, 1, want);
    return gw__equal_ct(want, m->tok, GW_RUN_PROOF);
}
