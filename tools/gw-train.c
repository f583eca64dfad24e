/* gw-train - the trainer.  This first part builds the model from the command
 * line and moves its weights in and out as safetensors (torchvision's names and
 * layouts):
 *
 *   gw-train --model resnet50 --steps 0 --save-weights init.safetensors
 *   gw-train --model resnet50 --load-weights trained.safetensors --steps 0
 *
 * --steps 0 builds (and loads / saves) the model and exits; the training loop
 * itself (data, optimizer schedule, bucketed allreduce) is the training issue's
 * and refuses to run until it exists rather than pretending. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resnet.h"

struct opts {
  struct gw_model_config model;
  const char *model_name;
  long steps;
  const char *save_weights, *load_weights;
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: gw-train [options]\n"
          "model:\n"
          "  --model NAME           resnet18, resnet34, resnet50 (default), resnet101, resnet152\n"
          "  --classes N            outputs of the classifier (default 1000)\n"
          "  --in-channels C        channels of the input images (default 3)\n"
          "  --image-size S         input height = width (default 224)\n"
          "  --stem imagenet|small  7x7/2 conv + max pool (default), or 3x3/1 conv for small images\n"
          "  --width-divisor D      divide every layer width by D (1, 2, 4, ..., 64; default 1 = torchvision)\n"
          "  --zero-init-residual   start the last BN gamma of every block at 0\n"
          "  --seed S               initialization seed (default 0)\n"
          "weights:\n"
          "  --load-weights FILE    start from FILE (safetensors, torchvision names); refused unless every\n"
          "                         name, shape and dtype matches the model\n"
          "  --save-weights FILE    write the weights (safetensors) when done\n"
          "run:\n"
          "  --steps N              training steps; 0 builds, loads and saves the model only\n"
          "  -h, --help\n");
}

/* A whole decimal number in [lo, hi], or a message naming the option. */
static int parse_long(const char *opt, const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
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

static int parse_model_option(struct opts *o, int c, const char *arg) {
  struct gw_model_config *m = &o->model;
  switch (c) {
  case 'm':
    o->model_name = arg;
    if (gw_model_depth_from_name(arg, &m->depth) == 0) return 0;
    fprintf(stderr, "gw-train: --model '%s' is not one of resnet18, resnet34, resnet50, resnet101, resnet152\n",
            arg);
    return -1;
  case 'k': return parse_int("--classes", arg, 1, 1 << 24, &m->classes);
  case 'i': return parse_int("--in-channels", arg, 1, 4096, &m->in_channels);
  case 's': return parse_int("--image-size", arg, 1, 8192, &m->image_size);
  case 'w': return parse_int("--width-divisor", arg, 1, 64, &m->width_divisor);
  case 'z': m->zero_init_residual = 1; return 0;
  case 'S': {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || end == arg || *end || arg[0] == '-') {
      fprintf(stderr, "gw-train: --seed wants a non-negative whole number, got '%s'\n", arg);
      return -1;
    }
    m->seed = v;
    return 0;
  }
  case 't':
    if (strcmp(arg, "imagenet") == 0) m->stem = GW_STEM_IMAGENET;
    else if (strcmp(arg, "small") == 0) m->stem = GW_STEM_SMALL;
    else {
      fprintf(stderr, "gw-train: --stem '%s' is not imagenet or small\n", arg);
      return -1;
    }
    return 0;
  }
  return 1; /* not a model option */
}

/* Returns 0 to go on, 1 to exit successfully (--help), 2 on a usage error. */
static int parse(int argc, char **argv, struct opts *o) {
  static const struct option longopts[] = {
      {"model", required_argument, NULL, 'm'},        {"classes", required_argument, NULL, 'k'},
      {"in-channels", required_argument, NULL, 'i'},  {"image-size", required_argument, NULL, 's'},
      {"stem", required_argument, NULL, 't'},         {"width-divisor", required_argument, NULL, 'w'},
      {"zero-init-residual", no_argument, NULL, 'z'}, {"seed", required_argument, NULL, 'S'},
      {"steps", required_argument, NULL, 'n'},        {"save-weights", required_argument, NULL, 'o'},
      {"load-weights", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  memset(o, 0, sizeof *o);
  gw_model_config_default(&o->model);
  o->model_name = "resnet50";
  o->steps = -1;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    int r = parse_model_option(o, c, optarg);
    if (r < 0) return 2;
    if (r == 0) continue;
    switch (c) {
    case 'n':
      if (parse_long("--steps", optarg, 0, LONG_MAX, &o->steps) != 0) return 2;
      break;
    case 'o': o->save_weights = optarg; break;
    case 'l': o->load_weights = optarg; break;
    case 'h': usage(stdout); return 1;
    default:
      fprintf(stderr, "gw-train: unknown option or missing value: '%s' (see --help)\n", argv[optind - 1]);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gw-train: unexpected argument '%s' (see --help)\n", argv[optind]);
    return 2;
  }
  if (o->steps < 0) {
    fprintf(stderr, "gw-train: say how many training steps with --steps N (0: build, load and save only)\n");
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  struct opts o;
  int p = parse(argc, argv, &o);
  if (p) return p == 1 ? 0 : 2;
  if (o.steps > 0) {
    fprintf(stderr, "gw-train: the training loop is not part of this build yet; use --steps 0\n");
    return 2;
  }
  struct gw_model *m = NULL;
  if (gw_model_init(&m, &o.model) != GW_SUCCESS) {
    fprintf(stderr, "gw-train: %s\n", gw_model_last_error());
    return 1;
  }
  int rc = 0;
  if (o.load_weights && gw_model_load_weights(m, o.load_weights) != GW_SUCCESS) {
    fprintf(stderr, "gw-train: --load-weights: %s\n", gw_model_last_error());
    rc = 1;
  } else if (o.save_weights && gw_model_save_weights(m, o.save_weights) != GW_SUCCESS) {
    fprintf(stderr, "gw-train: --save-weights: %s\n", gw_model_last_error());
    rc = 1;
  } else {
    printf("gw-train: %s, %d classes, %d input channels, %dx%d, %s stem%s: %zu parameters in %d tensors%s%s%s%s\n",
           o.model_name, o.model.classes, o.model.in_channels, o.model.image_size, o.model.image_size,
           o.model.stem == GW_STEM_SMALL ? "small" : "imagenet", o.model.width_divisor > 1 ? " (narrowed)" : "",
           gw_model_num_params(m), gw_model_num_param_tensors(m), o.load_weights ? ", loaded " : "",
           o.load_weights ? o.load_weights : "", o.save_weights ? ", saved " : "",
           o.save_weights ? o.save_weights : "");
  }
  gw_model_free(m);
  return rc;
}
