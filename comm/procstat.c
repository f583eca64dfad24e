/* procstat.c - reading a process's or a thread's /proc stat line past its
 * command name, which may hold spaces and parentheses: the one place that
 * parses it (prims.c's looks at a peer's state, shm.c's at a pid's start time).
 * gw-run and the gw-run test helper keep their own copy: they link no
 * libgradwire. */
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "core.h"

const char *gw__proc_stat_fields(pid_t pid, pid_t tid, char *buf, size_t len) {
  char path[64];
  if (tid > 0) snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)pid, (int)tid);
  else snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f || len < 2) {
    if (f) fclose(f);
    return NULL;
  }
  const size_t n = fread(buf, 1, len - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *close = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return close && close[1] == ' ' && close[2] ? close + 2 : NULL;
}
