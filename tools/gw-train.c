/* gw-train - data-parallel ResNet training on gradwire.  One process per rank,
 * launched by gw-run (or torchrun / srun / mpirun: gw_comm_init_env reads their
 * variables); alone it trains on one process.
 *
 *   gw-run -n 2 gw-train --data fashion-mnist --model resnet50 --epochs 2 --batch 32
 *   gw-train --model resnet50 --steps 0 --save-weights init.safetensors   (torchvision's shape)
 *
 * This file reads and checks the command line (every contradiction is refused
 * before any work starts); gw-train-loop.c does the work. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h" /* GW_LAYOUT_* */
#include "decimal.h"
#include "dataset.h"
#include "gw-train.h"
#include "gw_config.h"
#include "sampler.h" /* GW_SAMPLER_MAX_SAMPLES */

static void usage(FILE *f) {
  fprintf(f,
          "usage: [gw-run -n N] gw-train [options]\n"
          "data:\n"
          "  --data SPEC              fashion-mnist[:DIR] (default), imagenet:DIR or synthetic\n"
          "  --augment                random flips and crops on the training set (imagenet trains on random\n"
          "                           resized crops and flips, as torchvision, with or without it)\n"
          "  --val-crop-size V        imagenet: the evaluation's center crop, the side of the images it scores\n"
          "                           (default the image size; torchvision's newer recipe trains at 176, evaluates at 224)\n"
          "  --val-resize-size R      imagenet: the evaluation's shorter side before its center crop (default\n"
          "                           the crop x 256/224: 256 for 224, as torchvision's reference)\n"
          "  --drop-last              drop the samples that do not fill a shard evenly (else the shards are padded\n"
          "                           with repeats); a shard's last partial batch is always left out\n"
          "  --synthetic-samples N    samples of the synthetic set (default 10000, at most 1e8)\n"
          "  --loader-threads T       decoding threads per rank (default 1)\n"
          "model:\n"
          "  --model NAME             resnet18, resnet34, resnet50 (default), resnet101, resnet152\n"
          "  --classes N --in-channels C --image-size S\n"
          "                           default: the dataset's (given ones must agree with it); imagenet: S is\n"
          "                           the training crop (default 224; --train-crop-size S, torchvision's name)\n"
          "  --stem imagenet|small    7x7/2 conv + max pool (default), or 3x3/1 conv for small images\n"
          "  --width-divisor D        narrower layers (1, 2, 4, ..., 64; default 1 = torchvision)\n"
          "  --zero-init-residual     start the last BN gamma of every block at 0\n"
          "  --seed S                 initialization, shuffling and augmentation seed (default 0)\n"
          "  --load-weights FILE      start from FILE (safetensors, torchvision names), or from a checkpoint's\n"
          "                           weights (ckpt-N.safetensors: another world size or batch; momentum anew)\n"
          "  --save-weights FILE      write the trained weights (safetensors) at the end\n"
          "training:\n"
          "  --epochs E | --steps S   how long (exactly one; --steps 0 only builds, loads and saves: in\n"
          "                           --data's shape if given, else torchvision's, 1000 classes of 3x224x224)\n"
          "  --batch B                samples per rank per step (default 32)\n"
          "  --lr LR                  base learning rate for a global batch of 256 (default 0.1);\n"
          "                           the rate used is LR x global batch / 256\n"
          "  --momentum M             (default 0.9)  --nesterov\n"
          "  --wd WD                  weight decay on conv and fc weights, not BN or biases (default 1e-4)\n"
          "  --wd-all                 weight decay on every tensor, BN and biases too (torchvision's reference\n"
          "                           and plain torch.optim.SGD)\n"
          "  --warmup-epochs W        linear warmup, step by step (default 0.2; fractions allowed): from\n"
          "                           peak / warmup steps up to the peak (NVIDIA's recipe)\n"
          "  --warmup-start-factor F  warmup from F x peak instead (0 < F <= 1; torchvision's reference: 0.01;\n"
          "                           Goyal et al.: 256 / global batch)\n"
          "  --schedule cosine|step   after warmup: cosine to 0 (default) or steps of --lr-gamma\n"
          "  --lr-milestones E1,E2,.. step schedule: x --lr-gamma at these epochs from the start (Goyal et al.:\n"
          "                           30,60,80; fractions allowed; implies --schedule step); without them at\n"
          "                           1/3 and 2/3 of the steps after the warmup\n"
          "  --lr-gamma G             the step schedule's factor (0 < G <= 1, default 0.1)\n"
          "  --label-smoothing L      (default 0)\n"
          "  --threads T              compute threads per rank (default: the CPUs this process may use over\n"
          "                           the ranks on this machine that share them)\n"
          "  --backend cpu|cudnn      oneDNN on the host (default when built with it) or cuDNN on the GPU\n"
          "  --tf32 on|off            cudnn: TF32 tensor cores for the fp32 convolutions and fc (default on,\n"
          "                           as PyTorch's convolutions); off keeps full fp32\n"
          "  --amp off|bf16|fp16      mixed precision: activations in bfloat16 (both backends) or float16 (cudnn\n"
          "                           only; turns on --loss-scale dynamic unless given), weights, gradients,\n"
          "                           optimizer and BN statistics in float32 (default off)\n"
          "  --loss-scale off|dynamic|S  scale the loss's gradient by S (dynamic: start at --loss-scale-init,\n"
          "                           default 65536, halve when the gradients overflow (not below 1), double\n"
          "                           after 2000 steps without); S at least 1; a step whose gradients\n"
          "                           overflowed is skipped and counted\n"
          "  --loss-scale-init S      the dynamic scale's start\n"
          "  --host-step              cudnn: keep the master weights on the host (gradients copied down bucket by\n"
          "                           bucket, at one rank at once, the optimizer on the CPU, weights up each step) instead of on the\n"
          "                           GPU (default: weights, gradients and momentum stay there)\n"
          "  --layout nchw|nhwc       the activations' memory layout (default: the faster one measured: nhwc on cudnn\n"
          "                           with --amp, 1.11x NCHW's img/s with bf16 on an H200, and on cpu for images under\n"
          "                           56 px, 1.17x at 28x28; else nchw, 1.17x on cpu at 224); the same results but for\n"
          "                           max pool's backward on cpu (overlapping windows summed in another order)\n"
          "communication:\n"
          "  --sync-bn                batch-norm statistics over all ranks (SyncBatchNorm)\n"
          "  --bucket-mb MB           gradient bucket size (default 25)\n"
          "  --first-bucket-mb MB     the first bucket's size (default 1, as DDP: the last layers' gradients, ready\n"
          "                           first, go out early)\n"
          "  --no-overlap             allreduce after backward instead of during it (for comparison)\n"
          "  --grad-wire T            gradients travel as float32 (default), bfloat16 or float16: half the bytes,\n"
          "                           every reduction step in float32, the result back in float32\n"
          "checkpoints:\n"
          "  --checkpoint-dir DIR     rank 0 writes checkpoints there (atomic, checksummed)\n"
          "  --checkpoint-every N     also every N steps (default: at epoch ends and at the last step only)\n"
          "  --keep-checkpoints K     newest kept (default 3)\n"
          "  --resume                 continue from the newest valid checkpoint in --checkpoint-dir (without it,\n"
          "                           a folder that holds checkpoints is refused: a new run would overwrite them)\n"
          "output:\n"
          "  --metrics FILE.jsonl     one JSON object per step and per evaluation (img/s of all ranks\n"
          "                           together, as in the log; times are rank 0's, the loss the ranks' mean)\n"
          "  --plot FILE.png          loss and accuracy per epoch (gnuplot; writes FILE.png.dat and FILE.png.gp\n"
          "                           beside it, replacing earlier ones gw-train wrote)\n"
          "  --log-every N            steps between plain log lines when not on a terminal (default 50)\n"
          "  --no-eval                skip the evaluation at each epoch end\n"
          "  --test-only              evaluate --load-weights (weights or a checkpoint) once on the evaluation\n"
          "                           split and exit, training nothing (torchvision's --test-only)\n"
          "  -h, --help\n");
}

static int bad(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "gw-train: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return -1;
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || !gw_decimal_text(s) || v < lo || v > hi) {
    fprintf(stderr, "gw-train: %s wants a whole number in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
  long v;
  if (parse_long(opt, s, lo, hi, &v) != 0) return -1;
  *out = (int)v;
  return 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !gw_decimal_text(s) || !(v >= lo && v <= hi)) {
    /* (strtod's ERANGE for a number too small for a double: "1e-400 is not in [0, 1000]" was the message) */
    const bool tiny = errno == ERANGE && end != s && !*end && fabs(v) <= DBL_MIN && lo <= 0 && hi > 0;
    fprintf(stderr, "gw-train: %s wants a number in [%g, %g], got '%s'%s\n", opt, lo, hi, s,
            !tiny ? "" : lo == 0 ? " (too close to 0 for a double: write 0, or a number of at least 2.2e-308)"
                                 : " (too close to 0 for a double)");
    return -1;
  }
  *out = v;
  return 0;
}

enum {
  O_MODEL = 256, O_CLASSES, O_INCH, O_SIZE, O_STEM, O_WIDTH, O_ZERO, O_SEED, O_STEPS, O_SAVE, O_LOAD, O_DATA,
  O_AUGMENT, O_DROPLAST, O_SYNSAMPLES, O_LTHREADS, O_EPOCHS, O_BATCH, O_LR, O_MOMENTUM, O_NESTEROV, O_WD, O_WDALL,
  O_WARMUP, O_SCHED, O_SMOOTH, O_THREADS, O_SYNCBN, O_BUCKET, O_NOOVERLAP, O_CKDIR, O_CKEVERY, O_CKKEEP,
  O_RESUME, O_METRICS, O_PLOT, O_LOGEVERY, O_NOEVAL, O_TESTONLY, O_WIRE, O_BACKEND, O_TF32, O_AMP, O_LSCALE, O_LSINIT,
  O_HOSTSTEP, O_LAYOUT, O_FIRSTBUCKET, O_MILESTONES, O_GAMMA, O_WSTART, O_VALRESIZE, O_VALCROP, O_TRAINCROP
};

static const struct option longopts[] = {
    {"model", required_argument, NULL, O_MODEL},          {"classes", required_argument, NULL, O_CLASSES},
    {"in-channels", required_argument, NULL, O_INCH},      {"image-size", required_argument, NULL, O_SIZE},
    {"stem", required_argument, NULL, O_STEM},            {"width-divisor", required_argument, NULL, O_WIDTH},
    {"zero-init-residual", no_argument, NULL, O_ZERO},     {"seed", required_argument, NULL, O_SEED},
    {"steps", required_argument, NULL, O_STEPS},          {"save-weights", required_argument, NULL, O_SAVE},
    {"load-weights", required_argument, NULL, O_LOAD},     {"data", required_argument, NULL, O_DATA},
    {"augment", no_argument, NULL, O_AUGMENT},            {"drop-last", no_argument, NULL, O_DROPLAST},
    {"synthetic-samples", required_argument, NULL, O_SYNSAMPLES},
    {"val-resize-size", required_argument, NULL, O_VALRESIZE}, {"val-crop-size", required_argument, NULL, O_VALCROP},
    {"train-crop-size", required_argument, NULL, O_TRAINCROP},
    {"loader-threads", required_argument, NULL, O_LTHREADS}, {"epochs", required_argument, NULL, O_EPOCHS},
    {"batch", required_argument, NULL, O_BATCH},          {"lr", required_argument, NULL, O_LR},
    {"momentum", required_argument, NULL, O_MOMENTUM},     {"nesterov", no_argument, NULL, O_NESTEROV},
    {"wd", required_argument, NULL, O_WD},                {"wd-all", no_argument, NULL, O_WDALL},
    {"warmup-epochs", required_argument, NULL, O_WARMUP},
    {"warmup-start-factor", required_argument, NULL, O_WSTART},
    {"lr-milestones", required_argument, NULL, O_MILESTONES}, {"lr-gamma", required_argument, NULL, O_GAMMA},
    {"schedule", required_argument, NULL, O_SCHED},        {"label-smoothing", required_argument, NULL, O_SMOOTH},
    {"threads", required_argument, NULL, O_THREADS},       {"sync-bn", no_argument, NULL, O_SYNCBN},
    {"bucket-mb", required_argument, NULL, O_BUCKET},      {"no-overlap", no_argument, NULL, O_NOOVERLAP},
    {"first-bucket-mb", required_argument, NULL, O_FIRSTBUCKET},
    {"checkpoint-dir", required_argument, NULL, O_CKDIR},  {"checkpoint-every", required_argument, NULL, O_CKEVERY},
    {"keep-checkpoints", required_argument, NULL, O_CKKEEP}, {"resume", no_argument, NULL, O_RESUME},
    {"metrics", required_argument, NULL, O_METRICS},       {"plot", required_argument, NULL, O_PLOT},
    {"log-every", required_argument, NULL, O_LOGEVERY},    {"no-eval", no_argument, NULL, O_NOEVAL},
    {"test-only", no_argument, NULL, O_TESTONLY},
    {"grad-wire", required_argument, NULL, O_WIRE},        {"backend", required_argument, NULL, O_BACKEND},
    {"tf32", required_argument, NULL, O_TF32},            {"amp", required_argument, NULL, O_AMP},
    {"loss-scale", required_argument, NULL, O_LSCALE},    {"loss-scale-init", required_argument, NULL, O_LSINIT},
    {"host-step", no_argument, NULL, O_HOSTSTEP},         {"layout", required_argument, NULL, O_LAYOUT},
    {"help", no_argument, NULL, 'h'},                     {NULL, 0, NULL, 0}};

static int parse_seed(const char *arg, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(arg, &end, 10);
  if (errno || end == arg || *end || arg[0] < '0' || arg[0] > '9') /* strtoull takes " -1" and wraps it */
    return bad("--seed wants a non-negative whole number, got '%s'%s", arg, "");
  *out = v;
  return 0;
}

/* The model's options; 1 when c is not one of them. */
static int parse_model_option(struct train_opts *o, int c, const char *arg) {
  struct gw_model_config *m = &o->model;
  switch (c) {
  case O_MODEL:
    o->model_name = arg;
    if (gw_model_depth_from_name(arg, &m->depth) == 0) return 0;
    return bad("--model '%s' is not one of resnet18, resnet34, resnet50, resnet101, resnet152%s", arg, "");
  /* one class: the loss is 0 and nothing trains (it ran, "100% top-1") */
  case O_CLASSES: o->classes_given = 1; return parse_int("--classes", arg, 2, 1 << 24, &m->classes);
  case O_INCH: o->in_channels_given = 1; return parse_int("--in-channels", arg, 1, 4096, &m->in_channels);
  case O_SIZE:
  case O_TRAINCROP: /* torchvision's name for the same */
    o->image_size_given = 1, o->image_size_flag = c == O_SIZE ? "--image-size" : "--train-crop-size";
    return parse_int(o->image_size_flag, arg, 1, 8192, &m->image_size);
  case O_WIDTH: /* a power of two: it divides every layer's width (the model refused others, after the setup) */
    if (parse_int("--width-divisor", arg, 1, 64, &m->width_divisor) != 0) return -1;
    if (m->width_divisor & (m->width_divisor - 1))
      return bad("--width-divisor '%s' is not a power of two (1, 2, 4, 8, 16, 32 or 64)%s", arg, "");
    return 0;
  case O_ZERO: m->zero_init_residual = 1; return 0;
  case O_SEED: return parse_seed(arg, &m->seed);
  case O_STEM:
    o->stem_given = 1;
    if (strcmp(arg, "imagenet") == 0) m->stem = GW_STEM_IMAGENET;
    else if (strcmp(arg, "small") == 0) m->stem = GW_STEM_SMALL;
    else return bad("--stem '%s' is not imagenet or small%s", arg, "");
    return 0;
  }
  return 1;
}

/* --lr-milestones E1,E2,...: positive, increasing epochs. */
static int parse_milestones(struct train_opts *o, const char *arg) {
  o->n_milestones = 0;
  for (const char *p = arg;; p++) {
    char *end;
    errno = 0;
    const double v = strtod(p, &end);
    if (errno || end == p || (*end && *end != ',') || !gw_decimal_text(p) || !(v > 0 && v <= 1e6)) {
      fprintf(stderr, "gw-train: --lr-milestones wants epochs in (0, 1e6] separated by commas, got '%s'\n", arg);
      return -1;
    }
    if (o->n_milestones == GW_MAX_MILESTONES) {
      fprintf(stderr, "gw-train: --lr-milestones '%s': at most %d\n", arg, GW_MAX_MILESTONES);
      return -1;
    }
    if (o->n_milestones && v <= o->milestones[o->n_milestones - 1]) {
      fprintf(stderr, "gw-train: --lr-milestones '%s': %g is not after %g\n", arg, v,
              o->milestones[o->n_milestones - 1]);
      return -1;
    }
    o->milestones[o->n_milestones++] = v;
    if (!*end) return 0;
    p = end;
  }
}

/* The optimizer's and schedule's options; 1 when c is not one of them. */
static int parse_optim_option(struct train_opts *o, int c, const char *arg) {
  switch (c) {
  case O_EPOCHS: return parse_long("--epochs", arg, 1, 1000000, &o->epochs);
  case O_STEPS: return parse_long("--steps", arg, 0, LONG_MAX / 2, &o->steps);
  case O_BATCH: return parse_int("--batch", arg, 1, 1 << 20, &o->batch);
  case O_LR: return parse_double("--lr", arg, 0, 1e3, &o->lr);
  case O_MOMENTUM: return parse_double("--momentum", arg, 0, 1, &o->momentum);
  case O_NESTEROV: o->nesterov = 1; return 0;
  case O_WD: return parse_double("--wd", arg, 0, 1, &o->wd);
  case O_WDALL: o->wd_all = 1; return 0;
  case O_WARMUP: return parse_double("--warmup-epochs", arg, 0, 1e6, &o->warmup_epochs);
  case O_SMOOTH: return parse_double("--label-smoothing", arg, 0, 1, &o->label_smoothing);
  case O_THREADS: return parse_int("--threads", arg, 0, 4096, &o->threads);
  case O_SCHED:
    if (strcmp(arg, "cosine") == 0) o->schedule = GW_SCHED_COSINE;
    else if (strcmp(arg, "step") == 0) o->schedule = GW_SCHED_STEP;
    else return bad("--schedule '%s' is not cosine or step%s", arg, "");
    o->schedule_given = 1;
    return 0;
  case O_MILESTONES: return parse_milestones(o, arg);
  case O_GAMMA:
    o->lr_gamma_given = 1;
    if (parse_double("--lr-gamma", arg, 0, 1, &o->lr_gamma) != 0) return -1;
    return o->lr_gamma > 0 ? 0 : bad("--lr-gamma 0 would stop the training at the first milestone%s%s", "", "");
  case O_WSTART:
    if (parse_double("--warmup-start-factor", arg, 0, 1, &o->warmup_start) != 0) return -1;
    return o->warmup_start > 0 ? 0 : bad("--warmup-start-factor 0 would run the first step at lr 0%s%s", "", "");
  }
  return 1;
}

/* Everything else; -1 on a bad value, 1 for an unknown option. */
static int parse_run_option(struct train_opts *o, int c, const char *arg) {
  switch (c) {
  case O_DATA: o->data = arg, o->data_given = 1; return 0;
  case O_AUGMENT: o->augment = 1; return 0;
  case O_DROPLAST: o->drop_last = 1; return 0;
  case O_SYNSAMPLES: {
    long v;
    /* the sampler shuffles 8 bytes of index per sample each epoch, every rank */
    if (parse_long("--synthetic-samples", arg, 1, 100000000, &v) != 0) return -1;
    o->synthetic_samples = v, o->synthetic_given = 1;
    return 0;
  }
  case O_LTHREADS: return parse_int("--loader-threads", arg, 1, 256, &o->loader_threads);
  case O_VALRESIZE: return parse_int("--val-resize-size", arg, 8, 8192, &o->val_resize);
  case O_VALCROP: return parse_int("--val-crop-size", arg, 8, 4096, &o->val_crop);
  case O_SYNCBN: o->sync_bn = 1; return 0;
  case O_BUCKET: return parse_double("--bucket-mb", arg, 1.0 / 1024, 1 << 20, &o->bucket_mb);
  case O_FIRSTBUCKET: return parse_double("--first-bucket-mb", arg, 1.0 / 1024, 1 << 20, &o->first_bucket_mb);
  case O_NOOVERLAP: o->no_overlap = 1; return 0;
  case O_HOSTSTEP: o->host_step = 1; return 0;
  case O_LAYOUT:
    if (!strcmp(arg, "nchw")) o->layout = GW_LAYOUT_NCHW;
    else if (!strcmp(arg, "nhwc") || !strcmp(arg, "channels-last")) o->layout = GW_LAYOUT_NHWC;
    else return bad("--layout '%s' is not nchw or nhwc%s", arg, "");
    return 0;
  case O_WIRE:
    if (!strcmp(arg, "float32") || !strcmp(arg, "fp32")) o->grad_wire = GW_FLOAT32;
    else if (!strcmp(arg, "bfloat16") || !strcmp(arg, "bf16")) o->grad_wire = GW_BFLOAT16;
    else if (!strcmp(arg, "float16") || !strcmp(arg, "fp16")) o->grad_wire = GW_FLOAT16;
    else return bad("--grad-wire '%s' is not float32, bfloat16 or float16%s", arg, "");
    return 0;
  case O_BACKEND:
    if (strcmp(arg, "cpu") && strcmp(arg, "cudnn")) return bad("--backend '%s' is not cpu or cudnn%s", arg, "");
    if (!strcmp(arg, "cpu") && !GW_HAVE_ONEDNN)
      return bad("--backend cpu: this build has no oneDNN (apt-get install libdnnl-dev, then reconfigure)%s%s", "", "");
    if (!strcmp(arg, "cudnn") && !GW_HAVE_CUDNN)
      return bad("--backend cudnn: this build has no cuDNN (it needs the CUDA toolkit, cuDNN and cuBLAS when "
                 "configured)%s%s", "", "");
    o->backend = arg;
    return 0;
  case O_TF32:
    if (strcmp(arg, "on") && strcmp(arg, "off")) return bad("--tf32 '%s' is not on or off%s", arg, "");
    o->tf32 = !strcmp(arg, "on"), o->tf32_given = 1;
    return 0;
  case O_AMP:
    if (!strcmp(arg, "off")) o->amp = GW_FLOAT32;
    else if (!strcmp(arg, "bf16") || !strcmp(arg, "bfloat16")) o->amp = GW_BFLOAT16;
    else if (!strcmp(arg, "fp16") || !strcmp(arg, "float16")) o->amp = GW_FLOAT16;
    else return bad("--amp '%s' is not off, bf16 or fp16%s", arg, "");
    return 0;
  case O_LSCALE:
    o->loss_scale_given = 1;
    if (!strcmp(arg, "off")) o->loss_scale = 0, o->loss_scale_dynamic = 0;
    else if (!strcmp(arg, "dynamic")) o->loss_scale_dynamic = 1, o->loss_scale = 65536; /* or --loss-scale-init */
    else {
      o->loss_scale_dynamic = 0;
      /* At least 1: the overflow check looks at the scaled gradients, and
       * dividing by a scale below 1 could overflow after it passed. */
      return parse_double("--loss-scale (off, dynamic or a number of at least 1)", arg, 1, 3.4e38, &o->loss_scale);
    }
    return 0;
  case O_LSINIT: return parse_double("--loss-scale-init (at least 1)", arg, 1, 3.4e38, &o->loss_scale_init);
  case O_CKDIR: o->checkpoint_dir = arg; return 0;
  case O_CKEVERY: return parse_long("--checkpoint-every", arg, 1, LONG_MAX / 2, &o->checkpoint_every);
  case O_CKKEEP: o->keep_given = 1; return parse_int("--keep-checkpoints", arg, 1, 1000, &o->keep_checkpoints);
  case O_RESUME: o->resume = 1; return 0;
  case O_METRICS: o->metrics = arg; return 0;
  case O_PLOT: o->plot = arg; return 0;
  case O_LOGEVERY: return parse_long("--log-every", arg, 1, LONG_MAX / 2, &o->log_every);
  case O_NOEVAL: o->eval = 0; return 0;
  case O_TESTONLY: o->test_only = 1; return 0;
  case O_SAVE: o->save_weights = arg; return 0;
  case O_LOAD: /* (an empty name reached the open: "--load-weights: : cannot open") */
    if (!*arg) return bad("--load-weights: an empty file name%s%s", "", "");
    o->load_weights = arg;
    return 0;
  }
  return 1;
}

static void defaults(struct train_opts *o) {
  memset(o, 0, sizeof *o);
  gw_model_config_default(&o->model);
  o->model_name = "resnet50";
  o->image_size_flag = "--image-size";
  o->data = "fashion-mnist";
  o->epochs = 0, o->steps = -1;
  o->batch = 32, o->lr = 0.1, o->momentum = 0.9, o->wd = 1e-4, o->warmup_epochs = 0.2, o->lr_gamma = 0.1;
  o->bucket_mb = 25, o->first_bucket_mb = 1, o->grad_wire = GW_FLOAT32;
  o->keep_checkpoints = 3, o->loader_threads = 1, o->log_every = 50, o->eval = 1;
  o->synthetic_samples = 10000;
  o->backend = GW_HAVE_ONEDNN ? "cpu" : "cudnn";
  o->tf32 = 1;
  o->amp = GW_FLOAT32;
  o->layout = -1; /* the backend's default */
}

/* Contradictions, refused before any work. */
/* Where path would be: resolved as far as it exists, the rest taken
 * lexically (a name that does not exist is no link: "x/.." is its folder),
 * so two spellings of one file in a folder not made yet compare equal. */
static void where_at(const char *path, char *out, size_t cap, int depth) {
  char dir[4096], real[4096], parent[8400];
  if (realpath(path, real)) {
    snprintf(out, cap, "%s", real);
    return;
  }
  /* "." unresolved (a deleted working directory) or a path of hundreds of
   * missing folders: the name as given (each level takes 16 KiB of stack) */
  if (depth > 32 || !strcmp(path, ".") || !strcmp(path, "/")) {
    snprintf(out, cap, "%s", path);
    return;
  }
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  const char *base = slash ? path + (slash - dir) + 1 : path; /* in path: dir is rewritten below */
  if (slash == dir) snprintf(dir, sizeof dir, "/");
  else if (slash) *slash = 0;
  else snprintf(dir, sizeof dir, ".");
  where_at(dir, parent, sizeof parent, depth + 1); /* shorter than path: ends at "." or "/" at the latest */
  if (!*base || !strcmp(base, ".")) {
    snprintf(out, cap, "%s", parent);
  } else if (!strcmp(base, "..")) {
    char *last = strrchr(parent, '/');
    if (last && last != parent) *last = 0;
    else if (last) last[1] = 0;
    snprintf(out, cap, "%s", parent);
  } else { /* parent/base; past cap, the name as given */
    size_t n = strcmp(parent, "/") ? strlen(parent) : 0, b = strlen(base);
    if (n + 1 + b + 1 > cap) snprintf(out, cap, "%s", path);
    else memcpy(out, parent, n), out[n] = '/', memcpy(out + n + 1, base, b), out[n + 1 + b] = 0;
  }
}

static void where(const char *path, char *out, size_t cap) { where_at(path, out, cap, 0); }

/* Whether a and b are one existing file however they are spelled (a hard
 * link, a bind mount: where() tells only paths apart).  Only --metrics
 * writes its file in place (appends); the other outputs are renamed into
 * place, which replaces one name of a hard link and leaves the others. */
static bool same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* ckpt-<step>.safetensors, its temporary files and .refused copies, and the
 * lock: the names a checkpoint folder's saves and pruning replace or delete. */
static bool checkpoint_name(const char *base) {
  if (!strncmp(base, ".gw-train", 9)) return true;
  if (strncmp(base, "ckpt-", 5)) return false;
  size_t digits = 0;
  while (base[5 + digits] >= '0' && base[5 + digits] <= '9') digits++;
  return digits && !strncmp(base + 5 + digits, ".safetensors", 12);
}

/* Whether a live gw-train holds the checkpoint folder lock `lock` (its OFD
 * write lock; the file stays after the run). */
static bool lock_held(const char *lock) {
  const int fd = open(lock, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
  const bool held = fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
  close(fd);
  return held;
}

/* The checkpoint file of folder dir that path is another name of (a hard
 * link), into out; false when none is. */
static bool links_a_checkpoint(const char *dir, const char *path, char *out, size_t cap) {
  struct stat sp;
  DIR *d = stat(path, &sp) == 0 ? opendir(dir) : NULL;
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d));) {
    char full[8400];
    struct stat se;
    if (!checkpoint_name(e->d_name)) continue;
    snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
    found = stat(full, &se) == 0 && se.st_dev == sp.st_dev && se.st_ino == sp.st_ino;
    if (found) snprintf(out, cap, "%s", full);
  }
  closedir(d);
  return found;
}

/* Two of the files the run writes under one name: one would replace the
 * other (--save-weights renamed over the metrics; the plot's data file
 * rewritten over them each epoch). */
/* The files a run writes, as the collision rules see them: appended (written
 * in place, --metrics: any other name of the file, a hard link or a bind
 * mount, is the file) or renamed into place at the end (the others: a hard
 * link's other names keep the old file), and whether it may replace the
 * --load-weights file (--save-weights: fine-tuning in place).  at: where()'s
 * spelling of path. */
struct output {
  const char *flag, *path;
  bool appended, may_replace_input;
  char at[8400];
};

/* A checkpoint folder's own names: --checkpoint-dir's by any name of the
 * folder (a bind mount), and another run's folder (one with a .gw-train.lock:
 * --save-weights replaced a checkpoint of it) while that run holds it, or
 * after it unless fine-tuning a checkpoint in place; and for an appended file
 * any other name (a hard link) of one of --checkpoint-dir's checkpoints. */
static int collides_with_checkpoints(const struct train_opts *o, const struct output *w, const char *dir,
                                     const char *in) {
  char parent[8400], lock[8500], linked[8400];
  const size_t pl = strnlen(w->at, sizeof parent - 1);
  memcpy(parent, w->at, pl), parent[pl] = 0;
  char *slash = strrchr(parent, '/');
  const char *base = slash ? w->at + (slash - parent) + 1 : w->at;
  if (slash == parent) parent[1] = 0;
  else if (slash) *slash = 0;
  else snprintf(parent, sizeof parent, ".");
  const bool ours = o->checkpoint_dir && (!strcmp(parent, dir) || same_file(parent, o->checkpoint_dir));
  snprintf(lock, sizeof lock, "%s/.gw-train.lock", parent);
  if (checkpoint_name(base) && ours)
    return bad("%s %s is a name of --checkpoint-dir's own files (ckpt-<step>.safetensors*, .gw-train.lock): "
               "its saves and pruning would replace or delete it", w->flag, w->path);
  /* Another run's folder: refused while that run holds it (its pruning
   * deletes by name); after it, only fine-tuning a checkpoint in place
   * (--save-weights the --load-weights file) may replace one. */
  const bool in_place = w->may_replace_input && o->load_weights && !strcmp(w->at, in);
  if (checkpoint_name(base) && access(lock, F_OK) == 0 && (lock_held(lock) || !in_place))
    return bad(lock_held(lock) ? "%s %s is a name of a checkpoint folder's own files, and a running gw-train "
                                 "holds that folder (.gw-train.lock): its saves and pruning would replace or "
                                 "delete it"
                               : "%s %s is a name of a checkpoint folder's own files (the folder has a "
                                 ".gw-train.lock): it would replace that run's checkpoint (to fine-tune one in "
                                 "place, give it as both --load-weights and --save-weights)",
               w->flag, w->path);
  if (w->appended && o->checkpoint_dir && links_a_checkpoint(o->checkpoint_dir, w->path, linked, sizeof linked)) {
    fprintf(stderr, "gw-train: %s %s is another name (a hard link) of %s: writing it would damage that checkpoint\n",
            w->flag, w->path, linked);
    return -1;
  }
  return 0;
}

static int outputs_collide(const struct train_opts *o) {
  char dat[4200], gp[4200];
  if (o->plot) snprintf(dat, sizeof dat, "%s.dat", o->plot), snprintf(gp, sizeof gp, "%s.gp", o->plot);
  struct output w[5] = {
      {"--metrics", o->metrics, true, false, ""},
      {"--save-weights", o->save_weights, false, true, ""},
      {"--plot", o->plot, false, false, ""},
      {"--plot (its data, PNG.dat)", o->plot ? dat : NULL, false, false, ""},
      {"--plot (its script, PNG.gp)", o->plot ? gp : NULL, false, false, ""},
  };
  const int n = (int)(sizeof w / sizeof w[0]);
  for (int i = 0; i < n; i++)
    if (w[i].path) where(w[i].path, w[i].at, sizeof w[i].at);
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (w[i].path && w[j].path &&
          (!strcmp(w[i].at, w[j].at) || ((w[i].appended || w[j].appended) && same_file(w[i].path, w[j].path))))
        return bad("%s and %s name the same file: one would replace the other", w[i].flag, w[j].flag);
  /* The input: the metrics were appended to it, the plot written over it (a
   * later --load-weights refused what was left).  --save-weights may replace
   * it: that save is atomic, at the end, as fine-tuning in place wants. */
  char in[8400] = "", dir[8400] = "";
  if (o->load_weights) where(o->load_weights, in, sizeof in);
  for (int i = 0; i < n; i++)
    if (o->load_weights && w[i].path && !w[i].may_replace_input &&
        (!strcmp(w[i].at, in) || (w[i].appended && same_file(w[i].path, o->load_weights))))
      return bad("%s %s is --load-weights's file: the run would write over the weights it starts from", w[i].flag,
                 w[i].path);
  /* The checkpoint folders' own files: a save or the pruning there replaces
   * or deletes them (--save-weights over ckpt-N was taken for a damaged
   * checkpoint, and the resume went back a save). */
  if (o->checkpoint_dir) where(o->checkpoint_dir, dir, sizeof dir);
  for (int i = 0; i < n; i++)
    if (w[i].path && collides_with_checkpoints(o, &w[i], dir, in) != 0) return -1;
  return 0;
}

/* --test-only: an evaluation of given weights, so what trains or saves does not
 * apply (each refused by name rather than ignored). */
static int check_test_only(const struct train_opts *o) {
  static const char *const why = "--test-only evaluates --load-weights once and trains nothing";
  if (!o->eval) return bad("%s: --no-eval contradicts it%s", why, "");
  const char *const flag[] = {o->epochs > 0 ? "--epochs" : NULL, o->steps >= 0 ? "--steps" : NULL,
                              o->resume ? "--resume" : NULL, o->checkpoint_dir ? "--checkpoint-dir" : NULL,
                              o->checkpoint_every ? "--checkpoint-every" : NULL,
                              o->keep_given ? "--keep-checkpoints" : NULL, o->save_weights ? "--save-weights" : NULL,
                              o->plot ? "--plot" : NULL, o->drop_last ? "--drop-last" : NULL};
  for (size_t i = 0; i < sizeof flag / sizeof flag[0]; i++)
    if (flag[i]) return bad("%s: %s does not apply", why, flag[i]);
  return 0;
}

static int check(const struct train_opts *o) {
  if (o->test_only && check_test_only(o) != 0) return -1;
  if (o->epochs > 0 && o->steps >= 0) return bad("give --epochs or --steps, not both%s%s", "", "");
  if (o->epochs == 0 && o->steps < 0 && !o->test_only)
    return bad("say how long to train: --epochs E or --steps S (--steps 0: build, load and save only)%s%s", "", "");
  if (o->resume && !o->checkpoint_dir) return bad("--resume needs --checkpoint-dir DIR%s%s", "", "");
  if (o->loss_scale_init && !o->loss_scale_dynamic)
    return bad("--loss-scale-init needs --loss-scale dynamic%s%s", "", "");
  if (o->checkpoint_every && !o->checkpoint_dir) return bad("--checkpoint-every needs --checkpoint-dir DIR%s%s", "", "");
  if (o->keep_given && !o->checkpoint_dir) return bad("--keep-checkpoints needs --checkpoint-dir DIR%s%s", "", "");
  if (o->plot && !o->eval)
    return bad("--plot draws each epoch's test accuracy beside its loss: it needs the evaluation (drop --no-eval)%s%s",
               "", "");
  const char *d = o->data;
  const int fashion = !strncmp(d, "fashion-mnist", 13) && (!d[13] || d[13] == ':');
  if (o->augment && !fashion)
    return bad("--augment applies to fashion-mnist: %s %s", d,
               !strncmp(d, "imagenet:", 9) ? "always trains on random resized crops and flips"
                                           : "has nothing to augment");
  if (o->val_resize && strncmp(d, "imagenet:", 9))
    return bad("--val-resize-size applies to imagenet:DIR data: %s is not resized for its evaluation%s", d, "");
  if (o->val_resize && !o->eval)
    return bad("--val-resize-size sets the evaluation's resize: it needs the evaluation (drop --no-eval)%s%s", "", "");
  if (o->val_crop && strncmp(d, "imagenet:", 9))
    return bad("--val-crop-size applies to imagenet:DIR data: %s is evaluated at its own size%s", d, "");
  if (o->val_crop && o->test_only && o->image_size_given && o->model.image_size != o->val_crop) {
    char both[64];
    snprintf(both, sizeof both, "%d with %s %d", o->val_crop, o->image_size_flag, o->model.image_size);
    return bad("--test-only evaluates at the evaluation's crop: --val-crop-size %s (the training's size) is "
               "ambiguous%s: give one", both, "");
  }
  if (o->val_crop && !o->eval)
    return bad("--val-crop-size sets the evaluation's crop: it needs the evaluation (drop --no-eval)%s%s", "", "");
  const int crop = o->val_crop ? o->val_crop : o->image_size_given ? o->model.image_size : 224; /* imagenet's default */
  char rs[16], cs[48];
  snprintf(rs, sizeof rs, "%d", o->val_resize);
  snprintf(cs, sizeof cs, "%d (%s)", crop, o->val_crop ? "--val-crop-size" : o->image_size_flag);
  if (o->val_resize && o->val_resize < crop)
    return bad("--val-resize-size %s is smaller than the evaluation's crop %s: its center crop is taken from the "
               "resized image", rs, cs);
  if (o->synthetic_given && strcmp(d, "synthetic"))
    return bad("--synthetic-samples applies to --data synthetic, not %s%s", d, "");
  if (o->tf32_given && strcmp(o->backend, "cudnn"))
    return bad("--tf32 applies to --backend cudnn (the %s backend's float32 is full float32)%s", o->backend, "");
  if (o->nesterov && o->momentum <= 0) return bad("--nesterov needs a momentum > 0%s%s", "", "");
  if ((o->n_milestones || o->lr_gamma_given) && o->schedule != GW_SCHED_STEP)
    return bad("--%s applies to --schedule step, not cosine%s", o->n_milestones ? "lr-milestones" : "lr-gamma",
               o->schedule_given ? "" : " (the default; --lr-milestones implies step)");
  if (o->warmup_start > 0 && o->warmup_epochs <= 0)
    return bad("--warmup-start-factor needs a warmup (--warmup-epochs is 0)%s%s", "", "");
  if (o->amp == GW_FLOAT16 && strcmp(o->backend, "cudnn"))
    return bad("--amp fp16 needs --backend cudnn: the %s backend has no float16 activations (oneDNN trains float16 "
               "only on CPUs with AVX512-FP16 or AMX-FP16); --amp bf16 works there%s", o->backend, "");
  if (outputs_collide(o) != 0) return -1;
  if (o->steps == 0 && (o->resume || o->checkpoint_dir || o->metrics || o->plot))
    return bad("--steps 0 trains nothing: --resume, --checkpoint-dir, --metrics and --plot do not apply%s%s", "", "");
  return 0;
}

/* Returns 0 to go on, 1 to exit successfully (--help), 2 on a usage error. */
static int parse(int argc, char **argv, struct train_opts *o) {
  defaults(o);
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    if (c == 'h') {
      usage(stdout);
      return 1;
    }
    int r = parse_model_option(o, c, optarg);
    if (r == 1) r = parse_optim_option(o, c, optarg);
    if (r == 1) r = parse_run_option(o, c, optarg);
    if (r < 0) return 2;
    if (r == 1) {
      /* A short option in a bundle (-xy): optind has not moved past it. */
      if (optopt > 0 && optopt < 256 && optopt != c) /* a long option's optopt is its code (256 and up) */
        fprintf(stderr, "gw-train: unknown option or missing value: '-%c' (see --help)\n", optopt);
      else
        fprintf(stderr, "gw-train: unknown option or missing value: '%s' (see --help)\n", argv[optind - 1]);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gw-train: unexpected argument '%s' (see --help)\n", argv[optind]);
    return 2;
  }
  /* float16's range (65504 down to 2^-24) needs the gradients scaled: dynamic
   * scaling unless --loss-scale says otherwise, as PyTorch's GradScaler (before
   * the checks: --loss-scale-init applies to it). */
  if (o->amp == GW_FLOAT16 && !o->loss_scale_given) o->loss_scale_dynamic = 1, o->loss_scale = 65536;
  if (o->n_milestones && !o->schedule_given) o->schedule = GW_SCHED_STEP;
  return check(o) != 0 ? 2 : 0;
}

static const char *dtype_word(int d) {
  return d == GW_BFLOAT16 ? "bf16" : d == GW_FLOAT16 ? "fp16" : "fp32";
}

size_t train_opts_describe(const struct train_opts *o, char *buf, size_t len) {
  const struct gw_model_config *m = &o->model;
  char scale[64], ms[GW_MAX_MILESTONES * 24 + 8] = "none", ws[32] = "auto";
  for (int i = 0, at = 0; i < o->n_milestones; i++)
    at += snprintf(ms + at, sizeof ms - (size_t)at, "%s%.10g", i ? "," : "", o->milestones[i]);
  if (o->warmup_start > 0) snprintf(ws, sizeof ws, "%.10g", o->warmup_start);
  char vr[48] = ""; /* (0: the default); a resume notes a change, as of any option that changes a result */
  snprintf(vr, sizeof vr, " val_resize=%d val_crop=%d", o->val_resize, o->val_crop);
  if (o->loss_scale_dynamic) snprintf(scale, sizeof scale, "dynamic:%.10g", o->loss_scale_init ? o->loss_scale_init : o->loss_scale);
  else snprintf(scale, sizeof scale, "%.10g", o->loss_scale);
  int n = snprintf(buf, len,
                   "model=%s classes=%d in_channels=%d image_size=%d stem=%s width_divisor=%d zero_init_residual=%d "
                   "batch=%d seed=%llu drop_last=%d augment=%d lr=%.10g momentum=%.10g "
                   "wd=%.10g wd_all=%d nesterov=%d label_smoothing=%.10g warmup_epochs=%.10g schedule=%s epochs=%ld steps=%ld "
                   "lr_milestones=%s lr_gamma=%.10g warmup_start=%s "
                   "sync_bn=%d overlap=%d bucket_mb=%.10g first_bucket_mb=%.10g grad_wire=%s amp=%s loss_scale=%s "
                   "backend=%s tf32=%d layout=%s host_step=%d eval=%d save_weights=%d%s%s",
                   o->model_name, o->classes_given ? m->classes : 0, o->in_channels_given ? m->in_channels : 0,
                   o->image_size_given ? m->image_size : 0,
                   !o->stem_given ? "data's" : m->stem == GW_STEM_SMALL ? "small" : "imagenet", m->width_divisor,
                   m->zero_init_residual, o->batch, (unsigned long long)m->seed, o->drop_last, o->augment, o->lr, o->momentum, o->wd,
                   o->wd_all, o->nesterov, o->label_smoothing, o->warmup_epochs,
                   o->schedule == GW_SCHED_STEP ? "step" : "cosine", o->epochs, o->steps, ms, o->lr_gamma, ws,
                   o->sync_bn, !o->no_overlap,
                   o->bucket_mb, o->first_bucket_mb, dtype_word(o->grad_wire), dtype_word(o->amp), scale, o->backend,
                   o->tf32,
                   /* words (a rank's message said "layout 0 -> -1"); older checkpoints' numbers: a how-option, not compared */
                   o->layout == GW_LAYOUT_NCHW ? "nchw" : o->layout == GW_LAYOUT_NHWC ? "nhwc" : "auto", o->host_step, o->eval, o->save_weights != NULL,
                   o->test_only ? " test_only=1" : "", /* (never in a checkpoint: it writes none) */
                   vr);
  return n < 0 ? 0 : (size_t)n;
}

/* --steps 0: the model alone.  With --data, in the data's shape (its classes,
 * channels and image size, as a training run on it builds the model, flags
 * given checked against it); without, in the flags' shape, torchvision's
 * resnet*() by default (1000 classes of 3x224x224). */
static int build_only(struct train_opts *o) {
  if (o->data_given) {
    struct gw_data_options d;
    struct gw_dataset *ds = NULL;
    char why[300];
    train_data_options(o, &d);
    if (gw_dataset_open(&ds, o->data, GW_SPLIT_TRAIN, &d) != GW_SUCCESS) {
      fprintf(stderr, "gw-train: --data: %s\n", gw_data_last_error());
      return 1;
    }
    struct gw_model_config cfg;
    int bad = data_model_config(o, ds, &cfg, why, sizeof why);
    gw_dataset_free(ds);
    if (bad) {
      fprintf(stderr, "gw-train: %s: %s\n", o->data, why);
      return 1;
    }
    o->model = cfg;
  }
  struct gw_model *m = NULL;
  if (gw_model_init(&m, &o->model) != GW_SUCCESS) {
    fprintf(stderr, "gw-train: %s\n", gw_model_last_error());
    return 1;
  }
  int rc = 0;
  char why_out[1200];
  if (o->save_weights && weights_output_ok(o->save_weights, o->load_weights, why_out, sizeof why_out) != 0) {
    fprintf(stderr, "gw-train: %s\n", why_out); /* (--steps 0 converts: a checkpoint named as the output was replaced) */
    gw_model_free(m);
    return 1;
  }
  if (o->save_weights) weights_remove_stale_temps(o->save_weights);
  char why_load[1200];
  if (o->load_weights && load_weights(m, o->load_weights, o->model_name, why_load, sizeof why_load) != 0) {
    fprintf(stderr, "gw-train: --load-weights: %s\n", why_load);
    rc = 1;
  } else if (o->save_weights && gw_model_save_weights(m, o->save_weights) != GW_SUCCESS) {
    fprintf(stderr, "gw-train: --save-weights: %s\n", gw_model_last_error());
    rc = 1;
  } else {
    printf("gw-train: %s, %d classes, %d input channels, %dx%d, %s stem%s: %zu parameters in %d tensors%s%s%s%s\n",
           o->model_name, o->model.classes, o->model.in_channels, o->model.image_size, o->model.image_size,
           o->model.stem == GW_STEM_SMALL ? "small" : "imagenet", o->model.width_divisor > 1 ? " (narrowed)" : "",
           gw_model_num_params(m), gw_model_num_param_tensors(m), o->load_weights ? ", loaded " : "",
           o->load_weights ? o->load_weights : "", o->save_weights ? ", saved " : "",
           o->save_weights ? o->save_weights : "");
  }
  gw_model_free(m);
  return rc;
}

int main(int argc, char **argv) {
  trainer_catch_requests(); /* before anything slow: their default action ends the process */
  struct train_opts o;
  int p = parse(argc, argv, &o);
  if (p) return p == 1 ? 0 : 2;
  if (o.steps == 0 && !o.test_only) return build_only(&o);
  return gw_train_run(&o);
}
