/* cpus.c - how many CPUs this process may use at once: its affinity's count,
 * a cgroup quota (v2 or v1's cpu controller, at its own level and every one
 * above) counted.  Read once at init, into the rendezvous table, from which
 * every rank decides alike whether a machine's cores are oversubscribed
 * (comm.c). */
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
static int quota_at(const char *dir, int v2) {
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

/* The smallest quota on the way from the process's cgroup (rel, under the
 * hierarchy mounted at root) up to that root: every level limits.  A path not
 * there (a container's own cgroup mounted as the root, the host's path in
 * /proc) is walked up from too. */
static int quota_up(const char *root, const char *rel, int v2) {
  char dir[4200];
  const size_t top = strlen(root);
  if ((size_t)snprintf(dir, sizeof dir, "%s%s", root, rel[0] == '/' ? rel : "/") >= sizeof dir) dir[top] = 0;
  int best = 0;
  for (;;) {
    size_t len = strlen(dir);
    while (len > top && dir[len - 1] == '/') dir[--len] = 0;
    const int q = quota_at(dir, v2);
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

/* The CPUs a cgroup's quota lets this process use at once, rounded up; 0: no
 * quota.  The process's own cgroup (/proc/self/cgroup) and every one above
 * it, in the v2 hierarchy and in v1's cpu controller (a systemd slice or a
 * job scheduler's cgroup is nested; only the root's files were read). */
static int cgroup_cpus(void) {
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
      if (!strcmp(tok, "cpu")) snprintf(v1rel, sizeof v1rel, "%s", c2 + 1);
  }
  if (f) fclose(f);
  /* A cgroup outside this namespace's root ("/../.."): not under the mount,
   * whose root's quota is the one to read. */
  if (strstr(v2rel, "/..")) snprintf(v2rel, sizeof v2rel, "/");
  if (strstr(v1rel, "/..")) snprintf(v1rel, sizeof v1rel, "/");
  int best = 0;
  static const char *const v2mounts[] = {"", "/unified"}, *const v1mounts[] = {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"};
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s%s/cgroup.controllers", fs, v2mounts[i]);
    if (access(p, F_OK) != 0) continue;
    snprintf(p, sizeof p, "%s%s", fs, v2mounts[i]);
    best = quota_up(p, v2rel, 1);
    break;
  }
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s%s", fs, v1mounts[i]);
    if (!is_dir(p)) continue;
    const int q = quota_up(p, v1rel, 0);
    if (q > 0 && (!best || q < best)) best = q;
    break;
  }
  return best;
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
