/* gw-train-signals.c - a scheduler's "checkpoint now" and "stop".
 *
 * SIGUSR1 or SIGUSR2 (gw-run passes them to every rank; `sbatch
 * --signal=USR1@90`, `scancel -s USR1`) asks for a checkpoint, the job going
 * on; SIGTERM (a scheduler's preemption or time limit) for a checkpoint and
 * the end, exit 75 as an interruption, so --resume continues.  The handlers
 * only count; the counts ride with the step's loss sum, so every rank acts at
 * the same step however many the signal reached.  A second SIGTERM a second
 * or more after the first, before it was acted on, ends the rank at once (the
 * default action: a rank stuck in a collective can still be stopped); one
 * sooner is the same signal delivered twice (to gw-run's whole process group,
 * or by Slurm to every process of the step: the rank directly and through
 * gw-run). */
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "gw-train.h"

static atomic_int sig_ckpt_pending, sig_stop_pending;
static _Atomic long long sig_stop_first_ns; /* CLOCK_MONOTONIC of the pending SIGTERM */

static void on_signal(int sig) {
  if (sig != SIGTERM) {
    atomic_store(&sig_ckpt_pending, 1);
    return;
  }
  struct timespec ts; /* clock_gettime is async-signal-safe */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const long long ns = (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
  if (!atomic_exchange(&sig_stop_pending, 1)) {
    atomic_store(&sig_stop_first_ns, ns);
  } else if (ns - atomic_load(&sig_stop_first_ns) >= 1000000000ll) {
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);
  }
}

/* SIGTERM is caught while steps run (before them, nothing is there to save:
 * it ends the rank at once, as does a second one later).  SIGUSR1 and
 * SIGUSR2 are caught from the start (trainer_catch_requests, from main's first line): one that
 * came during the setup (a dataset's scan, the rendezvous, a resume's load)
 * killed the job, or cost a restart; it asks for a checkpoint at the first
 * step, and after the steps (an evaluation, the weights' save) is heard and
 * let be. */
void trainer_catch_requests(void) {
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, NULL), sigaction(SIGUSR2, &sa, NULL);
  /* A write past the file-size limit (ulimit -f) fails with EFBIG, which the
   * writers report (--metrics goes on without; a checkpoint keeps the older
   * ones), instead of SIGXFSZ's default action ending the rank unexplained
   * after its training. */
  signal(SIGXFSZ, SIG_IGN);
}

void trainer_catch_stop(int on) {
  struct sigaction sa = {.sa_handler = on ? on_signal : SIG_DFL, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
}

void trainer_signals_take(int *ckpt, int *stop) {
  *ckpt = atomic_exchange(&sig_ckpt_pending, 0);
  *stop = atomic_exchange(&sig_stop_pending, 0);
}
