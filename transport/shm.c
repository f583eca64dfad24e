/* shm.c - the shared-memory transport: one connection is a POSIX shared-memory
 * segment created by the receiver, holding a control block (head/tail counters on
 * their own cache lines, one chunk header per slot) and the slots.  The sender
 * writes chunks by direct stores into the slot (the collective reduces straight
 * into it), then publishes by storing the chunk's position into the slot's
 * header line; the receiver polls that line, consumes in place and advances head.
 * A chunk of at most GW_SHM_INLINE bytes travels inside its header line, so a
 * small message costs the receiver one cache-line transfer, not three.  Segments are created 0600, pre-faulted once, and unlinked as soon
 * as both sides have mapped them, so no crash leaves files in /dev/shm after setup.
 * Not here: waiting (the caller's policy) and any notion of a collective. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport.h"

#define SHM_MAGIC 0x67777368u /* "gwsh" */
#define SHM_MAX_SLOTS 64

#define GW_SHM_INLINE 24
/* One cache line per slot: the flag, the header and a small payload together. */
struct shm_line {
  _Atomic uint64_t pos; /* 1 + the chunk's position in the stream once published */
  struct gw_chunk_hdr hdr;
  uint8_t inline_data[GW_SHM_INLINE];
};
_Static_assert(sizeof(struct shm_line) == GW_CACHELINE, "a slot header is one cache line");

struct shm_ctrl {
  _Atomic uint64_t head; /* chunks released; written by the receiver only */
  char pad1[GW_CACHELINE - sizeof(uint64_t)];
  uint32_t magic, nslots, slot_bytes, pad2;
  char pad2b[GW_CACHELINE - 4 * sizeof(uint32_t)];
  struct shm_line line[SHM_MAX_SLOTS];
};

struct shm_handle {
  char name[64];
  uint64_t size;
  uint32_t nslots, slot_bytes;
};
_Static_assert(sizeof(struct shm_handle) <= GW_CONN_HANDLE_BYTES, "shm handle fits the opaque handle");

struct shm_conn {
  struct shm_ctrl *ctrl;
  uint8_t *slots;
  size_t map_size;
  uint32_t nslots, slot_bytes;
  uint64_t pos;       /* sender: next chunk to fill; receiver: next chunk to read */
  uint64_t peer_pos;  /* sender: cached copy of the receiver's head */
  char name[64];
  bool owner_unlinked;
};

static size_t data_offset(void) { return GW_ALIGN_UP(sizeof(struct shm_ctrl), 4096); }

static bool shm_can_connect(const struct gw_peer_info *self, const struct gw_peer_info *peer) {
  return strcmp(self->node_id, peer->node_id) == 0;
}

static gw_result_t shm_recv_setup(struct gw_conn *c, const struct gw_conn_params *p,
                                  struct gw_conn_handle *out, struct gw_errctx *err) {
  static _Atomic uint32_t counter;
  gw_result_t res = GW_SUCCESS;
  if (p->nslots < 2 || p->nslots > SHM_MAX_SLOTS || p->slot_bytes < 64 || p->slot_bytes % 64)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: shm FIFO of %u slots x %u bytes is not allowed (2..%d slots, bytes a multiple of 64)",
                   c->self, p->nslots, p->slot_bytes, SHM_MAX_SLOTS);
  struct shm_conn *s = calloc(1, sizeof *s);
  if (!s) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  s->nslots = p->nslots;
  s->slot_bytes = p->slot_bytes;
  s->map_size = data_offset() + (size_t)p->nslots * p->slot_bytes;
  snprintf(s->name, sizeof s->name, "/gw-%08llx-%d-%d-%d-%u", (unsigned long long)(p->job_hash & 0xffffffffu),
           c->peer, c->self, (int)getpid(), atomic_fetch_add(&counter, 1));

  int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: shm_open(%s) failed: %s (is /dev/shm mounted and writable?)",
                  c->self, s->name, strerror(errno));
    goto fail_free;
  }
  if (ftruncate(fd, (off_t)s->map_size) != 0) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: sizing %s to %zu bytes failed: %s (is /dev/shm full?)",
                  c->self, s->name, s->map_size, strerror(errno));
    goto fail_unlink;
  }
  /* MAP_POPULATE: first-touch page faults are very slow on some machines, so all of
   * the FIFO is faulted in now, once per communicator, never on the data path. */
  void *m = mmap(NULL, s->map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (m == MAP_FAILED) {
    res = gw__err(err, GW_ERR_SYSTEM, "rank %d: mmap of %s (%zu bytes) failed: %s", c->self, s->name,
                  s->map_size, strerror(errno));
    goto fail_unlink;
  }
  close(fd);
  s->ctrl = m;
  s->slots = (uint8_t *)m + data_offset();
  atomic_store(&s->ctrl->head, 0);
  for (uint32_t i = 0; i < SHM_MAX_SLOTS; i++) atomic_store(&s->ctrl->line[i].pos, 0);
  s->ctrl->nslots = s->nslots;
  s->ctrl->slot_bytes = s->slot_bytes;
  s->ctrl->magic = SHM_MAGIC;

  struct shm_handle h = {.size = s->map_size, .nslots = s->nslots, .slot_bytes = s->slot_bytes};
  snprintf(h.name, sizeof h.name, "%s", s->name);
  memset(out, 0, sizeof *out);
  memcpy(out->bytes, &h, sizeof h);
  c->priv = s;
  return GW_SUCCESS;

fail_unlink:
  close(fd);
  shm_unlink(s->name);
fail_free:
  free(s);
  return res;
}

static gw_result_t shm_send_connect(struct gw_conn *c, const struct gw_conn_params *p,
                                    const struct gw_conn_handle *in, struct gw_errctx *err) {
  struct shm_handle h;
  memcpy(&h, in->bytes, sizeof h);
  h.name[sizeof h.name - 1] = 0;
  if (h.nslots != p->nslots || h.slot_bytes != p->slot_bytes)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT,
                   "rank %d: rank %d's shm FIFO has %u x %u bytes, this rank expects %u x %u "
                   "(set the same GW_SHM_SLOTS / GW_SHM_SLOT_BYTES on every rank)",
                   c->self, c->peer, h.nslots, h.slot_bytes, p->nslots, p->slot_bytes);
  struct shm_conn *s = calloc(1, sizeof *s);
  if (!s) return gw__err(err, GW_ERR_SYSTEM, "rank %d: out of memory", c->self);
  int fd = shm_open(h.name, O_RDWR, 0600);
  if (fd < 0) {
    gw_result_t res = gw__err(err, GW_ERR_SYSTEM, "rank %d: cannot open rank %d's segment %s: %s",
                              c->self, c->peer, h.name, strerror(errno));
    free(s);
    return res;
  }
  void *m = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int mmap_errno = errno;
  close(fd);
  /* Both ends are mapped now: drop the name so nothing outlives the processes. */
  shm_unlink(h.name);
  if (m == MAP_FAILED) {
    free(s);
    return gw__err(err, GW_ERR_SYSTEM, "rank %d: mmap of rank %d's segment %s failed: %s", c->self,
                   c->peer, h.name, strerror(mmap_errno));
  }
  s->ctrl = m;
  s->map_size = h.size;
  s->slots = (uint8_t *)m + data_offset();
  s->nslots = h.nslots;
  s->slot_bytes = h.slot_bytes;
  snprintf(s->name, sizeof s->name, "%s", h.name);
  if (s->ctrl->magic != SHM_MAGIC) {
    munmap(m, h.size);
    free(s);
    return gw__err(err, GW_ERR_REMOTE, "rank %d: segment %s from rank %d is not a gradwire FIFO",
                   c->self, h.name, c->peer);
  }
  c->priv = s;
  return GW_SUCCESS;
}

static gw_result_t shm_recv_connect(struct gw_conn *c, struct gw_errctx *err) {
  (void)err;
  struct shm_conn *s = c->priv;
  /* The sender unlinked already; this covers a sender that died after mapping. */
  shm_unlink(s->name);
  s->owner_unlinked = true;
  return GW_SUCCESS;
}

static gw_result_t shm_send_slot(struct gw_conn *c, size_t bytes, void **buf, size_t *cap) {
  struct shm_conn *s = c->priv;
  if (s->pos - s->peer_pos >= s->nslots) {
    s->peer_pos = atomic_load_explicit(&s->ctrl->head, memory_order_acquire);
    if (s->pos - s->peer_pos >= s->nslots) return GW_INPROGRESS;
  }
  uint32_t slot = (uint32_t)(s->pos % s->nslots);
  if (bytes <= GW_SHM_INLINE) {
    *buf = s->ctrl->line[slot].inline_data;
    *cap = GW_SHM_INLINE;
  } else {
    *buf = s->slots + (size_t)slot * s->slot_bytes;
    *cap = s->slot_bytes;
  }
  return GW_SUCCESS;
}

static gw_result_t shm_send_post(struct gw_conn *c, const struct gw_chunk_hdr *h) {
  struct shm_conn *s = c->priv;
  struct shm_line *l = &s->ctrl->line[s->pos % s->nslots];
  l->hdr = *h;
  s->pos++;
  atomic_store_explicit(&l->pos, s->pos, memory_order_release);
  return GW_SUCCESS;
}

static gw_result_t shm_recv_peek(struct gw_conn *c, const struct gw_chunk_hdr **h, const void **data) {
  struct shm_conn *s = c->priv;
  uint32_t slot = (uint32_t)(s->pos % s->nslots);
  struct shm_line *l = &s->ctrl->line[slot];
  if (atomic_load_explicit(&l->pos, memory_order_acquire) != s->pos + 1) return GW_INPROGRESS;
  *h = &l->hdr;
  *data = l->hdr.bytes <= GW_SHM_INLINE ? (const void *)l->inline_data
                                        : (const void *)(s->slots + (size_t)slot * s->slot_bytes);
  return GW_SUCCESS;
}

static gw_result_t shm_recv_release(struct gw_conn *c) {
  struct shm_conn *s = c->priv;
  s->pos++;
  atomic_store_explicit(&s->ctrl->head, s->pos, memory_order_release);
  return GW_SUCCESS;
}

static void shm_close(struct gw_conn *c) {
  struct shm_conn *s = c->priv;
  if (!s) return;
  if (!c->is_send && !s->owner_unlinked) shm_unlink(s->name);
  if (s->ctrl) munmap(s->ctrl, s->map_size);
  free(s);
  c->priv = NULL;
}

const struct gw_transport gw__shm_transport = {
    .name = "shm",
    .can_connect = shm_can_connect,
    .recv_setup = shm_recv_setup,
    .send_connect = shm_send_connect,
    .recv_connect = shm_recv_connect,
    .send_slot = shm_send_slot,
    .send_post = shm_send_post,
    .recv_peek = shm_recv_peek,
    .recv_release = shm_recv_release,
    .close = shm_close,
};
