/* safetensors_write.c - the safetensors writer of safetensors.h.
 *
 * The writer builds the header in memory, then writes the file atomically (a
 * temporary file next to the target, fsync, rename, fsync of the directory), so a
 * crash or an error never leaves a half-written weights file under the real name.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_internal.h"
#include "safetensors_internal.h"

/* ---- the writer --------------------------------------------------------------- */

/* A growing byte buffer; a failed allocation sticks in oom, checked once at the end. */
struct sbuf {
  char *p;
  size_t len, cap;
  int oom;
};

static void sb_put(struct sbuf *s, const char *x, size_t n) {
  if (s->oom) return;
  if (n > s->cap - s->len) {
    size_t ncap = s->cap ? s->cap : 256;
    while (ncap - s->len < n) ncap *= 2;
    char *q = realloc(s->p, ncap);
    if (!q) {
      s->oom = 1;
      return;
    }
    s->p = q, s->cap = ncap;
  }
  memcpy(s->p + s->len, x, n);
  s->len += n;
}

static void sb_str(struct sbuf *s, const char *x) { sb_put(s, x, strlen(x)); }

static void sb_u64(struct sbuf *s, uint64_t v) {
  char b[24];
  sb_put(s, b, (size_t)snprintf(b, sizeof b, "%llu", (unsigned long long)v));
}

/* A JSON string: quotes, backslashes and control bytes escaped, other bytes as is. */
static void sb_json(struct sbuf *s, const char *x) {
  sb_put(s, "\"", 1);
  for (; *x; x++) {
    unsigned char c = (unsigned char)*x;
    char e[8];
    if (c == '"' || c == '\\')
      sb_put(s, (char[]){'\\', (char)c}, 2);
    else if (c < 0x20)
      sb_put(s, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
    else
      sb_put(s, x, 1);
  }
  sb_put(s, "\"", 1);
}

/* What the reader would refuse is refused here: a file we write always reads back. */
static gw_result_t check_for_write(const char *path, const struct gw_st_tensor *t, int n) {
  for (int i = 0; i < n; i++) {
    struct gw__st_where w = {path, t[i].name};
    const struct gw__st_dtype *dt = gw__st_dtype_of(&t[i]);
    char shape[GW_ST_SHAPE_TEXT];
    size_t bytes = 0;
    if (!t[i].name || strcmp(t[i].name, "__metadata__") == 0)
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: tensor %d: no name, or the reserved __metadata__", path, i);
    if (!dt) return gw__st_bad(&w, "no safetensors dtype for dtype %d / \"%s\"", (int)t[i].dtype,
                        t[i].dtype_name ? t[i].dtype_name : "");
    if (t[i].ndim < 0 || t[i].ndim > GW_ST_MAX_NDIM) return gw__st_bad(&w, "ndim %d is not 0..%d", t[i].ndim, GW_ST_MAX_NDIM);
    gw_st_format_shape(shape, sizeof shape, t[i].shape, t[i].ndim);
    if (gw__st_shape_bytes(t[i].shape, t[i].ndim, dt->size, &bytes) != 0 || bytes != t[i].nbytes)
      return gw__st_bad(&w, "nbytes %zu does not match shape %s of %s", t[i].nbytes, shape, dt->name);
    if (bytes && !t[i].data) return gw__st_bad(&w, "no data");
  }
  const struct gw_st_tensor **by = malloc((n ? (size_t)n : 1) * sizeof *by);
  if (!by) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  for (int i = 0; i < n; i++) by[i] = &t[i];
  const char *dup = gw__st_sort_names(by, n);
  gw_result_t r = dup ? gw__st_bad(&(struct gw__st_where){path, dup}, "appears twice") : GW_SUCCESS;
  free(by);
  return r;
}

/* metadata (key, value, ..., NULL) as sorted pairs in a malloc'd *kv. */
static gw_result_t collect_metadata(const char *path, const char *const *metadata, const char ***kv, int *nkv) {
  int n = 0;
  while (metadata && metadata[2 * n]) {
    if (!metadata[2 * n + 1])
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: __metadata__ key \"%s\" has no value", path,
                            metadata[2 * n]);
    n++;
  }
  *kv = malloc((n ? 2 * (size_t)n : 1) * sizeof **kv);
  if (!*kv) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  if (n) memcpy(*kv, metadata, 2 * (size_t)n * sizeof **kv);
  *nkv = n;
  const char *dup = gw__st_sort_pairs(*kv, n);
  if (dup) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: __metadata__ key \"%s\" appears twice", path, dup);
  return GW_SUCCESS;
}

/* The header JSON, data_offsets packing the tensors in order, blank-padded to a
 * multiple of 8 bytes so the data section starts aligned (as the format's writers
 * do). */
static gw_result_t build_header(const char *path, struct sbuf *h, const struct gw_st_tensor *t, int n,
                                const char **kv, int nkv) {
  sb_str(h, "{");
  if (nkv) {
    sb_json(h, "__metadata__");
    for (int i = 0; i < nkv; i++) {
      sb_str(h, i ? "," : ":{");
      sb_json(h, kv[2 * i]);
      sb_str(h, ":");
      sb_json(h, kv[2 * i + 1]);
    }
    sb_str(h, "}");
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    if (i || nkv) sb_str(h, ",");
    sb_json(h, t[i].name);
    sb_str(h, ":{\"dtype\":");
    sb_json(h, gw__st_dtype_of(&t[i])->name);
    sb_str(h, ",\"shape\":[");
    for (int d = 0; d < t[i].ndim; d++) {
      if (d) sb_str(h, ",");
      sb_u64(h, (uint64_t)t[i].shape[d]);
    }
    sb_str(h, "],\"data_offsets\":[");
    sb_u64(h, off);
    sb_str(h, ",");
    sb_u64(h, off += t[i].nbytes);
    sb_str(h, "]}");
  }
  sb_str(h, "}");
  while (h->len % 8) sb_str(h, " ");
  if (h->oom) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory for the header", path);
  if (h->len > GW_ST_MAX_HEADER)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: a %zu-byte header is over the format's %u-byte limit", path,
                          h->len, GW_ST_MAX_HEADER);
  return GW_SUCCESS;
}

/* The test hook of safetensors.h: GW_SAFETENSORS_FAIL=step fails that step. */
static int fail_here(const char *step) {
  const char *e = getenv("GW_SAFETENSORS_FAIL");
  if (!e || strcmp(e, step) != 0) return 0;
  errno = EIO;
  return 1;
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  if (n && fail_here("write")) return -1;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return -1;
    p += k, n -= (size_t)k;
  }
  return 0;
}

static int write_contents(int fd, const struct sbuf *h, const struct gw_st_tensor *t, int n) {
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h->len >> (8 * i));
  if (write_all(fd, len, 8) != 0 || write_all(fd, h->p, h->len) != 0) return -1;
  for (int i = 0; i < n; i++)
    if (write_all(fd, t[i].data, t[i].nbytes) != 0) return -1;
  return 0;
}

uint32_t gw_st_host_tag(void) {
  char id[512] = "";
  gethostname(id, 255);
  size_t n = strlen(id);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t k = read(fd, id + n, sizeof id - n - 1);
    if (k > 0) n += (size_t)k;
    close(fd);
  }
  uint32_t h = 2166136261u; /* FNV-1a 32 */
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)id[i]) * 16777619u;
  return h;
}

/* path.tmp.<host tag>.<pid>.<k>: in path's directory (so rename is atomic), a name no other
 * writer of this process or another one uses (O_EXCL), created with 0666 so the
 * umask decides a new file's mode as it would for a plain open() (a file
 * replaced passes its own mode on: write_atomic).  Write
 * locked (an OFD lock, held until the rename) so a cleaner can tell a live
 * writer's temporary file from a dead one's: pids are reused, a container's
 * restarted writer often has its predecessor's. */
static int create_temp(const char *path, char **tmp) {
  static _Atomic unsigned counter;
  size_t cap = strlen(path) + 48;
  char *name = malloc(cap);
  if (!name) return errno = ENOMEM, -1;
  for (int tries = 0; tries < 64; tries++) {
    snprintf(name, cap, "%s.tmp.%08x.%ld.%u", path, gw_st_host_tag(), (long)getpid(), atomic_fetch_add(&counter, 1));
    int fd = fail_here("create") ? -1 : open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
      (void)fcntl(fd, F_OFD_SETLK, &fl); /* a file system without locks: the cleaner falls back to the pid */
      return *tmp = name, fd;
    }
    if (errno != EEXIST) break;
  }
  int e = errno;
  free(name);
  errno = e;
  return -1;
}

/* After the rename: the directory entry itself must reach the disk.  A file
 * system that cannot fsync a directory (EINVAL, ENOTSUP, EROFS: some network
 * and overlay mounts) gets a warning, once: the file is complete and in place,
 * and failing the save there ended runs at their first checkpoint. */
static gw_result_t sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  gw_result_t r = GW_SUCCESS;
  int bad = fd < 0 ? errno : fail_here("dirsync-eio") ? EIO : fail_here("dirsync") ? EINVAL : fsync(fd) ? errno : 0;
  if (fd >= 0 && (bad == EINVAL || bad == ENOTSUP || bad == EROFS)) {
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
      fprintf(stderr, "gradwire: warning: %s: written, but its directory cannot be synced here (%s): the new name "
              "may not survive a power loss on this file system\n", path, strerror(bad));
  } else if (bad) {
    errno = bad;
    r = gw__st_sys_fail(path, "written, but syncing its directory failed");
  }
  if (fd >= 0) close(fd);
  free(dir);
  return r;
}

/* Where a save of path goes, into *real (malloc'd): path itself or, when path is
 * a symbolic link, the file it names, so that the link stays a link (as a plain
 * open() and write through it would leave it) with the temporary file, the
 * rename and the directory sync beside the real file.  *mode: the permission
 * bits of the file replaced, or -1 where there is none.  A link to nothing is
 * refused: following it would create a file wherever it points (the mount
 * point of an unmounted volume, say), which is more likely a mistake; so is
 * anything but a regular file (a link to /dev/null, followed, and the rename
 * would replace the device node as root). */
static gw_result_t resolve_target(const char *path, char **real, int *mode) {
  struct stat st;
  *real = NULL, *mode = -1;
  int exists = lstat(path, &st) == 0;
  if (exists && S_ISLNK(st.st_mode)) {
    if (!(*real = realpath(path, NULL))) {
      if (errno != ENOENT) return gw__st_sys_fail(path, "cannot follow the symbolic link");
      char to[4096];
      ssize_t k = readlink(path, to, sizeof to - 1);
      to[k > 0 ? k : 0] = 0;
      return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: a symbolic link to \"%s\", which does not exist: not "
                            "saved (create the file it names, or remove the link)", path, to);
    }
    if (stat(*real, &st) != 0) return gw__st_sys_fail(*real, "cannot stat the file its symbolic link names");
  } else if (!(*real = strdup(path))) {
    return gw__model_fail(GW_ERR_SYSTEM, "%s: out of memory", path);
  }
  if (exists && !S_ISREG(st.st_mode)) { /* renamed over, a device node (as root) or a FIFO would be gone */
    gw_result_t r = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: not a regular file (%s): not replaced", *real,
                                   gw__st_file_kind(st.st_mode));
    free(*real);
    *real = NULL;
    return r;
  }
  if (exists) *mode = (int)(st.st_mode & 07777);
  return GW_SUCCESS;
}

/* Gives the temporary file the replaced file's permission bits.  A file system
 * that keeps no modes of its own (vfat, CIFS without Unix extensions: the mount
 * decides them) refuses with EPERM or EOPNOTSUPP: a warning, once, and the save
 * goes on with the mode the mount gives; failing it there ended runs at their
 * first checkpoint over an earlier one.  Other errors fail the save. */
static int keep_mode(const char *path, int fd, int mode) {
  int e = fail_here("chmod") ? EIO : fail_here("chmod-eperm") ? EPERM : fchmod(fd, (mode_t)mode) ? errno : 0;
  if (e == EPERM || e == EOPNOTSUPP || e == ENOTSUP) {
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
      fprintf(stderr, "gradwire: warning: %s: this file system does not take the replaced file's mode %04o (%s): "
              "the new file has the mode the mount gives\n", path, (unsigned)mode, strerror(e));
    return 0;
  }
  errno = e;
  return e ? -1 : 0;
}

/* mode: the replaced file's permissions, given to the temporary file before any
 * data is in it (-1: a new file, the umask's). */
static gw_result_t write_atomic(const char *path, int mode, const struct sbuf *h, const struct gw_st_tensor *t, int n) {
  char *tmp = NULL;
  int fd = create_temp(path, &tmp);
  if (fd < 0) return gw__st_sys_fail(path, "cannot create a temporary file next to it");
  gw_result_t r = GW_SUCCESS;
  if (mode >= 0 && keep_mode(path, fd, mode) != 0)
    r = gw__st_sys_fail(path, "cannot give the temporary file the mode of the file it replaces");
  else if (write_contents(fd, h, t, n) != 0)
    r = gw__st_sys_fail(path, "writing the temporary file failed");
  else if (fail_here("fsync") || fsync(fd) != 0)
    r = gw__st_sys_fail(path, "fsync of the temporary file failed");
  /* Renamed while still open: the lock marks it live until it has its name.
   * A close that fails after that (fsync succeeded: the data is on disk) is
   * a warning: the file is complete and in place, and the old one is gone. */
  const int renamed = r == GW_SUCCESS && !fail_here("rename") && rename(tmp, path) == 0;
  if (r == GW_SUCCESS && !renamed) r = gw__st_sys_fail(path, "cannot rename the temporary file over it");
  if (close(fd) != 0 && renamed)
    fprintf(stderr, "gradwire: warning: %s: written and renamed, but closing it failed: %s\n", path, strerror(errno));
  if (r != GW_SUCCESS) unlink(tmp);
  free(tmp);
  return r == GW_SUCCESS ? sync_dir(path) : r;
}

uint64_t gw_st_file_size_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return (uint64_t)rl.rlim_cur;
}

/* A file over the file-size limit is refused before its temporary file is
 * made: its write would stop there (EFBIG), or SIGXFSZ would kill the
 * process (the signal's default action) with the file half written. */
static gw_result_t check_size_limit(const char *path, const struct sbuf *h, const struct gw_st_tensor *t, int n) {
  uint64_t total = 8 + (uint64_t)h->len;
  for (int i = 0; i < n; i++) total += (uint64_t)t[i].nbytes;
  const uint64_t limit = gw_st_file_size_limit();
  if (total <= limit) return GW_SUCCESS;
  return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "%s: the file would be %" PRIu64 " bytes, over this process's "
                        "file-size limit (ulimit -f) of %" PRIu64 " bytes: not written (raise the limit)", path, total,
                        limit);
}

gw_result_t gw_st_write(const char *path, const struct gw_st_tensor *t, int n, const char *const *metadata) {
  if (!path || n < 0 || (n > 0 && !t))
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "gw_st_write: no path, or no tensors for n = %d", n);
  if (!path[0]) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "gw_st_write: an empty file name");
  const char **kv = NULL;
  char *real = NULL;
  int nkv = 0, mode = -1;
  struct sbuf h = {0};
  gw_result_t r = check_for_write(path, t, n);
  if (r == GW_SUCCESS) r = collect_metadata(path, metadata, &kv, &nkv);
  if (r == GW_SUCCESS) r = build_header(path, &h, t, n, kv, nkv);
  if (r == GW_SUCCESS) r = check_size_limit(path, &h, t, n);
  if (r == GW_SUCCESS) r = resolve_target(path, &real, &mode);
  if (r == GW_SUCCESS) r = write_atomic(real, mode, &h, t, n);
  free(real);
  free(kv);
  free(h.p);
  return r;
}
