/* prims.c - see prims.h: the waits every algorithm's primitives are made of, the
 * header check of every received chunk, flushing, and the abort notice.  Works
 * on any connection of any algorithm; knows no data layout. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prims.h"

const char *gw__coll_name(int coll) {
  switch (coll) {
    case GW_COLL_ALLREDUCE: return "allreduce";
    case GW_COLL_BROADCAST: return "broadcast";
    case GW_COLL_ALLGATHER: return "allgather";
    case GW_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case GW_COLL_BARRIER: return "barrier";
  }
  return "unknown-collective";
}

void gw__describe_op(const struct gw_opdesc *d, char *buf, size_t len) {
  const char *dt = gw_dtype_name((gw_dtype_t)d->dtype);
  switch (d->coll) {
    case GW_COLL_BARRIER:
      snprintf(buf, len, "#%" PRIu64 " barrier()", d->seq);
      break;
    case GW_COLL_BROADCAST:
      snprintf(buf, len, "#%" PRIu64 " broadcast(count=%" PRIu64 ", %s, root=%d)", d->seq, d->count, dt, d->root);
      break;
    case GW_COLL_ALLGATHER:
      snprintf(buf, len, "#%" PRIu64 " allgather(count=%" PRIu64 ", %s)", d->seq, d->count, dt);
      break;
    default:
      snprintf(buf, len, "#%" PRIu64 " %s(count=%" PRIu64 ", %s, %s)", d->seq, gw__coll_name(d->coll), d->count,
               dt, gw_op_name((gw_op_t)d->op));
  }
  uint32_t bucketer, bucket;
  if (d->coll != GW_COLL_BROADCAST && d->coll != GW_COLL_ABORT && gw__desc_bucket_of(d->root, &bucketer, &bucket)) {
    const size_t used = strlen(buf);
    if (used < len) snprintf(buf + used, len - used, " for bucket %u of bucketer %u", bucket, bucketer);
  }
  size_t used = strlen(buf);
  if (d->pad & GW_DESC_DIVIDED && used < len)
    used += (size_t)snprintf(buf + used, len - used, ", an average divided on each rank first "
                             "(gw_bucketer_set_divide_first)");
  if (d->pad & GW_DESC_DEVICE && used < len) used += (size_t)snprintf(buf + used, len - used, " on device memory");
  if (d->pad & GW_DESC_MORE && used < len)
    used += (size_t)snprintf(buf + used, len - used, " (a piece of a staged device call, more to come)");
  const int algo = (d->pad >> GW_DESC_ALGO_SHIFT) & 3, proto = (d->pad >> GW_DESC_PROTO_SHIFT) & 1;
  if (algo && used < len) snprintf(buf + used, len - used, " by %s/%s", gw__algo_name(algo), gw__proto_name(proto));
}

static gw_result_t timeout_error(struct prims *p, const char *what, int peer, double limit) {
  char me[GW_OPDESC_TEXT];
  gw__describe_op(&p->op->desc, me, sizeof me);
  return gw__err(p->err, GW_ERR_TIMEOUT,
                 "rank %d: operation %s waited %.0f s for %s rank %d; that rank is stuck, dead or "
                 "in a different operation (raise GW_TIMEOUT if it is just slow)",
                 p->comm->rank, me, limit, what, peer);
}

/* What c's sender last said it waits on, while that holds: no chunk came
 * after it (peek_data), and it was told in this operation or in the one
 * before (a ring peer still finishing that one: a ring rank's last step
 * there is a receive, so its successor may be in the next already).  NULL
 * when there is none. */
static const struct gw_wait_status *live_status(const struct prims *p, const struct gw_conn *c) {
  const uint64_t told = c->status_seq - 1, seq = p->op->desc.seq;
  return c->status_seq && (told == seq || told + 1 == seq) ? &c->status : NULL;
}

/* A receive timed out.  When the peer said it waits itself in this
 * operation (tell_status), name the end of that line of waits: the rank
 * nobody heard waiting.  When the peer never sent anything of this
 * operation, it is the straggler (or waits for one before its first send):
 * name it.  When it did, it is inside the operation, most likely waiting on
 * someone else, and every rank's deadline expires at about the same moment;
 * the rank that waits on the real straggler reports first and its notice
 * travels here, so this rank waits the grace for it (see gw__wait_recv).
 * Past that, nobody named one and the peer said nothing of waiting (it
 * stopped in the middle): say it stopped sending. */
/* Whether the network stopped delivering (transport.h, net_stalled) on c,
 * else on any connection of this operation: a wait on a peer whose data
 * stopped coming is most often this rank's own sends stuck too, to the peer
 * or to the next machine on (a machine cut off: its ranks' sends to it and
 * from it stall; the why names the host). */
static bool net_stalled(const struct prims *p, const struct gw_conn *c, char *why, size_t len) {
  if (c->tp->net_stalled && c->tp->net_stalled(c, why, len)) return true;
  for (int i = 0; i < p->nconns + p->nwatch; i++) {
    const struct gw_conn *o = i < p->nconns ? p->conns[i] : p->watch[i - p->nconns];
    if (o && o != c && o->tp->net_stalled && o->tp->net_stalled(o, why, len)) return true;
  }
  return false;
}

/* A wait that timed out while the network to the peer stopped delivering:
 * said so (it was said as a peer that "has not started" the operation, or as
 * a line of waits suggesting calls that differ).  GW_SUCCESS when it did not. */
static gw_result_t net_timeout_error(struct prims *p, const struct gw_conn *c, double waited, const char *what,
                                     const char *me) {
  char net[360];
  if (!net_stalled(p, c, net, sizeof net)) return GW_SUCCESS;
  return gw__err(p->err, GW_ERR_TIMEOUT, "rank %d: operation %s waited %.1f s for %s rank %d: %s (raise GW_TIMEOUT "
                 "if the network is just slow)", p->comm->rank, me, waited, what, c->peer, net);
}

static gw_result_t recv_timeout_error(struct prims *p, const struct gw_conn *c, double waited) {
  char me[GW_OPDESC_TEXT];
  gw__describe_op(&p->op->desc, me, sizeof me);
  GW_CHECK(net_timeout_error(p, c, waited, "data from", me));
  const struct gw_wait_status *st = live_status(p, c);
  char in[64] = ""; /* a peer still in the operation before */
  if (st && c->status_seq - 1 != p->op->desc.seq)
    snprintf(in, sizeof in, " (still in operation #%llu)", (unsigned long long)(c->status_seq - 1));
  if (st && st->end == p->comm->rank)
    return gw__err(p->err, GW_ERR_TIMEOUT,
                   "rank %d: operation %s waited %.1f s for data from rank %d, which waits itself%s on rank %d, in a "
                   "line of %u waits that leads back to this rank: the ranks wait on each other (calls that differ "
                   "across ranks?)",
                   p->comm->rank, me, waited, c->peer, in, st->waits_on, (unsigned)st->hops + 1);
  if (st) {
    char line[96] = "";
    if (st->hops > 1)
      snprintf(line, sizeof line, ", in a line of %u waits that ends at rank %d", (unsigned)st->hops + 1, st->end);
    return gw__err(p->err, GW_ERR_TIMEOUT,
                   "rank %d: operation %s waited %.1f s for data from rank %d, which waits itself%s on rank %d%s; rank "
                   "%d %s and has not said it waits on another rank (it is stuck or stopped, or its machine is; raise "
                   "GW_TIMEOUT if it is just slow)",
                   p->comm->rank, me, waited, c->peer, in, st->waits_on, line, st->end,
                   st->end_started ? "started it and then stopped sending" : "has sent nothing of it");
  }
  if (c->seen_seq != p->op->desc.seq + 1 && p->grace_part > 0)
    return gw__err(p->err, GW_ERR_TIMEOUT,
                   "rank %d: operation %s waited %.1f s for data from rank %d, which has not sent it (it is stuck "
                   "before the operation, or in it waiting on another rank; raise GW_TIMEOUT if it is just slow)",
                   p->comm->rank, me, waited, c->peer);
  if (c->seen_seq != p->op->desc.seq + 1)
    return gw__err(p->err, GW_ERR_TIMEOUT,
                   "rank %d: operation %s waited %.1f s for data from rank %d, which has not started it (it is "
                   "stuck before it, or called something else; raise GW_TIMEOUT if it is just slow)",
                   p->comm->rank, me, waited, c->peer);
  return gw__err(p->err, GW_ERR_TIMEOUT,
                 "rank %d: operation %s waited %.1f s for more data from rank %d, which started it and then stopped "
                 "sending and has not said it waits on another rank (it is stuck or stopped, or its machine is; "
                 "raise GW_TIMEOUT if it is just slow)",
                 p->comm->rank, me, waited, c->peer);
}

/* A wait for room at a peer timed out.  A peer that freed room for chunks of
 * this operation on this connection (more were posted than its FIFO holds) is
 * inside it and most likely blocked on a rank further on, whose neighbour
 * names the straggler: this rank waited the grace for that notice (see
 * gw__wait_slot) and says what it saw.  Otherwise the peer has freed no room
 * for this operation's data: it has not received it (the straggler, or a rank
 * waiting on one before its first receive here), or holds the first chunk
 * while it waits elsewhere; over tcp the kernels' buffers take the bytes
 * whether or not it reads them, so this rank cannot tell (depth 0).  With
 * nothing of this operation posted yet, the FIFO holds the one before's last
 * chunks.  (Over ib a slot can also wait for local completions, briefly.) */
static gw_result_t slot_timeout_error(struct prims *p, const struct gw_conn *c, double waited, bool took) {
  char me[GW_OPDESC_TEXT];
  gw__describe_op(&p->op->desc, me, sizeof me);
  GW_CHECK(net_timeout_error(p, c, waited, "room at", me));
  if (took)
    return gw__err(p->err, GW_ERR_TIMEOUT,
                   "rank %d: operation %s waited %.1f s for room at rank %d, which took data of it from this rank "
                   "and then stopped taking it (it is stuck, or waits on a rank that is, and no rank named one "
                   "within the grace; raise GW_TIMEOUT if it is just slow)",
                   p->comm->rank, me, waited, c->peer);
  return gw__err(p->err, GW_ERR_TIMEOUT,
                 "rank %d: operation %s waited %.1f s for room at rank %d, which %s (it is stuck or dead, called "
                 "something else, or waits on another rank; raise GW_TIMEOUT if it is just slow)",
                 p->comm->rank, me, waited, c->peer,
                 c->sent_seq != p->op->desc.seq ? "has not taken the last chunks of the operation before from this rank"
                 : c->depth ? "has freed no slot for this operation's data"
                            : "has not read enough of this operation's data (this transport cannot tell whether it "
                              "read any)");
}

/* Transports that queue bytes in user space (tcp) move them while we wait on
 * anything, so two ranks waiting on each other's queued sends cannot deadlock. */
static gw_result_t pump(struct prims *p) {
  for (int i = 0; i < p->nconns; i++) {
    struct gw_conn *c = p->conns[i];
    if (!c->tp->progress) continue;
    gw_result_t r = c->tp->progress(c, p->err);
    if (r != GW_SUCCESS && r != GW_INPROGRESS) return r;
  }
  return GW_SUCCESS;
}

/* A zombie thread-group leader whose other threads still run: its main thread
 * called pthread_exit while another drives the communicator, alive.  Not a
 * process on its way out (killed, crashed, exit_group: the kernel makes every
 * thread's SIGKILL pending), whose threads may take a while (a driver's
 * teardown) and hold its lock meanwhile. */
static bool zombie_leader_alive(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return false;
  bool running = false, dying = false;
  for (struct dirent *e; !dying && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/%d/task/%.20s/status", (int)pid, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    char state = 'X';
    unsigned long long pending = 0;
    while (fgets(line, sizeof line, f)) {
      if (!strncmp(line, "State:", 6)) sscanf(line + 6, " %c", &state);
      else if (!strncmp(line, "SigPnd:", 7)) pending = strtoull(line + 7, NULL, 16);
    }
    fclose(f);
    dying |= (pending >> (SIGKILL - 1)) & 1;
    running |= state != 'Z' && state != 'X';
  }
  closedir(d);
  return running && !dying;
}

/* Whether a peer on this machine still runs (a zombie counts as dead: its
 * launcher has not reaped it yet).  Peers elsewhere are watched by their
 * transport (a closed socket).  Two looks: its liveness lock (alive.c; any
 * pid namespace sharing our /dev/shm), and its pid (our pid namespace only;
 * sees the rank gone while a child it forked bypassing the fork handlers,
 * raw clone, still holds the lock). */
/* The state letter of the peer's process from /proc (R, S, D, T, t, Z, X,
 * ...): 0 where its pid is not ours to look up (another machine, or a pid of
 * another pid namespace: a container), '-' when it is gone, '?' when it
 * cannot be read. */
static char peer_pid_state(const struct gw_comm *comm, int peer) {
  const struct gw_peer_info *pi = &comm->peers[peer];
  const struct gw_peer_info *me = &comm->peers[comm->rank];
  if (strcmp(pi->node_id, me->node_id) != 0 || pi->pid <= 0 || !me->pidns || pi->pidns != me->pidns) return 0;
  if (kill(pi->pid, 0) != 0 && errno == ESRCH) return '-'; /* gone: not even a zombie */
  char buf[256];
  const char *fields = gw__proc_stat_fields(pi->pid, 0, buf, sizeof buf);
  return fields ? fields[0] : '?';
}

/* Whether the peer's process runs, by its pid: 1 yes, 0 no, -1 not ours to
 * look up. */
static int peer_pid_runs(const struct gw_comm *comm, int peer) {
  const char state = peer_pid_state(comm, peer);
  if (!state) return -1;
  if (state == '-') return 0;
  if (state != 'Z' && state != 'X') return 1;
  return zombie_leader_alive(comm->peers[peer].pid);
}

/* A wait's deadline passed while the peer it waits on is stopped, every
 * thread of it: job control (SIGSTOP, or SIGTSTP from a terminal's Ctrl-Z),
 * or a debugger or tracer holding it.  That peer is the straggler for certain, so the wait
 * says so at its deadline without the grace for a notice: the ranks behind it
 * then hear the notice naming it within their own grace (each blamed its
 * healthy predecessor when every deadline ran out together).  GW_SUCCESS when
 * the peer is not stopped, or is not ours to look at (another machine or pid
 * namespace). */
/* 'T' when every thread of pid is stopped, 't' when every one is stopped
 * or held by a tracer and one is held, else 0: the leader's state alone is
 * not enough (under strace -p, or gdb's non-stop mode, the leader may sit in
 * 't' while another thread drives the communicator). */
static char threads_stopped(pid_t pid) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  char all = 'T';
  int seen = 0;
  for (struct dirent *e; all && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char *end;
    const long tid = strtol(e->d_name, &end, 10);
    if (*end || tid <= 0) continue;
    const char *fields = gw__proc_stat_fields(pid, (pid_t)tid, buf, sizeof buf);
    if (!fields) continue; /* a thread that just ended */
    const char st = fields[0];
    if (st == 't') all = 't';
    else if (st != 'T') all = 0;
    seen++;
  }
  closedir(d);
  return seen ? all : 0;
}

gw_result_t gw__stopped_peer_error(struct gw_comm *comm, int peer, const struct gw_opdesc *d, const char *what,
                                   double waited, struct gw_errctx *err) {
  const char leader = peer_pid_state(comm, peer);
  if (leader != 'T' && leader != 't') return GW_SUCCESS;
  const char state = threads_stopped(comm->peers[peer].pid);
  if (!state) return GW_SUCCESS;
  char me[GW_OPDESC_TEXT];
  gw__describe_op(d, me, sizeof me);
  return gw__err(err, GW_ERR_TIMEOUT,
                 "rank %d: operation %s waited %.1f s for %s rank %d, whose process (pid %d on this machine) is "
                 "stopped (%s; raise GW_TIMEOUT for ranks to wait longer on a stopped one)",
                 comm->rank, me, waited, what, peer, (int)comm->peers[peer].pid,
                 state == 't' ? "held by a debugger or tracer" : "SIGSTOP, or Ctrl-Z at its terminal");
}

static gw_result_t stopped_peer_error(struct prims *p, const struct gw_conn *c, const char *what, double waited) {
  return gw__stopped_peer_error(p->comm, c->peer, &p->op->desc, what, waited, p->err);
}

bool gw__peer_alive(const struct gw_comm *comm, int peer) {
  return !gw__alive_lock_gone(comm, peer) && peer_pid_runs(comm, peer) != 0;
}

/* What a wait does only now and then: every ~1024 slow steps, about a second. */
static bool slow_check_due(const struct gw_waiter *w) {
  return gw__waiter_done_spinning(w) && (w->iter & 1023) == 0;
}

/* While a wait drags on, look whether the rank we wait for (on this machine)
 * died (kill -9, crash): fail within a second or so instead of at the
 * deadline.  Returns true when it is dead. */
static bool waited_peer_dead(struct prims *p, const struct gw_waiter *w, int peer) {
  return slow_check_due(w) && !gw__peer_alive(p->comm, peer);
}

/* Its liveness lock went with its communicator: a process still running
 * (its pid says so) destroyed the communicator, or is on its way out. */
static gw_result_t dead_peer_error(struct prims *p, int peer) {
  char me[GW_OPDESC_TEXT];
  gw__describe_op(&p->op->desc, me, sizeof me);
  const struct gw_peer_info *pi = &p->comm->peers[peer];
  const bool runs = peer_pid_runs(p->comm, peer) == 1;
  return gw__err(p->err, GW_ERR_REMOTE, "rank %d: rank %d (pid %d %s) %s during operation %s", p->comm->rank, peer,
                 (int)pi->pid, pi->pidns == p->comm->peers[p->comm->rank].pidns ? "on this machine"
                                                                                : "in another pid namespace here",
                 runs ? "left the communicator (destroyed it while its peers still called, or is exiting)"
                      : "is gone (it died, or exited after fewer calls than this rank made)",
                 me);
}

static gw_result_t aborted_error(struct prims *p) {
  char me[GW_OPDESC_TEXT], why[GW_ERRMSG_MAX];
  gw__describe_op(&p->op->desc, me, sizeof me);
  gw__abort_reason(p->comm, why, sizeof why);
  return gw__err(p->err, GW_ERR_ABORTED, "rank %d: operation %s stopped: %.400s", p->comm->rank, me, why);
}

/* One wait step for connection `awaited`: past the spinning phase, where it
 * has file descriptors (tcp), sleep in poll() on every connection's until one
 * is ready (at most 1 ms, then look again); otherwise the common back-off.
 * (An shm wait beside an idle socket slept its whole millisecond in poll: shm
 * has nothing to wake it, so a tree or exchange over shm and tcp paid about
 * 1 ms per shm step once spinning ended.)  False once the deadline has passed
 * or the communicator was aborted (the caller tells which by `aborted`). */
static bool wait_step(struct prims *p, struct gw_waiter *w, const struct gw_conn *awaited) {
  if (atomic_load_explicit(&p->comm->aborted, memory_order_relaxed)) return false;
  if (gw__waiter_done_spinning(w) && awaited->tp->pollfds) {
    struct pollfd fds[GW_PRIMS_MAX_CONNS * 16];
    int n = 0;
    for (int i = 0; i < p->nconns; i++)
      if (p->conns[i]->tp->pollfds) n += p->conns[i]->tp->pollfds(p->conns[i], fds + n, 16);
    if (n > 0) {
      poll(fds, (nfds_t)n, 1);
      w->iter++; /* counts the slow steps here too (slow_check_due) */
      return !gw__waiter_expired(w);
    }
  }
  return gw__waiter_pause(w);
}

/* The receiver's rank failed and said so beside the FIFO (recv_abandon):
 * its reason, forwarded; GW_SUCCESS when it did not. */
static gw_result_t abandoned_error(struct prims *p, struct gw_conn *c) {
  char why[GW_ERRMSG_MAX];
  if (!c->is_send || !c->tp->send_abandoned || !c->tp->send_abandoned(c, why, sizeof why)) return GW_SUCCESS;
  return gw__err(p->err, GW_ERR_REMOTE, "rank %d: %s%s", p->comm->rank, GW_FORWARDED, gw__root_cause(why));
}

/* A data-path call failed: let the transport say why (it keeps the message),
 * and name the operation and connection it failed in. */
static gw_result_t conn_error(struct prims *p, struct gw_conn *c, gw_result_t r) {
  char op[GW_OPDESC_TEXT];
  /* the receiver said why before it closed: that, not the close, is the cause */
  GW_CHECK(abandoned_error(p, c));
  gw__describe_op(&p->op->desc, op, sizeof op);
  if (c->tp->progress) {
    gw_result_t r2 = c->tp->progress(c, p->err);
    if (r2 != GW_SUCCESS && r2 != GW_INPROGRESS) {
      size_t len = strlen(p->err->msg);
      snprintf(p->err->msg + len, sizeof p->err->msg - len, " (in %s, %s)", op, c->desc);
      return r2;
    }
  }
  return gw__err(p->err, r, "rank %d: %s failed in %s", p->comm->rank, c->desc, op);
}

/* A failure travels rank to rank as an abort notice.  Each rank reports the
 * ORIGINAL message behind one fixed prefix, never a growing chain of them, so
 * the root cause (which rank, what happened) survives any number of hops. */

const char *gw__root_cause(const char *msg) {
  for (;;) {
    const char *f = strstr(msg, GW_FORWARDED);
    if (!f || strncmp(msg, "rank ", 5) != 0 || f - msg > 16) return msg; /* "rank N: " + prefix */
    msg = f + strlen(GW_FORWARDED);
  }
}

/* A received header against this rank's own call: a peer's abort notice, a
 * different call or a wrong size are errors naming the peer. */
/* A peer's abort notice (h, its reason in data) as this rank's failure. */
static gw_result_t notice_error(const struct gw_comm *comm, const struct gw_chunk_hdr *h, const void *data,
                                struct gw_errctx *err) {
  char msg[GW_ERRMSG_MAX];
  size_t len = GW_MIN((size_t)h->bytes, sizeof msg - 1);
  memcpy(msg, data, len);
  msg[len] = 0;
  return gw__err(err, GW_ERR_REMOTE, "rank %d: %s%s", comm->rank, GW_FORWARDED, gw__root_cause(msg));
}

/* Whether a header holds what no call of this job makes: a code out of its
 * range, a flag bit no call sets, or an operation number more than 2^20 from
 * this rank's (a peer is at most an operation or a FIFO of broadcasts
 * ahead); why[len] says which.  Damage TCP's checksum missed (a bit flip in
 * a NIC or a switch's memory: about 1 in 2^16 of damaged segments passes),
 * or a writer other than the peer: it was said as calls that differ. */
bool gw__header_impossible(const struct gw_opdesc *theirs, uint64_t my_seq, char *why, size_t len) {
  const uint64_t far = 1ull << 20;
  if (theirs->coll < GW_COLL_ALLREDUCE || theirs->coll > GW_COLL_STATUS)
    snprintf(why, len, "collective code %u", (unsigned)theirs->coll);
  else if (theirs->dtype >= GW_NUM_DTYPES) snprintf(why, len, "data type code %u", (unsigned)theirs->dtype);
  else if (theirs->op >= GW_NUM_OPS) snprintf(why, len, "reduction code %u", (unsigned)theirs->op);
  else if (theirs->pad >> 6) /* (bits 0-5: GW_DESC_*, comm.h) */
    snprintf(why, len, "flags 0x%02x, with bits no call sets", (unsigned)theirs->pad);
  else if (theirs->seq == 0 || theirs->seq > my_seq + far || theirs->seq + far < my_seq)
    snprintf(why, len, "operation #%llu, where this rank is at #%llu", (unsigned long long)theirs->seq,
             (unsigned long long)my_seq);
  else
    return false;
  return true;
}

static gw_result_t check_header(struct prims *p, struct gw_conn *c, const struct gw_chunk_hdr *h, const void *data,
                                size_t bytes) {
  struct gw_opdesc theirs = h->op;
  if (theirs.coll == GW_COLL_ABORT) return notice_error(p->comm, h, data, p->err);
  char bad[96];
  if (memcmp(&theirs, &p->op->desc, sizeof theirs) != 0 &&
      gw__header_impossible(&theirs, p->op->desc.seq, bad, sizeof bad)) {
    char me[GW_OPDESC_TEXT];
    gw__describe_op(&p->op->desc, me, sizeof me);
    return gw__err(p->err, GW_ERR_REMOTE,
                   "rank %d: in operation %s, a chunk from rank %d (%s) holds a header no call makes (%s): its bytes "
                   "were damaged on the way (the network, a NIC or memory; TCP's checksum misses some damage), or "
                   "something other than rank %d wrote to the connection", p->comm->rank, me, c->peer, c->desc, bad,
                   c->peer);
  }
  if (memcmp(&theirs, &p->op->desc, sizeof theirs) != 0) {
    char me[GW_OPDESC_TEXT], them[GW_OPDESC_TEXT];
    gw__describe_op(&p->op->desc, me, sizeof me);
    gw__describe_op(&theirs, them, sizeof them);
    return gw__err(p->err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: collective calls differ across ranks: this rank called %s but rank %d called %s",
                   p->comm->rank, me, c->peer, them);
  }
  if (h->bytes != bytes)
    return gw__err(p->err, GW_ERR_INTERNAL, "rank %d: chunk %u from rank %d has %u bytes, expected %zu",
                   p->comm->rank, h->step, c->peer, h->bytes, bytes);
  return GW_SUCCESS;
}

/* recv_peek past the wait statuses at c's head: each is kept on c (the last
 * one, when it names ranks of this communicator) and released, so that no
 * caller sees one (see tell_status). */
static gw_result_t peek_data(const struct gw_comm *comm, struct gw_conn *c, const struct gw_chunk_hdr **h,
                             const void **data) {
  gw_result_t r;
  while ((r = c->tp->recv_peek(c, h, data)) == GW_SUCCESS && (*h)->op.coll == GW_COLL_STATUS) {
    struct gw_wait_status st;
    if ((*h)->bytes >= sizeof st) {
      memcpy(&st, *data, sizeof st);
      if (st.waits_on == -1) /* withdrawn: that wait is over */
        c->status_seq = 0;
      else if (st.waits_on >= 0 && st.waits_on < comm->nranks && st.end >= 0 && st.end < comm->nranks && st.hops > 0)
        c->status = st, c->status_seq = (*h)->op.seq + 1;
    }
    if ((r = c->tp->recv_release(c)) != GW_SUCCESS) return r;
  }
  /* a chunk after the status: the wait it told of is over (a later one tells again) */
  if (r == GW_SUCCESS) c->status_seq = 0;
  return r;
}

/* A peek that only looks: whether a chunk is at c's head (a sender that
 * closed may owe nothing more, so that is no failure here; see gw_conn.look). */
static bool look_peek(const struct gw_comm *comm, struct gw_conn *c, const struct gw_chunk_hdr **h,
                      const void **data) {
  c->look = true;
  const bool got = peek_data(comm, c, h, data) == GW_SUCCESS;
  c->look = false;
  return got;
}

gw_result_t gw__notice_on(struct gw_comm *comm, struct gw_conn *c, struct gw_errctx *err) {
  const struct gw_chunk_hdr *h;
  const void *data;
  if (c->is_send || !c->tp || !look_peek(comm, c, &h, &data) || h->op.coll != GW_COLL_ABORT) return GW_SUCCESS;
  return notice_error(comm, h, data, err);
}

gw_result_t gw__heard_abort(struct gw_comm *comm, struct gw_errctx *err) {
  struct gw_conn *extra[GW_EXTRA_CONNS];
  for (int ch = 0; ch < comm->nchannels; ch++) GW_CHECK(gw__notice_on(comm, &comm->rings[ch].recv, err));
  for (int i = 0, ne = gw__extra_conns(comm, extra); i < ne; i++) GW_CHECK(gw__notice_on(comm, extra[i], err));
  return GW_SUCCESS;
}

/* Now and then in a long wait: the operation this rank runs, published on
 * the communicator's connections whose transport has a place for it (shm:
 * every one; tcp: the one awaited, back to its sender), and what the peers
 * published there while they waited.  The same
 * operation number with another call is a mismatch no chunk shows when every
 * rank waits before its first send: at 3 ranks, one rank's tree or
 * recursive-doubling allreduce against the others' broadcast (the root's
 * tree waits for its children, the broadcast's ranks for the root's data)
 * hung until the deadline, which blamed a rank "stuck, or called something
 * else".  A peer's publication of another operation number says nothing. */
static gw_result_t waiting_differs(struct prims *p, double waited, const struct gw_conn *awaited) {
  struct gw_comm *comm = p->comm;
  struct gw_conn *conns[2 * GW_MAX_CHANNELS + GW_EXTRA_CONNS];
  int n = 0;
  for (int ch = 0; ch < comm->nchannels; ch++) conns[n++] = &comm->rings[ch].send, conns[n++] = &comm->rings[ch].recv;
  n += gw__extra_conns(comm, conns + n);
  const struct gw_opdesc *mine = &p->op->desc;
  for (int i = 0; i < n; i++) {
    struct gw_conn *c = conns[i];
    struct gw_opdesc theirs;
    /* where a transport publishes only sometimes (tcp): on the connection
     * this rank waits to receive on, before it sent anything in the
     * operation (as every rank in such a standoff has) */
    if (!c->tp || !c->tp->waiting || !c->tp->waiting(c, mine, waited, c == awaited && p->sent == 0, &theirs))
      continue;
    if (theirs.seq != mine->seq || memcmp(&theirs, mine, sizeof theirs) == 0) continue;
    char me[GW_OPDESC_TEXT], them[GW_OPDESC_TEXT];
    gw__describe_op(mine, me, sizeof me);
    gw__describe_op(&theirs, them, sizeof them);
    return gw__err(p->err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: collective calls differ across ranks: this rank called %s but rank %d called %s (both "
                   "waited, neither call sends first)", comm->rank, me, c->peer, them);
  }
  return GW_SUCCESS;
}

/* The heads of the watched connections: a later operation's chunk may wait
 * there (its sender is ahead), but a chunk of this operation means its sender
 * called something else (or runs it on other connections), and an abort notice
 * means it failed.  An abort notice at the head of one of this operation's own
 * receiving connections is a failure too, heard while this rank waits on
 * another connection (a slot wait on a peer blocked further on hears the
 * straggler named this way).  Now and then, or at every step (`now`: in a
 * grace, which may be shorter than the now-and-then).  awaited: the
 * connection the wait is to receive on (NULL: a wait to send). */
static gw_result_t look_at_watched(struct prims *p, const struct gw_waiter *w, const struct gw_conn *awaited,
                                   bool now) {
  if (!now && !slow_check_due(w)) return GW_SUCCESS;
  if (slow_check_due(w)) GW_CHECK(waiting_differs(p, gw__now() - w->start, awaited));
  for (int i = 0; i < p->nconns; i++) {
    struct gw_conn *c = p->conns[i];
    const struct gw_chunk_hdr *h;
    const void *data;
    /* and a chunk of this operation unlike ours: the sender called something
     * else (a 2-rank broadcast whose ranks both took themselves for the root
     * filled each other's FIFO and waited for room until the deadline: the
     * root looks at its receiving side only at the end) */
    if (!c->is_send && look_peek(p->comm, c, &h, &data) &&
        (h->op.coll == GW_COLL_ABORT ||
         (h->op.seq == p->op->desc.seq && memcmp(&h->op, &p->op->desc, sizeof h->op) != 0)))
      return check_header(p, c, h, data, h->bytes);
  }
  for (int i = 0; i < p->nwatch; i++) {
    struct gw_conn *c = p->watch[i];
    const struct gw_chunk_hdr *h;
    const void *data;
    if (!look_peek(p->comm, c, &h, &data)) continue;
    if (h->op.coll != GW_COLL_ABORT && h->op.seq != p->op->desc.seq) continue;
    GW_CHECK(check_header(p, c, h, data, h->bytes));
    char me[GW_OPDESC_TEXT];
    gw__describe_op(&p->op->desc, me, sizeof me);
    return gw__err(p->err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: rank %d runs operation %s on other connections (%s) than this rank; do GW_ALGO "
                   "and GW_NCHANNELS agree on every rank?", p->comm->rank, c->peer, me, c->desc);
  }
  return GW_SUCCESS;
}

/* Everything c queued in user space leaves it (or the wait fails). */
static gw_result_t drain(struct prims *p, struct gw_conn *c) {
  struct gw_waiter w;
  const double limit = p->comm->timeout_s; /* a wait keeps the limit it started with (gradwire.h) */
  gw__waiter_init(&w, limit);
  for (;;) {
    gw_result_t r = c->tp->progress(c, p->err);
    if (r == GW_SUCCESS) return GW_SUCCESS;
    if (r != GW_INPROGRESS) { /* the receiver's reason, if it said one before it closed */
      GW_CHECK(abandoned_error(p, c));
      return r;
    }
    GW_CHECK(pump(p));
    GW_CHECK(look_at_watched(p, &w, NULL, false));
    /* a receiver that stopped reading because it failed says why beside the
     * stream, now and then (as a wait for room hears it: here the whole
     * timeout passed, and the healthy receiver was blamed for a straggler
     * further on) */
    if (slow_check_due(&w)) GW_CHECK(abandoned_error(p, c));
    if (wait_step(p, &w, c)) continue;
    if (p->comm->aborted) return aborted_error(p);
    GW_CHECK(abandoned_error(p, c));
    GW_CHECK(stopped_peer_error(p, c, "its socket to drain towards", gw__now() - w.start));
    char me[GW_OPDESC_TEXT]; /* (bytes stuck in flight towards a machine cut off: a broadcast root's last step) */
    gw__describe_op(&p->op->desc, me, sizeof me);
    GW_CHECK(net_timeout_error(p, c, gw__now() - w.start, "its socket to drain towards", me));
    return timeout_error(p, "its socket to drain towards", c->peer, limit);
  }
}

/* Before an operation completes, everything it sent must have left user space. */
gw_result_t gw__flush(struct prims *p) {
  for (int i = 0; i < p->nconns; i++)
    if (p->conns[i]->is_send && p->conns[i]->tp->progress) GW_CHECK(drain(p, p->conns[i]));
  return GW_SUCCESS;
}

/* How much longer a rank whose peer had started the operation waits, after its
 * deadline, for the notice of the rank that names the straggler: from the
 * limit the wait started with (the communicator's, set to 0 meanwhile, made
 * the grace endless: a wait under way keeps its limit, gradwire.h). */
static double grace_s(double limit) { return limit < 10 ? limit : 10; }

/* A slot got (r): room for the chunk, or an internal error (a chunk larger
 * than the transport's slot would overrun it; every caller sizes chunks to
 * fit, so this only guards against a change that breaks that).  The device
 * ring's chunks are larger than the host slot: their payload goes to the
 * slot's device twin, only the header through the host FIFO. */
static gw_result_t slot_got(struct prims *p, struct gw_conn *c, gw_result_t r, size_t bytes, size_t cap) {
  if (r != GW_SUCCESS) return conn_error(p, c, r);
  if (bytes <= cap || p->dev) return GW_SUCCESS;
  return gw__err(p->err, GW_ERR_INTERNAL, "rank %d: a chunk of %zu bytes for rank %d, whose %s slots hold %zu",
                 p->comm->rank, bytes, c->peer, c->tp->name, cap);
}

/* The receiver's rank failed and said so beside the FIFO (recv_abandon): its
 * abort notice to this rank may sit behind data this rank has not taken
 * (it holds a chunk while it waits here), so this is how it hears. */
static gw_result_t receiver_gave_up(struct prims *p, struct gw_conn *c, const struct gw_waiter *w, bool now) {
  return !now && !slow_check_due(w) ? GW_SUCCESS : abandoned_error(p, c);
}

gw_result_t gw__wait_slot(struct prims *p, struct gw_conn *c, size_t bytes, void **slot) {
  size_t cap;
  c->proto = p->op->proto;
  gw_result_t r = c->tp->send_slot(c, bytes, slot, &cap);
  if (r != GW_INPROGRESS) return slot_got(p, c, r, bytes, cap);
  struct gw_waiter w;
  double since = 0; /* the first waiter's start, once the grace below restarted it */
  const double limit = p->comm->timeout_s;
  gw__waiter_init(&w, limit);
  while ((r = c->tp->send_slot(c, bytes, slot, &cap)) == GW_INPROGRESS) {
    GW_CHECK(pump(p));
    GW_CHECK(look_at_watched(p, &w, NULL, since > 0));
    GW_CHECK(receiver_gave_up(p, c, &w, since > 0));
    /* it may have freed the slot just before it exited: look once more */
    if (waited_peer_dead(p, &w, c->peer) && c->tp->send_slot(c, bytes, slot, &cap) == GW_INPROGRESS)
      return dead_peer_error(p, c->peer);
    if (wait_step(p, &w, c)) continue;
    if (p->comm->aborted) return aborted_error(p);
    GW_CHECK(stopped_peer_error(p, c, "room at", gw__now() - (since > 0 ? since : w.start)));
    /* the peer took some of what this rank posted in this operation when
     * more went in than its FIFO holds (the oldest chunks left first) */
    const bool took = c->depth && c->sent_seq == p->op->desc.seq && c->sent_n > c->depth;
    if (since > 0 || !took) return slot_timeout_error(p, c, gw__now() - (since > 0 ? since : w.start), took);
    since = w.start;
    gw__waiter_init(&w, grace_s(limit));
  }
  return slot_got(p, c, r, bytes, cap);
}

/* Counts c's posts in this operation (gw__wait_slot's proof that the peer took some). */
static inline void count_post(struct gw_conn *c, uint64_t seq) {
  if (c->sent_seq != seq) c->sent_seq = seq, c->sent_n = 0;
  c->sent_n++;
}

gw_result_t gw__post(struct prims *p, struct gw_conn *c, size_t bytes) {
  struct gw_chunk_hdr h = {.op = p->op->desc, .bytes = (uint32_t)bytes, .step = p->sent++};
  count_post(c, h.op.seq);
  gw_result_t r = c->tp->send_post(c, &h);
  return r == GW_SUCCESS ? r : conn_error(p, c, r);
}

gw_result_t gw__post_direct(struct prims *p, struct gw_conn *c, const void *src, size_t bytes) {
  struct gw_chunk_hdr h = {.op = p->op->desc, .bytes = (uint32_t)bytes, .step = p->sent++};
  count_post(c, h.op.seq);
  gw_result_t r = c->tp->send_direct(c, &h, src);
  return r == GW_SUCCESS ? r : conn_error(p, c, r);
}

/* This rank's wait on c's peer ran past its deadline (`deadline`), or in the
 * grace what that peer told of its own wait changed: tell the ranks this operation
 * sends to, which may be waiting on this rank, whom it waits on and the end
 * of the line of waits beyond (what c's peer told), so that their waits
 * name that end rather than this rank, which waits itself.  Every rank's
 * deadline runs out at about the same moment, and in a pipelined operation
 * every wait is on a peer that sent already, so on machines that cannot see
 * each other's processes (comm/prims.c's stopped check) the ranks behind a
 * stopped one blamed their healthy predecessors.  Best effort: a full FIFO
 * skips that peer (it has not taken this rank's data, so it does not wait
 * on any from here).  Not on the device ring's connection, whose slots pair
 * with device-memory twins by a count of data chunks alone. */
/* st on each of the operation's sending connections with room (see tell_status). */
static void post_status(struct prims *p, const struct gw_wait_status *st) {
  for (int i = 0; i < p->nconns; i++) {
    struct gw_conn *to = p->conns[i];
    if (!to->is_send || !to->tp || (p->comm->devring && to == &p->comm->rings[0].send)) continue;
    void *slot;
    size_t cap;
    if (to->tp->send_slot(to, sizeof *st, &slot, &cap) != GW_SUCCESS || cap < sizeof *st) continue;
    memcpy(slot, st, sizeof *st);
    struct gw_chunk_hdr h = {.op = p->op->desc, .bytes = sizeof *st};
    h.op.coll = GW_COLL_STATUS;
    to->tp->send_post(to, &h);
  }
}

static void tell_status(struct prims *p, const struct gw_conn *c, bool deadline) {
  struct gw_wait_status st = {
      .waits_on = c->peer, .end = c->peer, .hops = 1, .end_started = c->seen_seq == p->op->desc.seq + 1};
  const struct gw_wait_status *beyond = live_status(p, c);
  /* a line that leads back here (calls that differ?) is not passed round
   * again: the ends would go round it until the grace ran out */
  if (beyond && beyond->end == p->comm->rank && !deadline) return;
  if (beyond && beyond->end != p->comm->rank) {
    st.end = beyond->end, st.end_started = beyond->end_started;
    st.hops = (uint16_t)(beyond->hops < UINT16_MAX ? beyond->hops + 1 : UINT16_MAX);
  }
  if (p->dev || (!deadline && p->told && p->told_end == st.end)) return;
  p->told = true, p->told_end = st.end;
  post_status(p, &st);
}

/* The wait this rank told of is over (its chunk came within the grace): the
 * ranks told hear so.  A chunk after the status says it as well, but a rank
 * that had sent its last chunk of the operation before would send none, and
 * its successor, already waiting in the next one, would go on reading the
 * status as holding (and name the rank it told of, were this one to stop
 * there). */
static void withdraw_status(struct prims *p) {
  if (!p->told) return;
  p->told = false;
  const struct gw_wait_status st = {.waits_on = -1, .end = -1};
  post_status(p, &st);
}

gw_result_t gw__wait_recv(struct prims *p, struct gw_conn *c, const void **data, size_t bytes) {
  const struct gw_chunk_hdr *h;
  c->expect = (uint32_t)bytes, c->proto = p->op->proto;
  gw_result_t r = peek_data(p->comm, c, &h, data);
  if (r == GW_INPROGRESS) {
    struct gw_waiter w;
    double since = 0; /* the first waiter's start, once the grace below restarted it */
    double part = 1;  /* the part of the grace this wait takes, once in it */
    double grace_at = 0; /* when the grace began */
    const double limit = p->comm->timeout_s;
    const uint64_t in_op = p->op->desc.seq + 1;
    gw__waiter_init(&w, limit);
    while ((r = peek_data(p->comm, c, &h, data)) == GW_INPROGRESS) {
      GW_CHECK(pump(p));
      GW_CHECK(look_at_watched(p, &w, c, since > 0));
      /* it may have posted the chunk just before it exited: look once more */
      if (waited_peer_dead(p, &w, c->peer) && peek_data(p->comm, c, &h, data) == GW_INPROGRESS)
        return dead_peer_error(p, c->peer);
      if (since > 0) {
        /* in the grace: pass on what the peer told of its wait; a peer that
         * said it waits in this operation is not the straggler, so the wait
         * takes the whole grace, for the notice of the rank that names one */
        tell_status(p, c, false);
        if (part < 1 && live_status(p, c)) {
          const double left = grace_s(limit) - (gw__now() - grace_at);
          part = 1;
          if (left > 0) gw__waiter_init(&w, left);
          continue;
        }
      }
      if (wait_step(p, &w, c)) continue;
      if (p->comm->aborted) return aborted_error(p);
      /* the deadline passed, so w.start is set: the messages say the whole wait */
      GW_CHECK(stopped_peer_error(p, c, "data from", gw__now() - (since > 0 ? since : w.start)));
      if (since > 0) return recv_timeout_error(p, c, gw__now() - since);
      /* inside the operation: a peer that sent here, or said it waits, waits
       * on someone else (the whole grace); one that may wait before its first
       * send here, the algorithm's staggered part of it (see grace_part); one
       * that may be finishing the operation before, a short part (prev_part) */
      part = c->seen_seq == in_op || live_status(p, c) ? 1 : p->grace_part > 0 ? p->grace_part : p->prev_part;
      if (part <= 0) return recv_timeout_error(p, c, gw__now() - w.start);
      since = w.start, grace_at = gw__now();
      tell_status(p, c, true);
      gw__waiter_init(&w, grace_s(limit) * part);
    }
    if (r == GW_SUCCESS) withdraw_status(p);
  }
  if (r != GW_SUCCESS) return conn_error(p, c, r);
  GW_CHECK(check_header(p, c, h, *data, bytes));
  c->seen_seq = p->op->desc.seq + 1;
  return GW_SUCCESS;
}

gw_result_t gw__release(struct prims *p, struct gw_conn *c) {
  (void)p;
  return c->tp->recv_release(c);
}

/* Best effort: one abort notice on one sending connection, if it has room
 * now.  True when it is done with (posted, or the connection failed). */
static bool abort_one(struct gw_comm *comm, struct gw_conn *c, const struct gw_opdesc *desc, const char *msg) {
  if (!c->tp) return true;
  void *slot;
  size_t cap, want = GW_MIN(strlen(msg), (size_t)comm->conn_params.slot_bytes);
  gw_result_t r = c->tp->send_slot(c, want, &slot, &cap);
  if (r == GW_INPROGRESS) return false;
  if (r != GW_SUCCESS) return true;
  size_t len = GW_MIN(strlen(msg), cap);
  memcpy(slot, msg, len);
  struct gw_chunk_hdr h = {.op = *desc, .bytes = (uint32_t)len};
  h.op.coll = GW_COLL_ABORT;
  c->tp->send_post(c, &h);
  return true;
}

/* Every peer this rank sends to hears of the failure, on the ring, both trees
 * and recursive doubling's links: whichever of them a neighbour waits on, it
 * fails at once and passes the notice on to its own neighbours.  Connections
 * with room get it at once; a full FIFO means the peer is busy or stuck (the
 * one this rank timed out on, often), so those are tried again for half a
 * second in all, not one after another (a full ring FIFO held the notice to
 * every other peer back that long). */
void gw__send_abort(struct gw_comm *comm, const struct gw_opdesc *desc, const char *msg) {
  struct gw_conn *to[GW_MAX_CHANNELS + GW_EXTRA_CONNS], *extra[GW_EXTRA_CONNS];
  bool done[GW_MAX_CHANNELS + GW_EXTRA_CONNS] = {false};
  int n = 0;
  for (int ch = 0; ch < comm->nchannels; ch++) to[n++] = &comm->rings[ch].send;
  for (int i = 0, ne = gw__extra_conns(comm, extra); i < ne; i++)
    if (extra[i]->is_send) to[n++] = extra[i];
  /* And every peer that sends here: one waiting for room in this rank's
   * FIFO would not see the notice, queued behind data it has not taken. */
  for (int ch = 0; ch < comm->nchannels; ch++)
    if (comm->rings[ch].recv.tp && comm->rings[ch].recv.tp->recv_abandon)
      comm->rings[ch].recv.tp->recv_abandon(&comm->rings[ch].recv, msg);
  for (int i = 0, ne = gw__extra_conns(comm, extra); i < ne; i++)
    if (!extra[i]->is_send && extra[i]->tp && extra[i]->tp->recv_abandon) extra[i]->tp->recv_abandon(extra[i], msg);
  struct gw_waiter w;
  gw__waiter_init(&w, 0.5);
  for (bool all = false; !all;) {
    all = true;
    for (int i = 0; i < n; i++) all &= done[i] = done[i] || abort_one(comm, to[i], desc, msg);
    if (!all && !gw__waiter_pause(&w)) break;
  }
  /* A transport that queues in user space (tcp) may hold the notice behind
   * the failed operation's frames, and nothing else will move them: push for
   * up to a second. */
  gw__waiter_init(&w, 1.0);
  for (;;) {
    bool queued = false;
    for (int i = 0; i < n; i++) {
      struct gw_errctx ignored;
      if (to[i]->tp && to[i]->tp->progress && to[i]->tp->progress(to[i], &ignored) == GW_INPROGRESS) queued = true;
    }
    if (!queued || !gw__waiter_pause(&w)) return;
  }
}
