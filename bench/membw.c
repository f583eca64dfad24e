/* membw.c - host memory bandwidth, the physical limit of a shared-memory allreduce.
 *
 * Measures memcpy with one thread and with two (each thread its own buffers) and a
 * float32 c = a + b with two threads, on buffers that are mapped and written once
 * before any timing, so page faults are not measured.  Best of several repetitions.
 *
 * A repetition's rate is all threads' bytes over the union of their intervals (first
 * start to last end), not the sum of per-thread rates: in a repetition where one
 * thread was descheduled the threads barely overlap, and the sum adds up two solo
 * rates, a "2-thread" figure no two ranks copying at once would ever see.  Over the
 * union, such a repetition comes out slow and loses to one where they did run together.
 * It does not pin threads or pick NUMA nodes: it answers "how fast can two ranks on
 * this box move memory", the setting compare.sh runs gradwire and Open MPI in.
 *
 * Output is one "key value" line per figure (lines starting with '#' are comments):
 *   memcpy_1t_GBps      bytes copied per second, 1 thread
 *   memcpy_2t_GBps      bytes copied per second, both threads' bytes / (last end -
 *                       first start)
 *   add_2t_GBps         bytes of c produced per second, 2 threads, likewise
 *   *_rw_GBps           the same counting every byte read and written: 2x for
 *                       memcpy (read src, write dst), 3x for add (read a, b, write c)
 * and a comment line per 2-thread figure with how much of its repetition's union
 * interval both threads were running (the overlap; near 100% when they ran together).
 * GB/s means 1e9 bytes per second, as in nccl-tests.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MAX_THREADS 2

enum kernel { KERNEL_MEMCPY, KERNEL_ADD };

struct worker {
  float *a, *b, *c; /* [count] each, private to this thread */
  size_t count;
  double start, end; /* seconds, CLOCK_MONOTONIC, of the current repetition */
};

struct job {
  struct worker *w;
  int nthreads;
  enum kernel kernel;
  int reps;
  pthread_barrier_t *barrier;
  double best_GBps;    /* best over repetitions of all bytes / (last end - first start) */
  double best_overlap; /* that repetition's (first end - last start) / (last end - first start) */
};

struct thread_arg {
  struct job *job;
  int id;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The add as the reduction in an allreduce does it; restrict lets the compiler
 * vectorize without runtime overlap checks. */
static void add_f32(float *restrict c, const float *restrict a, const float *restrict b,
                    size_t n) {
  for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}

static void *thread_main(void *p) {
  struct thread_arg *arg = p;
  struct job *job = arg->job;
  struct worker *w = &job->w[arg->id];
  for (int rep = 0; rep < job->reps; rep++) {
    /* Thread 0 collects the previous repetition between the two waits. */
    pthread_barrier_wait(job->barrier);
    w->start = now();
    if (job->kernel == KERNEL_MEMCPY) memcpy(w->c, w->a, w->count * sizeof(float));
    else add_f32(w->c, w->a, w->b, w->count);
    w->end = now();
    pthread_barrier_wait(job->barrier);
    if (arg->id == 0) {
      double bytes = (double)w->count * sizeof(float);
      double first = 1e300, last = 0.0, last_start = 0.0, first_end = 1e300;
      for (int t = 0; t < job->nthreads; t++) {
        struct worker *x = &job->w[t];
        if (x->start < first) first = x->start;
        if (x->end > last) last = x->end;
        if (x->start > last_start) last_start = x->start;
        if (x->end < first_end) first_end = x->end;
      }
      double rate = bytes * job->nthreads / (last - first) / 1e9;
      if (rate > job->best_GBps) {
        job->best_GBps = rate;
        job->best_overlap = first_end > last_start ? (first_end - last_start) / (last - first) : 0.0;
      }
    }
  }
  return NULL;
}

struct rates {
  double GBps, overlap;
};

static struct rates run(struct worker *w, int nthreads, enum kernel kernel, int reps) {
  pthread_barrier_t barrier;
  pthread_t tid[MAX_THREADS];
  struct thread_arg args[MAX_THREADS];
  struct job job = {w, nthreads, kernel, reps, &barrier, 0.0, 0.0};
  if (pthread_barrier_init(&barrier, NULL, (unsigned)nthreads) != 0) {
    fprintf(stderr, "membw: pthread_barrier_init failed\n");
    exit(1);
  }
  for (int t = 0; t < nthreads; t++) {
    args[t] = (struct thread_arg){&job, t};
    /* A thread that did not start would leave the others waiting at the barrier. */
    if (pthread_create(&tid[t], NULL, thread_main, &args[t]) != 0) {
      fprintf(stderr, "membw: pthread_create failed\n");
      exit(1);
    }
  }
  for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  pthread_barrier_destroy(&barrier);
  return (struct rates){job.best_GBps, job.best_overlap};
}

/* Mapped with MAP_POPULATE and written once, so every page is resident and private
 * before timing (a read-only first touch would map the shared zero page). */
static float *alloc_buffer(size_t bytes, float value) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "membw: mmap of %zu bytes failed: %s (try a smaller -s)\n", bytes,
            strerror(errno));
    exit(1);
  }
  float *f = p;
  for (size_t i = 0; i < bytes / sizeof(float); i++) f[i] = value;
  return f;
}

/* A comment line: how much of the best repetition both threads ran at once. */
static void overlap_note(const char *name, double overlap) {
  printf("# %s: the best repetition's threads ran together %.0f%% of its interval%s\n", name, 100 * overlap,
         overlap < 0.9 ? " (under 90%: not a clean 2-thread figure; the machine was busy)" : "");
}

static void usage(FILE *f) {
  fprintf(f, "usage: membw [-s MIB_PER_BUFFER] [-r REPETITIONS]\n"
             "  defaults: -s 256 -r 10; uses 3 buffers per thread, 2 threads\n");
}

int main(int argc, char **argv) {
  long mib = 256, reps = 10;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    }
    if (i + 1 < argc && (strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "-r") == 0)) {
      char *end;
      long v = strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || v < 1 || v > (1L << 20)) {
        fprintf(stderr, "membw: bad value '%s' for %s\n", argv[i + 1], argv[i]);
        return 2;
      }
      if (argv[i][1] == 's') mib = v;
      else reps = v;
      i++;
      continue;
    }
    fprintf(stderr, "membw: unknown option %s\n", argv[i]);
    usage(stderr);
    return 2;
  }

  size_t bytes = (size_t)mib << 20;
  struct worker w[MAX_THREADS];
  for (int t = 0; t < MAX_THREADS; t++) {
    w[t].a = alloc_buffer(bytes, 1.0f);
    w[t].b = alloc_buffer(bytes, 2.0f);
    w[t].c = alloc_buffer(bytes, 0.0f);
    w[t].count = bytes / sizeof(float);
  }

  struct rates m1 = run(w, 1, KERNEL_MEMCPY, (int)reps);
  struct rates m2 = run(w, 2, KERNEL_MEMCPY, (int)reps);
  struct rates a2 = run(w, 2, KERNEL_ADD, (int)reps);

  /* Keeps the add from being optimised away and checks it did what it says. */
  if (w[0].c[0] != 3.0f || w[1].c[w[1].count - 1] != 3.0f) {
    fprintf(stderr, "membw: the add produced a wrong value\n");
    return 1;
  }

  printf("# membw: %ld MiB per buffer, best of %ld, GB/s = 1e9 bytes/s\n", mib, reps);
  printf("memcpy_1t_GBps %.1f\n", m1.GBps);
  printf("memcpy_1t_rw_GBps %.1f\n", 2 * m1.GBps);
  overlap_note("memcpy_2t", m2.overlap);
  printf("memcpy_2t_GBps %.1f\n", m2.GBps);
  printf("memcpy_2t_rw_GBps %.1f\n", 2 * m2.GBps);
  overlap_note("add_2t", a2.overlap);
  printf("add_2t_GBps %.1f\n", a2.GBps);
  printf("add_2t_rw_GBps %.1f\n", 3 * a2.GBps);
  return 0;
}
