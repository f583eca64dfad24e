/* cpus.c - how many CPUs this process may use at once: its affinity's count,
 * a cgroup quota (v2 or v1's cpu controller, at its own level and every one
 * above) counted.  Read once at init, into the rendezvous table, from which
 * every rank decides alike whether a machine's cores are oversubscribed
 * (comm.c).  Also the memory a cgroup's limit leaves this process (gw-perf's
 * check before it allocates), by the same walk. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm.h"

/* The CPUs (rounded up) the quota of cgroup directory dir allows: cpu.max
 * (v2) or cpu.cfs_quota_us over cpu.cfs_period_us (v1); 0: none there. */
static long long quota_at(const char *dir, int v2) {
  char p[4200];
  long long quota = -1, period = 0;
  snprintf(p, sizeof p, "%s/%s", dir, v2 ? "cpu.max" : "cpu.cfs_quota_us");
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  if (v2) {
    char q[32] = "";
    if (fscanf(f, "%31s %lld", q, &period) == 2 && strcmp(q, "max")) quota = atoll(q);
  } else if (fscanf(f, "%lld", &quota) != 1) {
    quota = -1;
  }
  fclose(f);
  snprintf(p, sizeof p, "%s/cpu.cfs_period_us", dir);
  if (!v2 && (f = fopen(p, "r"))) {
    if (fscanf(f, "%lld", &period) != 1) period = 0;
    fclose(f);
  }
  return quota > 0 && period > 0 ? (int)((quota + period - 1) / period) : 0;
}

/* One number of cgroup directory dir (v2: of the unified hierarchy), 0 where
 * it sets none. */
typedef long long (*cgroup_read_fn)(const char *dir, int v2);

/* The smallest number on the way from the process's cgroup (rel, under the
 * hierarchy mounted at root) up to that root: every level limits.  A path not
 * there (a container's own cgroup mounted as the root, the host's path in
 * /proc) is walked up from too. */
static long long quota_up(const char *root, const char *rel, int v2, cgroup_read_fn read) {
  char dir[4200];
  const size_t top = strlen(root);
  if ((size_t)snprintf(dir, sizeof dir, "%s%s", root, rel[0] == '/' ? rel : "/") >= sizeof dir) dir[top] = 0;
  long long best = 0;
  for (;;) {
    size_t len = strlen(dir);
    while (len > top && dir[len - 1] == '/') dir[--len] = 0;
    const long long q = read(dir, v2);
    if (q > 0 && (!best || q < best)) best = q;
    char *slash = strrchr(dir, '/');
    if (len <= top || !slash || (size_t)(slash - dir) < top) return best;
    *slash = 0;
  }
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The smallest of read's numbers over the process's own cgroup
 * (/proc/self/cgroup) and every one above it, in the v2 hierarchy and in
 * v1's controller ctl (mounted at one of v1mounts under the cgroup fs); 0:
 * none.  (A systemd slice or a job scheduler's cgroup is nested: only the
 * root's files were read.) */
static long long cgroup_min(cgroup_read_fn read, const char *ctl, const char *const *v1mounts, int nv1) {
  const char *fs = gw__env_str("GW_TEST_CGROUP_FS", "/sys/fs/cgroup");
  const char *proc = gw__env_str("GW_TEST_PROC_CGROUP", "/proc/self/cgroup");
  char v2rel[4096] = "/", v1rel[4096] = "/", line[4096], p[4200];
  FILE *f = fopen(proc, "r");
  while (f && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = 0;
    if (c1 == line + 1 && line[0] == '0' && c2 == c1 + 1) { /* "0::path": v2 */
      snprintf(v2rel, sizeof v2rel, "%s", c2 + 1);
      continue;
    }
    char *save = NULL;
    for (char *tok = strtok_r(c1 + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
      if (!strcmp(tok, ctl)) snprintf(v1rel, sizeof v1rel, "%s", c2 + 1);
  }
  if (f) fclose(f);
  /* A cgroup outside this namespace's root ("/../.."): not under the mount,
   * whose root's quota is the one to read. */
  if (strstr(v2rel, "/..")) snprintf(v2rel, sizeof v2rel, "/");
  if (strstr(v1rel, "/..")) snprintf(v1rel, sizeof v1rel, "/");
  long long best = 0;
  static const char *const v2mounts[] = {"", "/unified"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s%s/cgroup.controllers", fs, v2mounts[i]);
    if (access(p, F_OK) != 0) continue;
    snprintf(p, sizeof p, "%s%s", fs, v2mounts[i]);
    best = quota_up(p, v2rel, 1, read);
    break;
  }
  for (int i = 0; i < nv1; i++) {
    snprintf(p, sizeof p, "%s%s", fs, v1mounts[i]);
    if (!is_dir(p)) continue;
    const long long q = quota_up(p, v1rel, 0, read);
    if (q > 0 && (!best || q < best)) best = q;
    break;
  }
  return best;
}

/* The CPUs a cgroup's quota lets this process use at once, rounded up; 0: no
 * quota. */
static int cgroup_cpus(void) {
  static const char *const v1mounts[] = {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"};
  const long long q = cgroup_min(quota_at, "cpu", v1mounts, 3);
  return q > 0 && q < 1 << 20 ? (int)q : 0;
}

/* One number of a cgroup file, or -1 (none, or "max"). */
static long long cgroup_number(const char *dir, const char *file) {
  char p[4200], word[32] = "";
  snprintf(p, sizeof p, "%s/%s", dir, file);
  FILE *f = fopen(p, "r");
  if (!f) return -1;
  const bool read = fscanf(f, "%31s", word) == 1;
  fclose(f);
  char *end;
  const long long v = read ? strtoll(word, &end, 10) : -1;
  return read && *end == 0 && v >= 0 ? v : -1;
}

/* The bytes the memory limit of cgroup directory dir leaves (limit less what
 * it holds, at least 1), 0: no limit there (v1's "none" is a number near
 * 2^63). */
static long long mem_left_at(const char *dir, int v2) {
  const long long limit = cgroup_number(dir, v2 ? "memory.max" : "memory.limit_in_bytes");
  if (limit < 0 || limit >= (1LL << 62)) return 0;
  const long long used = cgroup_number(dir, v2 ? "memory.current" : "memory.usage_in_bytes");
  return used >= 0 && used < limit ? limit - used : 1;
}

long long gw__cgroup_mem_left(void) {
  static const char *const v1mounts[] = {"/memory"};
  return cgroup_min(mem_left_at, "memory", v1mounts, 1);
}

/* The CPUs this process may use: its affinity's count (the machine's where
 * unknown), a cgroup's quota counted. */
int gw__usable_cpus(const uint64_t cpus[16]) {
  int n = 0;
  for (int w = 0; w < 16; w++) n += __builtin_popcountll(cpus[w]);
  if (n == 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  const int quota = cgroup_cpus();
  return quota > 0 && quota < n ? quota : n;
}
