/*
 * gw-run-loop.c - one attempt's event loop: reaps ranks, pumps their output
 * into the writers' queues, takes signals and the control channel's frames,
 * and runs the teardown's deadlines (SIGKILL after the grace, giving up on a
 * process SIGKILL does not end, the pipes a rank's child still holds, output
 * nobody takes after a stop signal), until every rank and stray is gone.
 * Split from gw-run.c (main, the flags and the restarts) as it grew.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gw-run.h"

enum {
    DRAIN_GRACE_MS = 2000, /* every rank gone: how long a process they started may still hold their pipes */
    HELD_RECHECK_MS = 20,  /* an output queue full: how soon to see whether it has room */
};

void gw__run_loop(void)
{
    size_t max_fds = (size_t)gw__run.nranks * 2 + 1 + (size_t)gw__run_net_max_fds();
    struct pollfd *pfds = calloc(max_fds, sizeof *pfds);
    struct stream **owner = calloc(max_fds, sizeof *owner);
    struct rank **owner_rank = calloc(max_fds, sizeof *owner_rank);
    if (!pfds || !owner || !owner_rank) {
        gw__run_say("gw-run: out of memory\n");
        exit(1);
    }
    int64_t drain_deadline_ms = 0;
    bool held = false; /* the last poll left out pipes whose output queue was full */
    bool child_event = true; /* a rank may have exited before we got here */

    for (;;) {
        if (child_event) {
            child_event = false;
            gw__run_reap();
            if (gw__run_stopping() || gw__run.alive == 0)
                gw__run_scan_strays();
        }
        /* A failure or signal from another node starts a teardown here, after
         * which the strays are scanned for as after a local one. */
        bool was_stopping = gw__run_stopping();
        gw__run_net_tick();
        if (!was_stopping && gw__run_stopping()) {
            child_event = true;
            continue;
        }
        bool wait_strays = gw__run_waiting_for_strays();
        if (gw__run.alive == 0 && gw__run.open_streams == 0 && !wait_strays &&
            gw__run_net_finish())
            break;
        int64_t now = gw__run_now_ms();
        if ((gw__run.alive > 0 || wait_strays) && gw__run.kill_deadline_ms &&
            now >= gw__run.kill_deadline_ms) {
            /* ranks that ended since the last look (this gw-run held up:
             * stopped, say) are not "still running" */
            gw__run_reap();
            gw__run_escalate();
        }
        const int64_t give_up = gw__run_give_up_deadline();
        if ((gw__run.alive > 0 || wait_strays) && give_up && now >= give_up) {
            gw__run_reap(); /* one that ended since the last look is no straggler */
            if (gw__run.alive > 0 || gw__run_waiting_for_strays()) {
                const bool clean = gw__run.alive == 0 && !gw__run_stopping();
                gw__run_give_up();
                if (!clean)
                    break;
                continue; /* a clean run's unkillable leftover: the job ends as it would (a node's DONE) */
            }
        }
        /* A fresh grace once our output moves again, or once the strays are
         * gone: while gw-run still waits for them (a wrapper's program taking
         * its SIGTERM grace), they may still write their last lines, and
         * closing the pipes under them lost those and killed them with
         * SIGPIPE; the kill deadline and the give-up bound that wait. */
        if (held || wait_strays)
            drain_deadline_ms = 0;
        /* ... but not for ever once the job was stopped by a signal: a
         * stdout whose reader sleeps (a paused pager) kept gw-run alive with
         * every rank gone, through a second signal too. */
        if (gw__run.alive == 0 && !wait_strays && held && (gw__run.got_signal || gw__run.out_hurry)) {
            const int64_t stuck = gw__run_io_stuck_ms();
            if (stuck >= (gw__run.out_hurry ? GW_RUN_OUT_HURRY_MS : GW_RUN_OUT_STUCK_MS)) {
                gw__run_abandon_stuck_output(stuck);
                continue;
            }
        }
        if (gw__run.alive == 0 && gw__run.open_streams > 0 && !held && !wait_strays) {
            /* Every rank is gone but a process it started still holds its
             * stdout or stderr; wait a little for its last lines, not forever
             * (while our own output is stuck, the pipes wait for it instead). */
            if (!drain_deadline_ms)
                drain_deadline_ms = now + DRAIN_GRACE_MS;
            if (now >= drain_deadline_ms) {
                gw__run_abandon_output();
                continue;
            }
        }

        int nfds = 0;
        pfds[nfds++] = (struct pollfd){.fd = gw__run_signal_fd(), .events = POLLIN};
        nfds = gw__run_io_pollfds(pfds, nfds, owner, owner_rank, &held);
        int net0 = nfds;
        int64_t deadline = 0;
        if ((gw__run.alive > 0 || wait_strays) && gw__run.kill_deadline_ms)
            deadline = gw__run.kill_deadline_ms;
        if ((gw__run.alive > 0 || wait_strays) && give_up && (!deadline || give_up < deadline))
            deadline = give_up;
        if (gw__run.alive == 0 && gw__run.open_streams > 0 && drain_deadline_ms &&
            (!deadline || drain_deadline_ms < deadline))
            deadline = drain_deadline_ms;
        if (held && (!deadline || now + HELD_RECHECK_MS < deadline))
            deadline = now + HELD_RECHECK_MS; /* output queue full: see when it has room */
        nfds = gw__run_net_pollfds(pfds, nfds, &deadline);
        int timeout = -1;
        if (deadline) {
            int64_t left = deadline - now;
            timeout = left < 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
        }

        int n = poll(pfds, (nfds_t)nfds, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            gw__run_say("gw-run: poll failed: %s\n", strerror(errno));
            exit(1);
        }
        if (pfds[0].revents)
            gw__run_drain_signals(&child_event);
        for (int j = 1; j < net0; j++)
            if (pfds[j].revents)
                gw__run_pump(owner_rank[j], owner[j]);
        was_stopping = gw__run_stopping();
        gw__run_net_events(pfds + net0, nfds - net0);
        if (!was_stopping && gw__run_stopping())
            child_event = true;
    }
    free(pfds);
    free(owner);
    free(owner_rank);
}
