/* outpath.c - one check the tools share (outpath.h). */
#include "outpath.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(OUTPATH_TEMP_WEIGHTS == 5 + 8 + 1 + 7 + 1 + 10, "safetensors_write.c's temporary names");

/* The directory path is in ("." for a bare name, "/" for "/name"). */
static void dir_of(const char *path, char *dir, size_t cap) {
  snprintf(dir, cap, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, cap, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
}

/* A path as messages show it: a long one by its start and end, so the
 * message's reason after it is not cut off with the path (every buffer for
 * messages is shorter than PATH_MAX). */
struct shown {
  char s[200];
};
static struct shown shown(const char *path) {
  struct shown v;
  const size_t len = strlen(path);
  if (len < sizeof v.s) snprintf(v.s, sizeof v.s, "%s", path);
  else snprintf(v.s, sizeof v.s, "%.80s...(%zu bytes)...%s", path, len, path + len - 80);
  return v;
}

/* Whether the name, with `extra` bytes more (a temporary file's), fits
 * PATH_MAX: a longer one fails only when the file is opened, after the
 * work (--save-weights: after the training). */
static int fits_path_max(const char *flag, const char *path, size_t extra, char *err, size_t errlen) {
  const size_t len = strlen(path);
  if (len + extra < PATH_MAX) return 0;
  if (!extra)
    snprintf(err, errlen, "%s %s: the name is %zu bytes long; at most %d (PATH_MAX)", flag, shown(path).s, len,
             PATH_MAX - 1);
  else
    snprintf(err, errlen, "%s %s: the name is %zu bytes long; at most %zu, so that its temporary file's name (up to "
             "%zu bytes longer) stays within PATH_MAX", flag, shown(path).s, len, (size_t)PATH_MAX - 1 - extra, extra);
  return -1;
}

/* The checks of output_path_ok; with a new file to be made in the directory
 * (path missing, or replaced by a renamed temporary file: `made_in_dir`), a
 * file made there and removed. */
static int path_ok(const char *flag, const char *path, int made_in_dir, char *err, size_t errlen) {
  struct stat sb;
  if (!path[0]) {
    snprintf(err, errlen, "%s: an empty file name", flag);
    return -1;
  }
  if (fits_path_max(flag, path, 0, err, errlen) != 0) return -1;
  const int exists = stat(path, &sb) == 0;
  if (exists && S_ISDIR(sb.st_mode)) {
    snprintf(err, errlen, "%s %s: is a directory", flag, shown(path).s);
    return -1;
  }
  if (exists && access(path, W_OK) != 0) { /* found only after the work, otherwise */
    snprintf(err, errlen, "%s %s: cannot write it: %s", flag, shown(path).s, strerror(errno));
    return -1;
  }
  if (exists && !made_in_dir) return 0; /* written in place (a FIFO, /dev/null): its directory is not written */
  char dir[4096];
  dir_of(path, dir, sizeof dir);
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
    snprintf(err, errlen, "%s %s: its directory %s does not exist", flag, shown(path).s, shown(dir).s);
    return -1;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    snprintf(err, errlen, "%s %s: cannot write into %s: %s", flag, shown(path).s, shown(dir).s, strerror(errno));
    return -1;
  }
  /* access() says yes to root but for a read-only mount: /proc, /sys or a
   * server's root squash refused the new file only after the work.  A file
   * made there and removed says what the writer will meet. */
  char probe[PATH_MAX];
  if ((size_t)snprintf(probe, sizeof probe, "%s/.gw-probe-XXXXXX", dir) >= sizeof probe) return 0;
  const int fd = mkstemp(probe);
  if (fd < 0) {
    snprintf(err, errlen, "%s %s: cannot create files in %s: %s", flag, shown(path).s, shown(dir).s, strerror(errno));
    return -1;
  }
  close(fd);
  /* A directory where files cannot be removed (append-only: chattr +a) takes
   * a new file written in place, not a file replaced by a rename. */
  if (unlink(probe) != 0 && made_in_dir) {
    snprintf(err, errlen, "%s %s: files in %s cannot be replaced (%s; a file made there to try it, %s, is left)",
             flag, shown(path).s, shown(dir).s, strerror(errno), shown(probe).s);
    return -1;
  }
  return 0;
}

/* Where a write through path lands when path is a symbolic link to nothing:
 * open(O_CREAT) makes the file that the chain of links ends at, in that
 * file's directory (the link's own directory passed the checks while the
 * target's was missing, and the writer failed after the work; a link and
 * its target given to two flags passed as two files).  1 with that path in
 * out; 0 when path is no such link; -1 (errno) when it cannot be followed. */
static int dangling_target(const char *path, char *out, size_t cap) {
  char cur[PATH_MAX], target[PATH_MAX], dir[4096];
  struct stat sb;
  if (!path[0] || lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode)) return 0;
  if (stat(path, &sb) == 0) return 0; /* a link to a file: checked as that file */
  if (errno != ENOENT) return -1;
  snprintf(cur, sizeof cur, "%s", path);
  for (int depth = 0; lstat(cur, &sb) == 0 && S_ISLNK(sb.st_mode); depth++) {
    const ssize_t n = depth < 40 ? readlink(cur, target, sizeof target - 1) : (errno = ELOOP, -1);
    if (n < 0) return -1;
    target[n] = 0;
    dir_of(cur, dir, sizeof dir);
    char next[PATH_MAX];
    const int len = target[0] == '/' ? snprintf(next, sizeof next, "%s", target)
                                     : snprintf(next, sizeof next, "%s/%s", dir, target);
    if (len < 0 || (size_t)len >= sizeof next) return errno = ENAMETOOLONG, -1;
    memcpy(cur, next, (size_t)len + 1);
  }
  snprintf(out, cap, "%s", cur);
  return 1;
}

int output_path_ok(const char *flag, const char *path, char *err, size_t errlen) {
  char target[PATH_MAX], named[512];
  const int dangling = dangling_target(path, target, sizeof target);
  if (dangling < 0) {
    snprintf(err, errlen, "%s %s: a symbolic link that cannot be followed: %s", flag, shown(path).s, strerror(errno));
    return -1;
  }
  if (!dangling) return path_ok(flag, path, 0, err, errlen);
  snprintf(named, sizeof named, "%s %s ->", flag, shown(path).s);
  return path_ok(named, target, 0, err, errlen);
}

int replaced_path_ok(const char *flag, const char *path, int temp_suffix, char *err, size_t errlen) {
  struct stat sb;
  if (path[0] && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
    char *real = realpath(path, NULL);
    if (!real) {
      snprintf(err, errlen, "%s %s: a symbolic link that cannot be followed: %s", flag, shown(path).s,
               errno == ENOENT ? "what it names does not exist" : strerror(errno));
      return -1;
    }
    int r = replaced_path_ok(flag, real, temp_suffix, err, errlen);
    free(real);
    return r;
  }
  if (path[0] && stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode)) {
    snprintf(err, errlen, "%s %s: not a regular file (a device, FIFO or socket would be replaced by one)", flag,
             shown(path).s);
    return -1;
  }
  if (path_ok(flag, path, 1, err, errlen) != 0 || fits_path_max(flag, path, (size_t)temp_suffix, err, errlen) != 0)
    return -1;
  /* The file is written as a temporary file beside it and renamed (the
   * safetensors writer's <name>.tmp.<8 hex>.<pid>.<counter>): a name that
   * leaves no room for that passed here and failed only when written, after
   * the training. */
  char dir[4096];
  dir_of(path, dir, sizeof dir);
  const char *slash = strrchr(path, '/');
  const size_t len = strlen(slash ? slash + 1 : path);
  const long max = pathconf(dir, _PC_NAME_MAX);
  if (max > 0 && len + (size_t)temp_suffix > (size_t)max) {
    snprintf(err, errlen, "%s %s: the file name is %zu characters long; at most %zu here (its temporary file's "
             "name adds %d to it, and the directory takes %ld)", flag, shown(path).s, len, (size_t)(max - temp_suffix),
             temp_suffix, max);
    return -1;
  }
  return 0;
}

/* The file's directory resolved (realpath) and its last component; 0 when the
 * directory cannot be resolved. */
static int resolved_name(const char *path, char *dir, size_t cap, const char **base) {
  char d[4096];
  dir_of(path, d, sizeof d);
  char *real = realpath(d, NULL);
  if (!real) return 0;
  snprintf(dir, cap, "%s", real);
  free(real);
  const char *slash = strrchr(path, '/');
  *base = slash ? slash + 1 : path;
  return 1;
}

int same_output_file(const char *a, const char *b) {
  if (!strcmp(a, b)) return 1;
  char ta[PATH_MAX], tb[PATH_MAX]; /* links to nothing: the files they will make */
  if (dangling_target(a, ta, sizeof ta) == 1) a = ta;
  if (dangling_target(b, tb, sizeof tb) == 1) b = tb;
  if (!strcmp(a, b)) return 1;
  struct stat sa, sb;
  const int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea || eb) return 0; /* (one exists, the other is a new name) */
  char da[4096], db[4096];
  const char *na, *nb;
  return resolved_name(a, da, sizeof da, &na) && resolved_name(b, db, sizeof db, &nb) && !strcmp(da, db) &&
         !strcmp(na, nb);
}

bool replaced_content_at_stake(const char *path) {
  struct stat sb;
  return path[0] && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 && sb.st_nlink == 1;
}
