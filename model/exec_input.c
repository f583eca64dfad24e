/* exec_input.c - the executor's input batch on the host: float32 NCHW images
 * (as the loaders give them) converted to the backend's activation dtype and
 * layout, for gw_exec_forward's host batches and gw_exec_stage's staging
 * buffers.  Large batches are split by samples over a few threads.  Nothing
 * here knows the executor's plan (exec.c calls gw__exec_input). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "half.h"
#include "model_internal.h"

/* One conversion: the whole batch's destination and source, and what to make. */
struct input_conv {
  void *dst;
  const float *images;
  const struct gw_act *a;
  int act_dt, nhwc;
};

/* Samples [s0, s1) of the batch into dst (the whole batch's buffer). */
static void input_samples(const struct input_conv *cv, int s0, int s1) {
  const struct gw_act *a = cv->a;
  const size_t c = (size_t)a->c, hw = (size_t)a->h * a->w, per = c * hw;
  const float *images = cv->images;
  const int f32 = cv->act_dt == GW_FLOAT32, f16 = cv->act_dt == GW_FLOAT16;
  if (!cv->nhwc) {
    const size_t off = (size_t)s0 * per, n = (size_t)(s1 - s0) * per;
    if (!f32) gw_f32_to_half_n(f16, (uint16_t *)cv->dst + off, images + off, n);
    else memcpy((float *)cv->dst + off, images + off, n * sizeof(float));
    return;
  }
  float *f = cv->dst;
  uint16_t *h = cv->dst;
  for (int smp = s0; smp < s1; smp++) {
    const float *src = images + (size_t)smp * per;
    const size_t base = (size_t)smp * per;
    for (size_t ch = 0; ch < c; ch++)
      for (size_t i = 0; i < hw; i++) {
        const float v = src[ch * hw + i];
        const size_t o = base + i * c + ch;
        if (f32) f[o] = v;
        else h[o] = f16 ? gw_f32_to_f16(v) : gw_f32_to_bf16(v);
      }
  }
}

struct input_job {
  const struct input_conv *cv;
  int s0, s1;
};

static void *input_job_main(void *arg) {
  const struct input_job *j = arg;
  input_samples(j->cv, j->s0, j->s1);
  return NULL;
}

/* Threads for converting a host batch of `values`: GW_STAGE_THREADS when set
 * (at any size), else the online CPUs up to 8 from 1 Mi values up (below, one
 * thread costs less than starting others).  A single thread converted
 * ResNet-50's 256 x 224 x 224 x 3 batch to bf16 NHWC in 68 ms on the H200's
 * host, longer than the GPU's backward, so the step waited for it. */
static int input_threads(size_t values) {
  const char *v = getenv("GW_STAGE_THREADS");
  long n;
  if (v && *v) {
    n = strtol(v, NULL, 10);
  } else {
    n = values < ((size_t)1 << 20) ? 1 : sysconf(_SC_NPROCESSORS_ONLN);
    n = n > 8 ? 8 : n;
  }
  return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

/* The whole batch, in sample ranges over input_threads() threads (this one
 * takes the first; a thread that cannot start leaves its range to this one). */
void gw__exec_input(void *dst, const float *images, int batch, const struct gw_act *a, int act_dt, int nhwc) {
  const struct input_conv cv = {dst, images, a, act_dt, nhwc};
  int nt = input_threads((size_t)batch * a->c * a->h * a->w);
  if (nt > batch) nt = batch;
  if (nt <= 1) {
    input_samples(&cv, 0, batch);
    return;
  }
  pthread_t th[64];
  struct input_job job[64];
  int started[64] = {0};
  for (int t = 0; t < nt; t++) {
    job[t] = (struct input_job){&cv, (int)((int64_t)batch * t / nt), (int)((int64_t)batch * (t + 1) / nt)};
    if (t > 0) started[t] = pthread_create(&th[t], NULL, input_job_main, &job[t]) == 0;
  }
  input_samples(&cv, job[0].s0, job[0].s1);
  for (int t = 1; t < nt; t++) {
    if (started[t]) pthread_join(th[t], NULL);
    else input_samples(&cv, job[t].s0, job[t].s1);
  }
}
