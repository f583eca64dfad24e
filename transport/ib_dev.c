/* ib_dev.c - the ib transport's process-wide state (ib.c has the connections):
 * the HCA ports, found and opened once per process (GW_IB_HCA, GW_IB_GID_INDEX,
 * GW_IB_DISABLE), the registration cache behind gw_comm_register, and the
 * messages that need no connection (completion status hints, async events,
 * RoCE version mismatch). */
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ib_dev.h"
#include "transport.h"

/* ---- devices: opened once per process ------------------------------------------------ */
struct gw_ib_devs gw__ib_devs = {.once = PTHREAD_ONCE_INIT};

static const char *mtu_str(enum ibv_mtu m) {
  static const char *s[] = {"?", "256", "512", "1024", "2048", "4096"};
  return (unsigned)m < 6 ? s[m] : "?";
}

/* "RoCE v2" and the like, for messages. */
const char *gw__ib_gid_type_name(int type) {
  return type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
         : type == IBV_GID_TYPE_IB    ? "InfiniBand" : "unknown type";
}

/* A RoCE port's GID when GW_IB_GID_INDEX is unset, as NCCL picks it: of the
 * version GW_IB_ROCE_VERSION asks (default 2: routable, what RoCE fabrics run;
 * index 0 is a v1 link-local GID on ConnectX, which reaches no other subnet),
 * then an IPv4-mapped address before a global IPv6 one before a link-local
 * one, the lowest index among equals.  A port without the version asked uses
 * the other, and says so.  -1 when the table has no usable entry. */
static int pick_gid(struct ibv_context *ctx, uint8_t port, int tbl_len, const char *name, union ibv_gid *gid,
                    int *type) {
  const struct gw_ibv *v = gw__ib_devs.v;
  const int64_t want_env = gw__env_int("GW_IB_ROCE_VERSION", 2);
  const int want = want_env == 1 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2; /* others refused at connect */
  int best = -1, best_score = -1;
  for (int i = 0; i < tbl_len && i < 256; i++) {
    struct ibv_gid_entry e;
    if (v->query_gid_ex(ctx, port, (uint32_t)i, &e, 0) != 0) continue; /* ENODATA: an empty entry */
    static const uint8_t zero[16];
    if (!memcmp(e.gid.raw, zero, 16) || (e.gid_type != IBV_GID_TYPE_ROCE_V1 && e.gid_type != IBV_GID_TYPE_ROCE_V2))
      continue;
    const bool v4 = !memcmp(e.gid.raw, zero, 10) && e.gid.raw[10] == 0xff && e.gid.raw[11] == 0xff;
    const bool link_local = e.gid.raw[0] == 0xfe && (e.gid.raw[1] & 0xc0) == 0x80;
    const int score = ((int)e.gid_type == want) * 4 + (v4 ? 2 : link_local ? 0 : 1);
    if (score > best_score) best = i, best_score = score, *gid = e.gid, *type = (int)e.gid_type;
  }
  if (best >= 0 && *type != want)
    GW_INFO(GW_SUB_INIT, "ib: %s port %u has no %s GID: using index %d (%s)", name, port,
            gw__ib_gid_type_name(want), best, gw__ib_gid_type_name(*type));
  return best;
}

/* The partition the port's QPs join: GW_IB_PKEY (an index into the port's
 * P_Key table, as NCCL_IB_PKEY), else the first full-member key (top bit
 * set; on partitioned fabrics and SR-IOV InfiniBand, Azure's, index 0 is often
 * the default partition's limited key, and two limited members cannot talk),
 * else index 0.  False (said) when GW_IB_PKEY names no key. */
static bool pick_pkey(struct ibv_context *ctx, uint8_t port, struct ib_port *pt, const char *name) {
  const struct gw_ibv *v = gw__ib_devs.v;
  const int64_t want = gw__env_int("GW_IB_PKEY", -1);
  __be16 k = 0;
  if (want >= 0) {
    if (want > 0xffff || v->query_pkey(ctx, port, (int)want, &k) != 0 || !(be16toh(k) & 0x7fff)) {
      GW_WARN(GW_SUB_INIT, "ib: %s port %u has no P_Key at index %lld (GW_IB_PKEY): not used", name, port,
              (long long)want);
      return false;
    }
    pt->pkey_index = (int)want, pt->pkey = be16toh(k);
    return true;
  }
  pt->pkey_index = 0, pt->pkey = 0xffff;
  const int len = pt->attr.pkey_tbl_len ? GW_MIN((int)pt->attr.pkey_tbl_len, 128) : 1;
  bool first = true;
  for (int i = 0; i < len; i++) {
    if (v->query_pkey(ctx, port, i, &k) != 0 || !(be16toh(k) & 0x7fff)) continue; /* an empty entry */
    if (first) pt->pkey_index = i, pt->pkey = be16toh(k), first = false;
    if (be16toh(k) & 0x8000) {
      pt->pkey_index = i, pt->pkey = be16toh(k);
      break;
    }
  }
  if (!(pt->pkey & 0x8000))
    GW_INFO(GW_SUB_INIT, "ib: %s port %u is a limited member of every partition it has (P_Key 0x%04x at index %d): "
            "it reaches only full members", name, port, pt->pkey, pt->pkey_index);
  return true;
}

gw_result_t gw__ib_pkey_agree(const struct ib_port *port, uint16_t peer_pkey, int self, int peer,
                              struct gw_errctx *err) {
  const uint16_t mine = port->pkey;
  if ((mine & 0x7fff) == (peer_pkey & 0x7fff) && ((mine | peer_pkey) & 0x8000)) return GW_SUCCESS;
  const bool same = (mine & 0x7fff) == (peer_pkey & 0x7fff);
  return gw__err(err, GW_ERR_INVALID_ARGUMENT,
                 "rank %d: its %s is in partition P_Key 0x%04x (index %d) and rank %d's port in 0x%04x: %s (choose "
                 "the index of a shared full-member key with GW_IB_PKEY on every machine)",
                 self, port->name, mine, port->pkey_index, peer, peer_pkey,
                 same ? "both limited members, which cannot reach each other" : "different partitions never meet");
}

/* Opens one device and takes its port `want` (0: the first active one). */
static bool open_port(struct ibv_device *dev, uint8_t want, bool named) {
  const struct gw_ibv *v = gw__ib_devs.v;
  const char *name = v->get_device_name(dev);
  /* RC queue pairs with RDMA WRITE WITH IMM brought up by hand: InfiniBand
   * and RoCE HCAs.  An iWARP device cannot, and AWS's EFA (no transport type,
   * SRD queue pairs) makes no RC queue pair at all: offered as ib, such a
   * device failed every connection between machines instead of leaving them
   * to tcp. */
  if (dev->transport_type != IBV_TRANSPORT_IB) {
    if (named || gw__log_level >= GW_LOG_INFO)
      gw__log(named ? GW_LOG_WARN : GW_LOG_INFO, GW_SUB_INIT, __FILE__, __LINE__,
              "ib: %s is not an InfiniBand or RoCE device (transport type %d, node type %s): not used", name,
              (int)dev->transport_type, ibv_node_type_str(dev->node_type));
    return false;
  }
  struct ibv_context *ctx = v->open_device(dev);
  if (!ctx) {
    GW_WARN(GW_SUB_INIT, "ib: cannot open %s: %s", name, strerror(errno));
    return false;
  }
  struct ibv_device_attr da;
  if (v->query_device(ctx, &da) != 0) da.phys_port_cnt = 1;
  /* (unsigned: a uint8_t counter wrapped after 255, and GW_IB_HCA=dev:255 went on to ports 0, 1, ...) */
  for (unsigned p = want ? want : 1u; p <= (want ? want : da.phys_port_cnt); p++) {
    struct ib_port *pt = &gw__ib_devs.ports[gw__ib_devs.n];
    memset(pt, 0, sizeof *pt);
    if (v->query_port(ctx, p, &pt->attr) != 0) {
      if (named) GW_WARN(GW_SUB_INIT, "ib: %s has no port %u", name, p);
      continue;
    }
    if (pt->attr.state != IBV_PORT_ACTIVE) {
      if (named) GW_WARN(GW_SUB_INIT, "ib: %s port %u is not active (state %d); not used", name, p, pt->attr.state);
      continue;
    }
    if (pt->attr.link_layer != IBV_LINK_LAYER_ETHERNET && pt->attr.link_layer != IBV_LINK_LAYER_INFINIBAND) {
      if (named) GW_WARN(GW_SUB_INIT, "ib: %s port %u has link layer %d, neither InfiniBand nor Ethernet: not used", name,
                         p, (int)pt->attr.link_layer);
      continue;
    }
    pt->eth = pt->attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    int64_t gi = gw__env_int("GW_IB_GID_INDEX", -1);
    if (!pt->eth && gi < 0 && pt->attr.lid == 0) { /* routed by LID: without one nothing reaches it */
      GW_WARN(GW_SUB_INIT, "ib: %s port %u has no LID (is a subnet manager running?): not used", name, p);
      continue;
    }
    pt->gid_type = pt->eth ? -1 : IBV_GID_TYPE_IB;
    if (gi < 0 && pt->eth) {
      gi = pick_gid(ctx, p, pt->attr.gid_tbl_len, name, &pt->gid, &pt->gid_type);
      if (gi < 0) {
        GW_WARN(GW_SUB_INIT, "ib: %s port %u (RoCE) has no RoCE GID (no IP address on its interface?): not used",
                name, p);
        continue;
      }
    } else if (gi >= 0) {
      struct ibv_gid_entry e;
      static const uint8_t zero[16];
      /* (past the table before the cast: 4294967296 was index 0) */
      if (gi >= pt->attr.gid_tbl_len || v->query_gid(ctx, p, (int)gi, &pt->gid) != 0) {
        GW_WARN(GW_SUB_INIT, "ib: %s port %u has no GID index %lld (GW_IB_GID_INDEX; its table has %d): not used",
                name, p, (long long)gi, pt->attr.gid_tbl_len);
        continue;
      }
      /* libibverbs reads an empty entry as the zero GID: no peer reaches it */
      if (!memcmp(pt->gid.raw, zero, sizeof zero)) {
        GW_WARN(GW_SUB_INIT, "ib: %s port %u: GID index %d (GW_IB_GID_INDEX) is empty (no address on the interface for "
                "it?): not used", name, p, (int)gi);
        continue;
      }
      if (pt->eth && v->query_gid_ex(ctx, p, (uint32_t)gi, &e, 0) == 0) pt->gid_type = (int)e.gid_type;
    }
    /* InfiniBand routed by LID: the GID at index 0 (always valid: the port's
     * subnet prefix and GUID) still goes in the handle, for the peer's choice
     * of the port on this one's subnet (pick_port) and for a peer routing by
     * GID (GW_IB_GID_INDEX there alone): it was all zeros, every port
     * "matched", and rails ordered differently on two hosts were crossed. */
    if (!pt->eth && gi < 0 && v->query_gid(ctx, p, 0, &pt->gid) != 0) memset(&pt->gid, 0, sizeof pt->gid);
    pt->gid_index = (int)gi;
    if (!pick_pkey(ctx, p, pt, name)) continue;
    pt->pd = v->alloc_pd(ctx);
    if (!pt->pd) {
      GW_WARN(GW_SUB_INIT, "ib: cannot allocate a protection domain on %s: %s", name, strerror(errno));
      continue;
    }
    snprintf(pt->name, sizeof pt->name, "%s:%u", name, p);
    pt->ctx = ctx;
    pt->num = (uint8_t)p;
    GW_INFO(GW_SUB_INIT, "ib: using %s (%s, %s %u%s%s, MTU %s%s)", pt->name, pt->eth ? "RoCE" : "InfiniBand",
            pt->gid_index >= 0 ? "GID index" : "LID", pt->gid_index >= 0 ? (unsigned)pt->gid_index : pt->attr.lid,
            pt->eth ? " " : "", pt->eth ? gw__ib_gid_type_name(pt->gid_type) : "", mtu_str(pt->attr.active_mtu),
            v == &gw__ibv_emu ? ", emulated" : "");
    gw__ib_devs.n++;
    if (!want || gw__ib_devs.n == IB_MAX_PORTS) return true; /* the first active port of the device */
  }
  if (!gw__ib_devs.n || gw__ib_devs.ports[gw__ib_devs.n - 1].ctx != ctx) v->close_device(ctx);
  return gw__ib_devs.n > 0;
}

/* ---- async events -------------------------------------------------------------------- */
static void on_event(int first, const struct ibv_async_event *ev) {
  struct ib_port *ports = gw__ib_devs.ports;
  const struct ibv_context *ctx = ports[first].ctx;
  switch (ev->event_type) {
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE:
      for (int k = first; k < gw__ib_devs.n; k++) {
        if (ports[k].ctx != ctx || ports[k].num != ev->element.port_num) continue;
        const int down = ev->event_type == IBV_EVENT_PORT_ERR;
        if (atomic_exchange(&ports[k].link_down, down) == down) continue;
        if (down)
          GW_WARN(GW_SUB_INIT, "ib: %s went down (IBV_EVENT_PORT_ERR): its connections fail if it stays down "
                  "past the queue pairs' retries", ports[k].name);
        else
          GW_INFO(GW_SUB_INIT, "ib: %s is active again (IBV_EVENT_PORT_ACTIVE)", ports[k].name);
      }
      break;
    case IBV_EVENT_DEVICE_FATAL:
      for (int k = first; k < gw__ib_devs.n; k++)
        if (ports[k].ctx == ctx && !atomic_exchange(&ports[k].fatal, 1))
          GW_WARN(GW_SUB_INIT, "ib: %s failed (IBV_EVENT_DEVICE_FATAL): the HCA needs a reset (see dmesg)",
                  ports[k].name);
      break;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
      if (ev->element.qp->qp_context) atomic_store((atomic_int *)ev->element.qp->qp_context, 1 + (int)ev->event_type);
      break;
    case IBV_EVENT_CQ_ERR:
      if (ev->element.cq->cq_context) atomic_store((atomic_int *)ev->element.cq->cq_context, 1 + (int)ev->event_type);
      break;
    default:
      GW_INFO(GW_SUB_INIT, "ib: %s: async event %s", ports[first].name, ibv_event_type_str(ev->event_type));
  }
}

static pthread_mutex_t events_mu = PTHREAD_MUTEX_INITIALIZER;

void gw__ib_events(bool now_please) {
  static _Atomic double next;
  const double now = gw__now();
  if (!now_please && (now < atomic_load_explicit(&next, memory_order_relaxed) || pthread_mutex_trylock(&events_mu) != 0))
    return;
  if (now_please) pthread_mutex_lock(&events_mu);
  atomic_store_explicit(&next, now + 0.01, memory_order_relaxed);
  for (int p = 0; p < gw__ib_devs.n; p++) {
    int first = 0; /* each device once: its first port */
    while (gw__ib_devs.ports[first].ctx != gw__ib_devs.ports[p].ctx) first++;
    if (first != p) continue;
    struct ibv_async_event ev;
    for (int k = 0; k < 64 && gw__ib_devs.v->get_async_event(gw__ib_devs.ports[p].ctx, &ev) == 0; k++) {
      on_event(p, &ev);
      gw__ib_devs.v->ack_async_event(&ev);
    }
  }
  pthread_mutex_unlock(&events_mu);
}

/* Device (GPU) buffers: an HCA can write GPU memory directly (GPUDirect RDMA)
 * when the peer-memory module (nvidia_peermem) is loaded; dma-buf export needs a
 * GPU driver too.  Device buffers do not reach the transports yet (the
 * collectives stage them), so this is only reported, once. */
static const char *gdr_support(void) {
  if (access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 || access("/sys/module/nvidia_peermem", F_OK) == 0)
    return "possible (nvidia_peermem is loaded)";
  if (access("/proc/driver/nvidia/version", F_OK) == 0) return "unavailable (no nvidia_peermem; dma-buf not tried)";
  return "unavailable (no NVIDIA driver)";
}

/* GW_IB_HCA: "mlx5_0:1,mlx5_1" (device[:port], several allowed); unset: the first
 * device with an active port.  GW_IB_DISABLE=1 turns the transport off. */
static void regs_fork_guard(void);

static void ib_init(void) {
  /* A parent's channel thread inside either at a fork left it held in the
   * child for good: the child's own communicator hung at its first
   * registration or device event. */
  gw__fork_guard(&events_mu);
  regs_fork_guard();
  if (gw__env_int("GW_IB_DISABLE", 0)) return;
  gw__ib_devs.v = gw__ibv();
  /* Registered pages kept out of forked children (a data loader's workers,
   * multiprocessing): on kernels before 5.13 a fork made them copy-on-write
   * and the HCA went on reading the pages the process no longer used (stale
   * chunks, lost credits); NCCL does the same.  Newer kernels need nothing
   * (libibverbs then does nothing).  GW_IB_FORK_INIT=0 leaves it to the
   * program (RDMAV_FORK_SAFE). */
  if (gw__env_int("GW_IB_FORK_INIT", 1)) {
    const int e = gw__ib_devs.v->fork_init();
    if (e)
      GW_WARN(GW_SUB_INIT, "ib: ibv_fork_init: %s (memory was registered before, by another library?): on kernels "
              "before 5.13 a fork while a communicator lives can corrupt its transfers; set RDMAV_FORK_SAFE=1 at "
              "the start", strerror(e));
  }
  int ndev = 0;
  struct ibv_device **list = gw__ib_devs.v->get_device_list(&ndev);
  if (!list) return;
  const char *hca = gw__env_str("GW_IB_HCA", NULL);
  if (!hca) {
    for (int i = 0; i < ndev && !gw__ib_devs.n; i++) open_port(list[i], 0, false);
  } else {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", hca);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && gw__ib_devs.n < IB_MAX_PORTS; tok = strtok_r(NULL, ",", &save)) {
      char *colon = strchr(tok, ':');
      uint8_t port = 0;
      if (colon) {
        /* 1..255 (a port number is 8 bits): atoi's 257 was port 1, "abc" every port */
        *colon = 0;
        char *end = NULL;
        errno = 0;
        const long v = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || errno || v < 1 || v > 255) {
          GW_WARN(GW_SUB_INIT, "ib: GW_IB_HCA names port '%s' of %s, which is no port number (1..255): not used",
                  colon + 1, tok);
          continue;
        }
        port = (uint8_t)v;
      }
      int i = 0;
      while (i < ndev && strcmp(gw__ib_devs.v->get_device_name(list[i]), tok) != 0) i++;
      if (i == ndev) {
        char names[160] = "";
        for (int k = 0; k < ndev; k++)
          snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                   gw__ib_devs.v->get_device_name(list[k]));
        GW_WARN(GW_SUB_INIT, "ib: GW_IB_HCA names %s, which is not among this machine's devices (%s)", tok,
                ndev ? names : "none");
        continue;
      }
      open_port(list[i], port, true);
    }
  }
  gw__ib_devs.v->free_device_list(list);
  if (gw__ib_devs.n) GW_INFO(GW_SUB_INIT, "ib: GPUDirect RDMA %s; device buffers are staged through the registered host slots",
                     gdr_support());
}

bool gw__ib_available(void) {
  pthread_once(&gw__ib_devs.once, ib_init);
  return gw__ib_devs.n > 0;
}

bool gw__ib_usable(void) {
  if (!gw__ib_available()) return false;
  gw__ib_events(true);
  for (int k = 0; k < gw__ib_devs.n; k++)
    if (!atomic_load(&gw__ib_devs.ports[k].fatal)) return true;
  return false;
}

/* ---- the registration cache: user buffers registered once per process ------------------ */
/* gw_comm_register's ranges, each registered with every open port (one MR per
 * port: the PD is per port).  A range inside one already registered takes a
 * reference on it instead of registering again, whichever communicator asks;
 * the data path holds the registration that covers a chunk until the writes
 * that read it completed (gw__ib_reg_hold), so a gw_comm_deregister on another
 * communicator meanwhile cannot pull the MR from under them: the last user
 * reference takes the range out of the lookups at once, the MRs go with the
 * last hold. */
struct ib_reg {
  uintptr_t lo, hi;
  struct ibv_mr *mr[IB_MAX_PORTS];
  int refs;  /* gw_comm_register references (views) */
  int holds; /* connections with writes from it in flight */
};
/* One gw_comm_register call: its own range, on the registration that covers
 * it.  Lookups match views, not registrations: a range registered inside
 * another kept the outer one visible after the outer was deregistered, and
 * memory mapped there later (its pages no longer the registered ones) passed
 * the lookup and went out as the stale pinned pages. */
struct ib_view {
  uintptr_t lo, hi;
  struct ib_reg *reg;
};
static struct {
  pthread_mutex_t lock;
  struct ib_view *v[256]; /* the ranges lookups see */
  int n;
  /* for tests: ibv_reg_mr and ibv_dereg_mr calls here, chunks sent from user memory */
  atomic_ulong reg_calls, direct_chunks, dereg_calls;
} regs = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void regs_fork_guard(void) { gw__fork_guard(&regs.lock); }

unsigned long gw__ib_stat(int which) {
  return which == 0   ? atomic_load(&regs.reg_calls)
         : which == 1 ? atomic_load(&regs.direct_chunks)
                      : atomic_load(&regs.dereg_calls);
}

static void reg_free(struct ib_reg *r) {
  for (int p = 0; p < gw__ib_devs.n; p++) {
    if (!r->mr[p]) continue; /* a failed device's: never registered */
    gw__ib_devs.v->dereg_mr(r->mr[p]);
    atomic_fetch_add(&regs.dereg_calls, 1);
  }
  free(r);
}

/* The lock guards the lookups and counts only: ibv_reg_mr and ibv_dereg_mr of
 * gigabytes take seconds (more with several ports), and every direct-send
 * check on every channel thread took the lock meanwhile. */
gw_result_t gw__ib_register(void *buf, size_t bytes, void **handle, struct gw_errctx *err) {
  *handle = NULL;
  if (!gw__ib_available()) return GW_SUCCESS; /* nothing to register with */
  uintptr_t lo = (uintptr_t)buf, hi = lo + bytes;
  const int cap = (int)(sizeof regs.v / sizeof regs.v[0]);
  struct ib_view *view = calloc(1, sizeof *view);
  if (!view) return gw__err(err, GW_ERR_SYSTEM, "gw_comm_register: out of memory");
  *view = (struct ib_view){.lo = lo, .hi = hi};
  pthread_mutex_lock(&regs.lock);
  /* Inside a live view, not merely inside a registration: the span of one
   * whose outer range was deregistered (kept for an inner view) may hold
   * memory mapped since, whose pages are not the pinned ones; a reference on
   * it sent the stale pages (the lookups' rule, gw__ib_reg_hold's). */
  for (int i = 0; i < regs.n && regs.n < cap; i++)
    if (regs.v[i]->lo <= lo && hi <= regs.v[i]->hi) {
      view->reg = regs.v[i]->reg;
      view->reg->refs++;
      regs.v[regs.n++] = view;
      *handle = view;
      pthread_mutex_unlock(&regs.lock);
      return GW_SUCCESS;
    }
  const bool full = regs.n == cap;
  pthread_mutex_unlock(&regs.lock);
  struct ib_reg *r = full ? NULL : calloc(1, sizeof *r);
  if (!r) {
    free(view);
    return gw__err(err, GW_ERR_SYSTEM, "gw_comm_register: out of memory or more than %d registered ranges", cap);
  }
  *r = (struct ib_reg){.lo = lo, .hi = hi, .refs = 1};
  for (int p = 0; p < gw__ib_devs.n; p++) {
    /* Not with a device that failed for good (IBV_EVENT_DEVICE_FATAL: detached,
     * every call EIO; no connection uses it again): registration failed on
     * every port for one dead HCA.  Its sends find no key and are staged. */
    if (atomic_load(&gw__ib_devs.ports[p].fatal)) continue;
    /* Only ever a send source: local read, which every MR allows (LOCAL_WRITE
     * would refuse read-only mappings and break copy-on-write of private ones). */
    r->mr[p] = gw__ib_devs.v->reg_mr(gw__ib_devs.ports[p].pd, buf, bytes, 0);
    atomic_fetch_add(&regs.reg_calls, 1);
    if (!r->mr[p]) {
      int e = errno;
      gw_result_t res = gw__err(err, GW_ERR_SYSTEM, "gw_comm_register: cannot register %zu bytes at %p with %s: %s%s",
                                bytes, buf, gw__ib_devs.ports[p].name, strerror(e),
                                e == ENOMEM ? " (the locked-memory limit is too low: raise `ulimit -l`)" : "");
      while (p-- > 0)
        if (r->mr[p]) gw__ib_devs.v->dereg_mr(r->mr[p]);
      free(r);
      free(view);
      return res;
    }
  }
  view->reg = r;
  pthread_mutex_lock(&regs.lock);
  const bool room = regs.n < cap; /* others registered meanwhile */
  if (room) regs.v[regs.n++] = view, *handle = view;
  pthread_mutex_unlock(&regs.lock);
  if (room) return GW_SUCCESS;
  r->refs = 0;
  reg_free(r);
  free(view);
  return gw__err(err, GW_ERR_SYSTEM, "gw_comm_register: more than %d registered ranges", cap);
}

void gw__ib_deregister(void *handle) {
  if (!handle) return;
  struct ib_reg *gone = NULL;
  pthread_mutex_lock(&regs.lock);
  for (int i = 0; i < regs.n; i++) {
    if (regs.v[i] != handle) continue;
    struct ib_view *view = regs.v[i];
    struct ib_reg *r = view->reg;
    regs.v[i] = regs.v[--regs.n]; /* no new lookups of its range: the memory may be unmapped next */
    free(view);
    if (--r->refs == 0 && r->holds == 0) gone = r;
    break;
  }
  pthread_mutex_unlock(&regs.lock);
  if (gone) reg_free(gone); /* unreachable now: no view, no hold */
}

uint32_t gw__ib_reg_hold(int p, const void *src, size_t len, struct ib_reg **held, int *nheld, int max) {
  uintptr_t lo = (uintptr_t)src, hi = lo + len;
  uint32_t key = 0;
  pthread_mutex_lock(&regs.lock);
  for (int i = 0; i < regs.n && !key; i++) {
    if (regs.v[i]->lo > lo || hi > regs.v[i]->hi || !regs.v[i]->reg->mr[p]) continue;
    struct ib_reg *r = regs.v[i]->reg;
    int k = 0;
    while (k < *nheld && held[k] != r) k++;
    if (k == *nheld) {
      if (*nheld == max) break; /* holding as many as it may: staged instead */
      r->holds++;
      held[(*nheld)++] = r;
    }
    key = r->mr[p]->lkey;
  }
  pthread_mutex_unlock(&regs.lock);
  return key;
}

void gw__ib_reg_release(struct ib_reg **held, int *nheld) {
  if (*nheld == 0) return;
  int ngone = 0; /* the ones to free, gathered at the front of held (emptied anyway) */
  pthread_mutex_lock(&regs.lock);
  for (int k = 0; k < *nheld; k++)
    if (--held[k]->holds == 0 && held[k]->refs == 0) held[ngone++] = held[k];
  *nheld = 0;
  pthread_mutex_unlock(&regs.lock);
  for (int k = 0; k < ngone; k++) reg_free(held[k]);
}

void gw__ib_count_direct(void) { atomic_fetch_add(&regs.direct_chunks, 1); }

/* ---- messages ------------------------------------------------------------------------ */
const char *gw__ib_status_hint(enum ibv_wc_status s) {
  switch (s) {
    case IBV_WC_RETRY_EXC_ERR:
      return "the peer is unreachable or dead: check the link (ibstat), GW_IB_GID_INDEX on RoCE, and whether the "
             "peer process still runs";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "the peer posted no receive in time (receiver not ready)";
    case IBV_WC_REM_ACCESS_ERR: return "the peer refused the write: a wrong rkey or an address outside its slots";
    case IBV_WC_LOC_PROT_ERR: return "a local buffer is not registered";
    case IBV_WC_WR_FLUSH_ERR: return "flushed: the queue pair failed earlier (see the first error on either side)";
    default: return "see ibv_wc_status_str";
  }
}

gw_result_t gw__ib_async_text(int ev, bool is_send, int peer, char *msg, size_t n) {
  switch (ev) {
    case IBV_EVENT_QP_ACCESS_ERR:
      snprintf(msg, n,
               "this rank's queue pair refused %s of rank %d's (IBV_EVENT_QP_ACCESS_ERR: a wrong rkey, or an address "
               "outside the registered %s)",
               is_send ? "a credit write" : "a write", peer, is_send ? "credit words" : "slots");
      return GW_ERR_REMOTE;
    case IBV_EVENT_QP_REQ_ERR:
      snprintf(msg, n,
               "the queue pair failed (IBV_EVENT_QP_REQ_ERR: rank %d's HCA sent a request this one could not take)",
               peer);
      return GW_ERR_REMOTE;
    case IBV_EVENT_CQ_ERR:
      snprintf(msg, n, "the completion queue failed (IBV_EVENT_CQ_ERR: overrun)");
      return GW_ERR_INTERNAL;
    default:
      snprintf(msg, n, "the queue pair failed (%s: a local error)", ibv_event_type_str((enum ibv_event_type)ev));
      return GW_ERR_SYSTEM;
  }
}

/* RoCE v1 and v2 frames differ (v2 is UDP/IP): QPs whose GIDs differ in type
 * never reach each other, and would fail only after the retry timeout. */
gw_result_t gw__ib_roce_agree(const struct ib_port *port, int peer_type, int self, int peer, struct gw_errctx *err) {
  const int mine = port->gid_type;
  if (!port->eth || mine < 0 || peer_type < 0 || mine == peer_type) return GW_SUCCESS;
  return gw__err(err, GW_ERR_INVALID_ARGUMENT,
                 "rank %d: its %s uses a %s GID (index %d) and rank %d's port a %s one: both ends of a connection "
                 "must use the same RoCE version (GW_IB_ROCE_VERSION, or GW_IB_GID_INDEX, alike on every machine)",
                 self, port->name, gw__ib_gid_type_name(mine), port->gid_index, peer, gw__ib_gid_type_name(peer_type));
}

/* The first packet sequence number of queue pair i of a connection's sending
 * (receiver 0) or receiving (1) end: from the connection's random nonce,
 * which both ends know, so each expects the other's.  Random, not 0: a
 * destroyed QP's packets still being retried (seconds) could otherwise land
 * in a new QP given the same number by the HCA, whose expected PSN they
 * matched (rdma-core's examples draw them at random too). */
uint32_t gw__ib_qp_psn(uint64_t nonce, int receiver, uint32_t i) {
  uint64_t x = nonce ^ ((uint64_t)receiver << 32 | i) ^ 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)(x ^ (x >> 31)) & 0xffffff;
}
