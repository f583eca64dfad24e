/* gw-train-ckpt-dir.c - the checkpoint directory (gw-train-ckpt-dir.h): the
 * names ckpt_save writes and their listing, pruning to the newest kept, the
 * directory's lock against a second run, the temporary files of saves that
 * died, and refused files moved aside.  Split from gw-train-ckpt.c, which
 * says what the files hold and which one a resume takes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gw-train.h"
#include "gw-train-ckpt-dir.h"
#include "safetensors.h"

/* The step of a checkpoint's file name, name[0..len): exactly the names
 * ckpt_save writes (not ckpt-007 or ckpt-+7, which would stand for another
 * file's step); -1 for any other name. */
static long long step_of(const char *name, size_t len) {
  char buf[64], canon[64];
  long long s;
  if (len >= sizeof buf) return -1;
  memcpy(buf, name, len), buf[len] = 0;
  if (sscanf(buf, "ckpt-%lld", &s) != 1 || s < 0) return -1;
  snprintf(canon, sizeof canon, "ckpt-%lld.safetensors", s);
  return strcmp(canon, buf) ? -1 : s;
}

/* Steps of the newest `max` checkpoint files in dir, newest first; -1 (errno
 * set) when the directory cannot be read to its end: a listing cut short by
 * an I/O error, or by its first `max` entries, could leave the newest out,
 * and a resume would quietly redo steps. */
int ckpt_list_steps(const char *dir, int64_t *steps, int max) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  for (errno = 0; (de = readdir(d)); errno = 0) {
    const long long s = step_of(de->d_name, strlen(de->d_name));
    if (s < 0) continue;
    if (n < max) {
      steps[n++] = s;
      continue;
    }
    int lo = 0; /* full: the new one replaces the oldest kept, if older */
    for (int i = 1; i < n; i++)
      if (steps[i] < steps[lo]) lo = i;
    if (s > steps[lo]) steps[lo] = s;
  }
  const int rerr = errno;
  closedir(d);
  if (rerr) return errno = rerr, -1;
  for (int i = 1; i < n; i++) /* insertion sort, descending: few files */
    for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
      int64_t x = steps[j];
      steps[j] = steps[j - 1], steps[j - 1] = x;
    }
  return n;
}

void ckpt_prune(const char *dir, int keep) {
  int64_t steps[MAX_CKPT];
  int n = ckpt_list_steps(dir, steps, MAX_CKPT);
  char path[4096];
  for (int i = keep; i < n; i++) {
    snprintf(path, sizeof path, "%s/ckpt-%" PRId64 ".safetensors", dir, steps[i]);
    unlink(path);
  }
}

/* Whether a temporary file's writer is gone: it write-locks the file (an OFD
 * lock) from its creation to its rename, so an unlocked one older than a few
 * seconds, or named with a pid that is no process, was left by a save that
 * died.  Pids alone misled: a restarted
 * container's writer often has its dead predecessor's pid (even this
 * process's), and that file stayed forever, a whole checkpoint each.  On a
 * file system without locks: the pid is not running. */
static bool temp_is_stale(const char *path, unsigned tag, long long pid, bool dir_locked) {
  /* without blocking: a FIFO of that name would wait for a writer forever */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  struct stat st;
  bool stale;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) /* not one a save made: left alone */
    stale = false;
  else if (tag != gw_st_host_tag()) /* another machine's (a shared directory): its locks may not show here; */
    /* with the folder's lock held by this run no other run writes there, and
     * the tag is usually this machine's before a reboot (a crash, the common
     * death of a save), so a minute of silence is enough */
    stale = fstat(fd, &st) == 0 && time(NULL) - st.st_mtime > (dir_locked ? 60 : 3600);
  else if (fcntl(fd, F_OFD_GETLK, &fl) == 0)
    /* unlocked: dead, unless its writer is between creating and locking it,
     * which no one is while this run holds the folder's lock (a save killed
     * by a restart's SIGKILL left one that the next attempt, seconds later,
     * kept: a whole checkpoint until the next start), or whose writer's pid
     * is no process, once 2 s old (one between creating and locking it is
     * alive, and locks within microseconds: the age guards a writer in another
     * pid namespace under this host name; a --save-weights killed during the
     * final save left its whole weights to a restart's save beside, for want
     * of a folder lock there) */
    stale = fl.l_type == F_UNLCK &&
            (dir_locked || (fstat(fd, &st) == 0 && time(NULL) - st.st_mtime > 10) ||
             (pid <= INT_MAX && kill((pid_t)pid, 0) != 0 && errno == ESRCH && time(NULL) - st.st_mtime >= 2));
  else
    stale = kill((pid_t)pid, 0) != 0 && errno == ESRCH;
  close(fd);
  return stale;
}

/* Whether name is <base>.tmp.<host tag>.<pid>.<k>, the name gw_st_write
 * gives the temporary file of a save to <base> (8 hex digits, then decimal
 * numbers); base's length, the tag and the pid out. */
static bool temp_name(const char *name, size_t *base_len, unsigned *tag, long long *pid) {
  const char *p = name + strlen(name), *field[3]; /* k, pid, tag */
  size_t len[3];
  for (int i = 0; i < 3; i++) {
    const char *end = p;
    while (p > name && p[-1] != '.') p--;
    if (p == name || p == end) return false;
    field[i] = p, len[i] = (size_t)(end - p), p--;
  }
  if (p - name < 5 || memcmp(p - 4, ".tmp", 4) != 0 || len[2] != 8 || strspn(field[2], "0123456789abcdef") < 8 ||
      strspn(field[1], "0123456789") < len[1] || len[1] > 18 || strspn(field[0], "0123456789") < len[0])
    return false;
  *base_len = (size_t)(p - 4 - name);
  *tag = (unsigned)strtoul(field[2], NULL, 16), *pid = strtoll(field[1], NULL, 10);
  return *base_len > 0 && *pid > 0;
}

/* Removes the temporary files in dir of saves to base (NULL: to any
 * checkpoint, ckpt-<step>.safetensors) that no live save is writing (a save
 * killed before its rename); a live writer's is left alone, and another
 * machine's unless it is an hour old. */
static void remove_stale_temps(const char *dir, const char *base, bool dir_locked) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *de;
  char path[4096];
  while ((de = readdir(d))) {
    long long pid;
    unsigned tag;
    size_t len;
    if (!temp_name(de->d_name, &len, &tag, &pid) ||
        (base ? len != strlen(base) || memcmp(de->d_name, base, len) != 0 : step_of(de->d_name, len) < 0))
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (temp_is_stale(path, tag, pid, dir_locked)) unlink(path);
  }
  closedir(d);
}

void weights_remove_stale_temps(const char *path) {
  /* The writer's temporary files are next to the file a symbolic link names. */
  char *real = realpath(path, NULL);
  const char *file = real ? real : path;
  const char *slash = strrchr(file, '/');
  char dir[4096];
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if ((size_t)snprintf(dir, sizeof dir, "%.*s", slash == file ? 1 : (int)(slash - file), file) >= sizeof dir)
    dir[0] = 0;
  const char *base = slash ? slash + 1 : file;
  if (dir[0] && base[0]) remove_stale_temps(dir, base, false);
  free(real);
}

/* The folder's lock: rank 0 holds a write lock (an OFD lock, released when the
 * process ends however it ends) on DIR/.gw-train.lock for its whole run, the
 * file naming its host and pid.  Two runs saving into one folder (a
 * duplicate submission, a restarted job's old rank 0 still alive behind a
 * partition) would each keep its newest checkpoints and delete the other's.
 * A file system without locks (some NFS mounts) goes on unguarded, with a
 * note.  1: held; 0: not held (no locks here); -1: refused (err). */
static int dir_lock_fd = -1;

static int lock_dir(const char *dir, char *err, size_t errlen) {
  char path[4096], who[200] = "";
  snprintf(path, sizeof path, "%s/.gw-train.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "--checkpoint-dir %s: cannot use its lock file %s: %s", dir, path,
             fd < 0 ? strerror(errno) : "not a regular file");
    if (fd >= 0) close(fd);
    return -1;
  }
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
  if (fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    if (errno != EAGAIN && errno != EACCES) {
      fprintf(stderr, "gw-train: note: --checkpoint-dir %s: cannot lock %s (%s): nothing keeps another run from "
              "saving into the same folder\n", dir, path, strerror(errno));
      close(fd);
      return 0; /* not held: another run's temporary files may be live */
    }
    const ssize_t k = pread(fd, who, sizeof who - 1, 0);
    who[k > 0 ? k : 0] = 0;
    who[strcspn(who, "\n")] = 0;
    snprintf(err, errlen, "--checkpoint-dir %s is in use by another gw-train (%s): two runs saving into one "
             "folder delete each other's checkpoints (stop the other, or use another folder)", dir,
             who[0] ? who : "host and pid unknown");
    close(fd);
    return -1;
  }
  char host[128] = "?";
  gethostname(host, sizeof host - 1);
  const int len = snprintf(who, sizeof who, "%s %ld\n", host, (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, who, (size_t)len, 0) != len) /* the lock holds; only the name is lost */
    fprintf(stderr, "gw-train: note: --checkpoint-dir %s: could not write this run's name into .gw-train.lock (%s); "
            "the folder is locked all the same\n", dir, strerror(errno));
  if (dir_lock_fd >= 0) close(dir_lock_fd);
  dir_lock_fd = fd;
  return 1;
}

/* mkdir, or nothing when dir exists; a new one's entry made durable in its
 * parent (fsync of the parent), or a power loss after the first
 * checkpoints could take the whole folder with them (POSIX does not order
 * the mkdir before the files' own fsyncs). */
int ckpt_make_dir(const char *dir) {
  char parent[4096];
  snprintf(parent, sizeof parent, "%s", dir);
  size_t len = strlen(parent);
  while (len > 1 && parent[len - 1] == '/') parent[--len] = 0; /* "a/b/" is a/b */
  char *slash = strrchr(parent, '/');
  if (!slash) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) parent[1] = 0;
  else *slash = 0;
  if (mkdir(dir, 0777) != 0) {
    if (errno == EEXIST) return 0;
    /* the folders above it too, as mkdir -p and torchvision's output_dir (the
     * README's runs/<date>/checkpoints was refused in a new runs/) */
    if (errno != ENOENT || !slash || ckpt_make_dir(parent) != 0) return -1;
    if (mkdir(dir, 0777) != 0) return errno == EEXIST ? 0 : -1;
  }
  const int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) (void)fsync(fd), close(fd);
  return 0;
}

int ckpt_prepare_dir(const char *dir, int resume, char *err, size_t errlen) {
  struct stat sb;
  if (!dir[0]) {
    snprintf(err, errlen, "--checkpoint-dir: an empty name");
    return -1;
  }
  /* Its files' names (with a save's temporary suffix) must fit the 4096-byte
   * paths they are made in: a cut name would be another file. */
  if (strlen(dir) > 3900) {
    snprintf(err, errlen, "--checkpoint-dir: the name is %zu bytes long, more than 3900", strlen(dir));
    return -1;
  }
  if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
    snprintf(err, errlen, "--checkpoint-dir %s: exists and is not a directory", dir);
    return -1;
  }
  if (ckpt_make_dir(dir) != 0) {
    snprintf(err, errlen, "--checkpoint-dir %s: cannot create it: %s", dir, strerror(errno));
    return -1;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    snprintf(err, errlen, "--checkpoint-dir %s: cannot write into it: %s", dir, strerror(errno));
    return -1;
  }
  const int held = lock_dir(dir, err, errlen);
  if (held < 0) return -1;
  remove_stale_temps(dir, NULL, held == 1); /* with the folder's lock, no other run writes here */
  int64_t steps[MAX_CKPT];
  const int n = ckpt_list_steps(dir, steps, MAX_CKPT);
  if (n < 0) {
    snprintf(err, errlen, "--checkpoint-dir %s: cannot read it: %s", dir, strerror(errno));
    return -1;
  }
  if (n > 0 && !resume) {
    snprintf(err, errlen,
             "--checkpoint-dir %s already holds %d checkpoint%s (the newest ckpt-%" PRId64 ".safetensors): --resume "
             "continues that run; a new run needs an empty or new directory (its checkpoints would overwrite "
             "those, and keeping the newest --keep-checkpoints would delete them)",
             dir, n, n > 1 ? "s" : "", steps[0]);
    return -1;
  }
  return 0;
}

/* Moves the refused checkpoint from to <from>.refused, or .refused.1, .2, ...
 * where an earlier refusal's copy has that name (it is never replaced); the
 * name it took into to.  0, or -1 with errno (EEXIST: every name is taken). */
int ckpt_move_aside(const char *from, char *to, size_t tolen) {
  for (int i = 0; i < MAX_REFUSED; i++) {
    if (i) snprintf(to, tolen, "%s.refused.%d", from, i);
    else snprintf(to, tolen, "%s.refused", from);
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    /* A file system or kernel without RENAME_NOREPLACE: link fails on a taken
     * name too; without hard links either, a name seen free is renamed to. */
    if (errno == EINVAL || errno == ENOSYS) {
      if (link(from, to) == 0) {
        if (unlink(from) == 0) return 0;
        const int e = errno;
        unlink(to);
        return errno = e, -1;
      }
      struct stat sb;
      if (errno != EEXIST && lstat(to, &sb) == 0) errno = EEXIST;
      else if (errno == ENOENT) return rename(from, to);
    }
    if (errno != EEXIST) return -1;
  }
  return errno = EEXIST, -1;
}
