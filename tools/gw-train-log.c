/* gw-train-log.c - what gw-train shows and records, all from rank 0: a live
 * progress line when stdout is a terminal (plain lines every --log-every steps
 * otherwise), the metrics file (one JSON object per step and per evaluation), and
 * a PNG of loss and accuracy per epoch drawn by gnuplot from a small data file
 * kept next to it. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gw-train.h"

/* The longest one gnuplot run may take (a plot takes well under a second). */
#define GNUPLOT_WAIT_S 60

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int log_open(struct train_log *l, const char *metrics_path, int rank, char *err, size_t errlen) {
  memset(l, 0, sizeof *l);
  l->rank = rank;
  l->start = now();
  l->tty = rank == 0 && isatty(STDOUT_FILENO);
  l->metrics_step = -1;
  l->metrics_end = -1;
  if (rank != 0 || !metrics_path) return 0;
  l->metrics_path = metrics_path;
  /* Opened without blocking first: a FIFO with no reader held the run in
   * open() for ever, silently (the other ranks then timed out blaming this one) */
  const int mfd = open(metrics_path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
  struct stat fst;
  if (mfd < 0 && errno == ENXIO && stat(metrics_path, &fst) == 0 && S_ISFIFO(fst.st_mode)) {
    snprintf(err, errlen, "%s: a FIFO with no reader (start its reader first, or name a file)", metrics_path);
    return -1;
  }
  if (mfd >= 0) fcntl(mfd, F_SETFL, fcntl(mfd, F_GETFL) & ~O_NONBLOCK);
  l->metrics = mfd >= 0 ? fdopen(mfd, "a") : NULL;
  if (!l->metrics && mfd >= 0) close(mfd);
  struct stat st;
  if (!l->metrics || fstat(fileno(l->metrics), &st) != 0) {
    snprintf(err, errlen, "cannot open %s for appending: %s", metrics_path, strerror(errno));
    if (l->metrics) fclose(l->metrics);
    l->metrics = NULL;
    return -1;
  }
  /* A regular file: its size is where a half line written later is cut back
   * to.  A pipe, a terminal or a FIFO (--metrics /dev/stdout | jq) is written
   * to as it is, nothing cut.  A regular file's last line without its newline
   * (a writer killed part way, or an older gw-train's full disk) gets one, so
   * the lines after it stay whole lines; its own bytes are kept. */
  if (!S_ISREG(st.st_mode)) return 0;
  char last = '\n';
  const int rfd = st.st_size > 0 ? open(metrics_path, O_RDONLY | O_CLOEXEC) : -1; /* none: write-only, unchecked */
  if (rfd >= 0 && pread(rfd, &last, 1, st.st_size - 1) != 1) last = '\n';
  if (rfd >= 0) close(rfd);
  if (last != '\n' && (fputc('\n', l->metrics) == EOF || fflush(l->metrics) != 0)) {
    snprintf(err, errlen, "%s: cannot end its last line (half a line, from a writer stopped part way): %s",
             metrics_path, strerror(errno));
    fclose(l->metrics);
    l->metrics = NULL;
    return -1;
  }
  l->metrics_end = (long long)st.st_size + (last != '\n');
  return 0;
}

/* After each metrics line: its bytes out (fflush), or, when they could not
 * all go (a full disk, an I/O error), the file cut back to its last whole
 * line, one warning naming the file, the reason and the last step it holds,
 * and no more lines: the training goes on (its checkpoints say for
 * themselves when they cannot be written), and a parser never meets half a
 * line. */
static int metrics_done(struct train_log *l) {
  FILE *f = l->metrics;
  errno = 0;
  const int failed = fflush(f) != 0 || ferror(f);
  if (!failed) {
    if (l->metrics_end >= 0) l->metrics_end = (long long)ftello(f);
    return 0;
  }
  const int e = errno ? errno : EIO;
  /* Cut after the close: a close flushes what is still buffered, and the
   * space the cut frees would let the rest of the half line in. */
  const int fd = l->metrics_end >= 0 ? dup(fileno(f)) : -1;
  fclose(f);
  l->metrics = NULL;
  const int cut = fd >= 0 && ftruncate(fd, (off_t)l->metrics_end) == 0;
  if (fd >= 0) close(fd);
  char held[64] = "no training line";
  if (l->metrics_step >= 0) snprintf(held, sizeof held, "training lines up to step %lld", (long long)l->metrics_step);
  log_rank(l, "warning: --metrics %s: %s; no more lines are written (it holds %s%s)", l->metrics_path, strerror(e),
           held, cut ? "" : "; its last line may be cut short");
  return -1;
}

void log_resumed(struct train_log *l, int64_t step) {
  l->start_step = step, l->start = now(); /* the ETA: this process's pace */
  if (l->rank != 0 || !l->metrics) return;
  fprintf(l->metrics, "{\"type\":\"resume\",\"step\":%lld}\n", (long long)step);
  metrics_done(l);
}

void log_marker(struct train_log *l, const char *type) {
  if (l->rank != 0 || !l->metrics) return;
  fprintf(l->metrics, "{\"type\":\"%s\"}\n", type);
  metrics_done(l);
}

static void end_line(struct train_log *l) {
  if (l->line_open) fputc('\n', stdout);
  l->line_open = 0;
}

void log_close(struct train_log *l) {
  if (l->rank != 0) return;
  end_line(l);
  if (l->metrics) fclose(l->metrics);
  l->metrics = NULL;
}

/* One line: a file name with a newline in it (data errors and the dataset's
 * notes name files) printed a line of its own, one that could pass for
 * gw-train's. */
static void one_line(char *line) {
  for (char *c = line; *c; c++)
    if ((unsigned char)*c < 0x20 && *c != '\t') *c = '?';
}

void log_text(struct train_log *l, const char *fmt, ...) {
  if (l->rank != 0) return;
  end_line(l);
  char line[GW_MODEL_ERRMSG_MAX + 1200]; /* a dataset's description (notes naming files) and the words around */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  one_line(line);
  printf("gw-train: %s\n", line);
  fflush(stdout);
}

void log_rank(struct train_log *l, const char *fmt, ...) {
  if (l->rank == 0) end_line(l);
  char line[GW_MODEL_ERRMSG_MAX + 400]; /* a data error (a whole path) and the words around it */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  one_line(line);
  fprintf(stderr, "gw-train: rank %d: %s\n", l->rank, line);
  fflush(stderr);
}

static void eta(char *buf, size_t cap, double seconds) {
  if (seconds >= 1e8) { /* (over 3 years; it printed 0:00) */
    snprintf(buf, cap, "over %.0f years", floor(seconds / (365.25 * 86400)));
    return;
  }
  long s = seconds > 0 ? (long)seconds : 0;
  if (s >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else snprintf(buf, cap, "%ld:%02ld", s / 60, s % 60);
}

/* A number for the metrics file: JSON has no NaN or infinity (Python's and
 * jq's parsers refuse the nan and inf printf writes, and a diverged run's
 * lines are the ones wanted), so those are null. */
struct jnum {
  char s[40];
};
static struct jnum jnum(const char *fmt, double v) {
  struct jnum j = {"null"};
  if (isfinite(v)) snprintf(j.s, sizeof j.s, fmt, v);
  return j;
}

void log_step(struct train_log *l, const struct step_report *r, int print) {
  if (l->rank != 0) return;
  if (l->metrics) {
    fprintf(l->metrics,
            "{\"type\":\"train\",\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"lr\":%s,\"img_per_s\":%s,"
            "\"compute_ms\":%s,\"comm_ms\":%s,\"comm_exposed_ms\":%s,\"data_ms\":%s,\"skipped\":%lld,"
            "\"loss_scale\":%s,\"overflows\":%lld}\n",
            (long long)r->step, (long long)r->epoch + 1, jnum("%.9g", r->loss).s, jnum("%.6g", r->lr).s,
            jnum("%.2f", r->img_per_s).s, jnum("%.2f", r->compute_ms).s, jnum("%.2f", r->comm_ms).s,
            jnum("%.2f", r->exposed_ms).s, jnum("%.2f", r->data_ms).s, (long long)r->skipped,
            jnum("%.9g", r->loss_scale).s, (long long)r->overflows);
    if (metrics_done(l) == 0) l->metrics_step = r->step;
  }
  if (!l->tty && !print) return;
  double elapsed = now() - l->start;
  char left[32];
  const int64_t done = r->step - l->start_step;
  eta(left, sizeof left, done > 0 ? elapsed / (double)done * (double)(r->steps_total - r->step) : 0);
  char line[320], comm[48] = "";
  if (isfinite(r->exposed_ms)) snprintf(comm, sizeof comm, " exposed comm %.1f ms", r->exposed_ms);
  snprintf(line, sizeof line, "epoch %lld/%lld step %lld/%lld loss %.4f lr %.4g %.1f img/s%s ETA %s",
           (long long)r->epoch + 1, (long long)r->epochs, (long long)r->step_in_epoch, (long long)r->steps_per_epoch,
           r->loss, r->lr, r->img_per_s, comm, left);
  if (l->tty) {
    printf("\r%-110s", line);
    l->line_open = 1;
  } else {
    printf("gw-train: %s\n", line);
  }
  fflush(stdout);
}

void log_eval(struct train_log *l, int64_t epoch, int64_t step, double top1, double top5, double loss,
              double nll, int64_t samples) {
  if (l->rank != 0) return;
  char t5[48] = "top-5 n/a (fewer than 5 classes)", ce[96] = "";
  if (!isnan(top5)) snprintf(t5, sizeof t5, "top-5 %.2f%%", 100 * top5);
  /* The same figure unless the loss is label-smoothed (NaN: both NaN). */
  if (!(loss == nll || (isnan(loss) && isnan(nll)))) snprintf(ce, sizeof ce, " (label-smoothed; cross-entropy %.4f)", nll);
  char when[48] = ""; /* epoch 0: --test-only's evaluation, of no epoch */
  if (epoch > 0) snprintf(when, sizeof when, "epoch %lld ", (long long)epoch);
  log_text(l, "%sevaluation: top-1 %.2f%%, %s, loss %.4f%s over %lld samples", when, 100 * top1, t5, loss, ce,
           (long long)samples);
  if (l->metrics) {
    fprintf(l->metrics,
            "{\"type\":\"eval\",\"epoch\":%lld,\"step\":%lld,\"top1\":%s,\"top5\":%s,\"loss\":%s,\"nll\":%s,"
            "\"samples\":%lld}\n",
            (long long)epoch, (long long)step, jnum("%.6f", top1).s, jnum("%.6f", top5).s, jnum("%.6f", loss).s,
            jnum("%.6f", nll).s, (long long)samples);
    metrics_done(l);
  }
}

void log_summary(struct train_log *l, int64_t steps, int64_t timed, double seconds, double img_per_s) {
  if (l->rank != 0) return;
  log_text(l, "%lld steps run: %.1f img/s over the %lld after the first (all ranks together; %.2f s of steps; "
           "evaluations and checkpoints left out)", (long long)steps, img_per_s, (long long)timed, seconds);
  if (l->metrics) {
    fprintf(l->metrics, "{\"type\":\"summary\",\"steps\":%lld,\"timed_steps\":%lld,\"seconds\":%s,\"img_per_s\":%s}\n",
            (long long)steps, (long long)timed, jnum("%.6f", seconds).s, jnum("%.2f", img_per_s).s);
    metrics_done(l);
  }
}

/* Runs `gnuplot arg` (a script, or --version) with its output silenced
 * (gnuplot's warnings, a single point's empty range, are noise on the log);
 * 0 when it exited 0.  Spawned, not forked: the communicator is alive, and a
 * fork makes its registered memory copy-on-write (an HCA on an older kernel
 * would then go on reading pages the process no longer uses). */
static int run_gnuplot(const char *pre, const char *arg, char *err, size_t errlen) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  char *const argv_pre[] = {"gnuplot", "-e", (char *)pre, (char *)arg, NULL}, *const argv_one[] = {"gnuplot",
                                                                                                    (char *)arg, NULL};
  char *const *argv = pre ? argv_pre : argv_one;
  pid_t pid;
  int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (e == ENOENT) {
    snprintf(err, errlen, "gnuplot is not installed (apt-get install gnuplot-nox)");
    return -1;
  }
  if (e) {
    snprintf(err, errlen, "cannot start gnuplot: %s", strerror(e));
    return -1;
  }
  /* At most GNUPLOT_WAIT_S: a plot takes a fraction of a second, and a
   * gnuplot stuck (on an output it cannot open, say) held the training. */
  int status;
  const double deadline = now() + GNUPLOT_WAIT_S;
  for (pid_t w; (w = waitpid(pid, &status, WNOHANG)) <= 0;) {
    if (w < 0 && errno != EINTR) { /* ECHILD: SIGCHLD ignored (inherited), the child reaped for us */
      snprintf(err, errlen, "cannot wait for gnuplot: %s", strerror(errno));
      return -1;
    }
    if (now() > deadline) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
      snprintf(err, errlen, "gnuplot did not finish in %d s: stopped", GNUPLOT_WAIT_S);
      return -1;
    }
    usleep(10000);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  snprintf(err, errlen, WIFEXITED(status) && WEXITSTATUS(status) == 127 ? "gnuplot is not installed (apt-get "
                                                                          "install gnuplot-nox)"
                                                                        : "gnuplot failed");
  return -1;
}

/* Whether a PNG file ends with its IEND chunk (length 0, type, CRC): one cut
 * short by a failed write does not. */
static bool png_whole(const char *path) {
  static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
  unsigned char tail[12];
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  const bool ok = fstat(fd, &st) == 0 && st.st_size >= 8 + 12 &&
                  pread(fd, tail, sizeof tail, st.st_size - (off_t)sizeof tail) == (ssize_t)sizeof tail &&
                  !memcmp(tail, iend, sizeof tail);
  close(fd);
  return ok;
}

/* An existing file --plot replaces is a PNG image, or empty: anything else
 * (the run's own dataset file) was replaced without a word. */
static int plot_file_ok(const char *png, char *err, size_t errlen) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (!replaced_content_at_stake(png)) return 0;
  unsigned char head[8];
  const int fd = open(png, O_RDONLY | O_CLOEXEC);
  const bool is_png = fd >= 0 && pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head && !memcmp(head, sig, 8);
  if (fd >= 0) close(fd);
  if (is_png) return 0;
  snprintf(err, errlen, "--plot %.900s: %s: name a new file, or a PNG image it may replace (or remove it first)", png,
           fd < 0 ? "cannot be read to see that it is an image it may replace" : "holds something other than a PNG image");
  return -1;
}

/* Whether path (a file that exists, with content) is what plot_epoch writes
 * there (1; 0 not, -1 it cannot be read): side 0, the data: lines of an epoch
 * and three numbers (inf and nan spelled as printf spells them), at most 16
 * MiB; side 1, the script: it begins with the first line of a script
 * gw-train writes, or wrote before 2026-12-05. */
static int plot_side_ours(const char *path, int side) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  bool ours = true;
  if (side == 1) {
    static const char *const firsts[] = {"script = exists('ARG0') ? ARG0 : ''\n", "here = ARG0\n",
                                         "set terminal png size 900,500\n"};
    char head[64] = "";
    const size_t got = fread(head, 1, sizeof head - 1, f);
    ours = false;
    for (size_t i = 0; i < sizeof firsts / sizeof firsts[0]; i++)
      ours = ours || (got >= strlen(firsts[i]) && !memcmp(head, firsts[i], strlen(firsts[i])));
  } else {
    char line[256];
    long total = 0;
    while (ours && fgets(line, sizeof line, f)) {
      long long e;
      double v[3];
      char extra;
      total += (long)strlen(line);
      ours = total <= (16L << 20) && strchr(line, '\n') &&
             sscanf(line, "%lld %lf %lf %lf %c", &e, &v[0], &v[1], &v[2], &extra) == 4 &&
             strspn(line, "0123456789.-+eEnaif \n") == strlen(line);
    }
    ours = ours && !ferror(f);
  }
  fclose(f);
  return ours ? 1 : 0;
}

int plot_check(const char *png, char *err, size_t errlen) {
  /* replaced (below): a FIFO held gnuplot, and so the training, for ever */
  if (replaced_path_ok("--plot", png, OUTPATH_TEMP_PLOT, err, errlen) != 0 || plot_file_ok(png, err, errlen) != 0)
    return -1;
  /* and the data and script beside it (PNG.dat, PNG.gp, each renamed over
   * from its .tmp): a directory there failed only at the first epoch's end */
  static const char *const side[2][2] = {{".dat", "--plot's data"}, {".gp", "--plot's script"}};
  for (int i = 0; i < 2; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s%s", png, side[i][0]);
    if (replaced_path_ok(side[i][1], path, 4, err, errlen) != 0) return -1;
    /* and what is there is an earlier plot's (weights saved under that
     * name, a user's notes, were replaced without a word: a helper's probe) */
    const int ours = replaced_content_at_stake(path) ? plot_side_ours(path, i) : 1;
    if (ours < 0) {
      snprintf(err, errlen, "--plot %.900s: %.900s cannot be read to see that it is %s it may replace: %s", png, path,
               i ? "a gnuplot script gw-train wrote" : "the plot's data gw-train wrote", strerror(errno));
      return -1;
    }
    if (!ours) {
      snprintf(err, errlen, "--plot %.900s: %.900s holds something other than %s: name a new file, or remove it first",
               png, path, i ? "a gnuplot script gw-train wrote" : "the plot's data gw-train wrote");
      return -1;
    }
  }
  /* The path goes into the gnuplot script between single quotes. */
  if (strpbrk(png, "'\n\r")) {
    snprintf(err, errlen, "--plot %s: a quote or a line break in the path would break the gnuplot script; choose "
             "another name", png);
    return -1;
  }
  char why[200];
  if (run_gnuplot(NULL, "--version", why, sizeof why) == 0) return 0;
  snprintf(err, errlen, "--plot %s: %s", png, why);
  return -1;
}

int plot_epoch(const char *png, int64_t epoch, double train_loss, double top1, double top5, char *err,
               size_t errlen) {
  char data[4096], script[4200];
  snprintf(data, sizeof data, "%s.dat", png);
  snprintf(script, sizeof script, "%s.gp", png);
  /* The rows of earlier epochs stay; a resume from before epoch `epoch`'s
   * end drew it (and later ones) already: those rows are replaced. */
  char line[256], tmp[4208];
  snprintf(tmp, sizeof tmp, "%s.tmp", data);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    return -1;
  }
  FILE *old = epoch > 1 ? fopen(data, "r") : NULL;
  while (old && fgets(line, sizeof line, old)) {
    long long e;
    if (sscanf(line, "%lld", &e) == 1 && e < epoch) fputs(line, f);
  }
  if (old) fclose(old);
  fprintf(f, "%lld %.6f %.4f %.4f\n", (long long)epoch, train_loss, 100 * top1, 100 * top5);
  if (fclose(f) != 0 || rename(tmp, data) != 0) {
    snprintf(err, errlen, "cannot write %s: %s", data, strerror(errno));
    unlink(tmp);
    return -1;
  }
  /* Written aside and renamed over the last one, as the data: a full disk
   * leaves the script before it whole. */
  snprintf(tmp, sizeof tmp, "%s.tmp", script);
  f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    return -1;
  }
  /* The files by their names in the script's own folder (ARG0's, gnuplot
   * 5): `cd plots && gnuplot p.png.gp` found none when they were named from
   * the training's working directory. */
  const char *png_base = strrchr(png, '/') ? strrchr(png, '/') + 1 : png;
  const char *data_base = strrchr(data, '/') ? strrchr(data, '/') + 1 : data;
  fprintf(f,
          "script = exists('ARG0') ? ARG0 : ''\nhere = script\n"
          "while (strstrt(here, '/') > 0) { here = here[strstrt(here, '/') + 1:] }\n"
          "here = script[1:strlen(script) - strlen(here)]\n"
          "set terminal png size 900,500\nif (!exists('out')) out = here.'%s'\nset output out\n"
          "set xlabel 'epoch'\nset ylabel 'training loss'\n"
          "set y2label 'test accuracy (%%)'\nset ytics nomirror\nset y2tics\nset key center right\nset grid\n"
          "plot here.'%s' using 1:2 with linespoints title 'training loss' axes x1y1, "
          "here.'%s' using 1:3 with linespoints title 'top-1' axes x1y2%s%s%s\n",
          png_base, data_base, data_base, isnan(top5) ? "" : ", here.'", isnan(top5) ? "" : data_base,
          isnan(top5) ? "" : "' using 1:4 with linespoints title 'top-5' axes x1y2"); /* none under 5 classes */
  if (fclose(f) != 0 || rename(tmp, script) != 0) { /* a full disk: gnuplot would run half a script */
    snprintf(err, errlen, "cannot write %s: %s", script, strerror(errno));
    unlink(tmp);
    return -1;
  }
  /* The image too is drawn aside (the script's `out`) and renamed over the
   * last one only whole: gnuplot exits 0 when its write fails, and a full
   * disk left a cut PNG in the last good one's place without a word. */
  /* Through a symbolic link, the file it names (the rename would put a
   * regular file in the link's place; gnuplot wrote through it). */
  struct stat lsb;
  char *real = lstat(png, &lsb) == 0 && S_ISLNK(lsb.st_mode) ? realpath(png, NULL) : NULL;
  const char *target = real ? real : png;
  char img[4210], pre[4240];
  snprintf(img, sizeof img, "%s.tmp", target);
  snprintf(pre, sizeof pre, "out = '%s'", img);
  unlink(img);
  int rc = strpbrk(img, "'\n\r") ? -1 : run_gnuplot(pre, script, err, errlen);
  if (rc != 0 && strpbrk(img, "'\n\r"))
    snprintf(err, errlen, "%s: the file it names has a quote or a line break in its path", png);
  if (rc == 0 && !png_whole(img)) {
    snprintf(err, errlen, "gnuplot wrote %s short (a full disk?): %s kept as it was", img, target);
    rc = -1;
  }
  if (rc == 0 && rename(img, target) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", img, target, strerror(errno));
    rc = -1;
  }
  if (rc != 0) unlink(img);
  free(real);
  return rc;
}
