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
 * with one write(2) to a file that must not exist yet (a symbolic link is
 * not followed).  Only the first failure of the process is recorded: later ones
 * are usually its consequences (an abort after a timeout, a destroy after a
 * failed step).  Nothing is said when the file cannot be written: the record
 * is a hint to the launcher, not a result. */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

static atomic_int recorded;
static pthread_once_t path_once = PTHREAD_ONCE_INIT;
static char path[4096]; /* GW_ERROR_FILE, read once ("": none) */

static void read_path(void) {
  const char *p = getenv("GW_ERROR_FILE");
  if (p && strlen(p) < sizeof path) snprintf(path, sizeof path, "%s", p);
}

/* On a caller's thread (gw_comm_init, gw_record_failure): the progress
 * thread that records a failure must not read the environment while the
 * application may be changing it. */
void gw__record_failure_init(void) { pthread_once(&path_once, read_path); }

void gw__record_failure(bool origin, const char *msg) {
  gw__record_failure_init();
  if (!path[0] || atomic_exchange(&recorded, 1)) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char line[96 + GW_ERRMSG_MAX * 2];
  int n = snprintf(line, sizeof line, "gw-failure 1\t%s\t%lld.%06ld\t%ld\t", origin ? "origin" : "consequence",
                   (long long)ts.tv_sec, ts.tv_nsec / 1000, (long)getpid());
  for (const char *p = msg ? msg : ""; *p && n < (int)sizeof line - 2; p++)
    line[n++] = *p == '\t' || *p == '\n' || *p == '\r' ? ' ' : *p;
  line[n++] = '\n';
  /* O_EXCL: the first record wins across processes too (a rank's forked
   * child, a second program the rank's script runs); the launcher removes
   * the file before each start.  O_NONBLOCK: a FIFO there must not hold
   * the failure (its notice to the peers goes after this). */
  const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) return;
  if (write(fd, line, (size_t)n) != n) { /* a hint only: a short record is dropped by its reader */
  }
  close(fd);
}

void gw_record_failure(const char *msg, int own) { gw__record_failure(own != 0, msg); }
