/* failrec.c - this process's failure record for its launcher.
 *
 * A launcher cannot tell from exit order which rank a job's failure began
 * at: the rank whose own error stopped the job often exits after the peers
 * it told (it cleans up, saves, prints), and they exit at once with "another
 * rank failed".  So each process writes one record of its first failure to
 * the file GW_ERROR_FILE names (gw-run sets one per rank, as torchelastic's
 * agent sets TORCHELASTIC_ERROR_FILE), marked as its own finding ("origin":
 * a timeout, a mismatch, a local error, the application's abort or its
 * gw_record_failure) or as news of another rank's ("consequence": a peer's
 * failure notice, a peer gone), with the wall-clock time.  gw-run names the
 * earliest origin when it is not the rank it saw fail first.
 *
 * One line: "gw-failure 1 TAB origin|consequence TAB SECONDS.MICROS TAB PID
 * TAB MESSAGE" (tabs and line breaks in the message made spaces), written
 * with one write(2) to a file created afresh (O_TRUNC; a symbolic link is not
 * followed).  Only the first failure of the process is recorded: later ones
 * are usually its consequences (an abort after a timeout, a destroy after a
 * failed step).  Nothing is said when the file cannot be written: the record
 * is a hint to the launcher, not a result. */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

static atomic_int recorded;

void gw__record_failure(bool origin, const char *msg) {
  const char *path = getenv("GW_ERROR_FILE");
  if (!path || !*path || atomic_exchange(&recorded, 1)) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char line[96 + GW_ERRMSG_MAX * 2];
  int n = snprintf(line, sizeof line, "gw-failure 1\t%s\t%lld.%06ld\t%ld\t", origin ? "origin" : "consequence",
                   (long long)ts.tv_sec, ts.tv_nsec / 1000, (long)getpid());
  for (const char *p = msg ? msg : ""; *p && n < (int)sizeof line - 2; p++)
    line[n++] = *p == '\t' || *p == '\n' || *p == '\r' ? ' ' : *p;
  line[n++] = '\n';
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) != n) { /* a hint only: a short record is dropped by its reader */
  }
  close(fd);
}

void gw_record_failure(const char *msg) { gw__record_failure(true, msg); }
