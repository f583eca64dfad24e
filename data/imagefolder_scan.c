/* imagefolder_scan.c - finds the samples of an ImageNet-style tree the way
 * torchvision's ImageFolder does: classes are the sorted subdirectories, and each
 * class's files are every *.jpg / *.jpeg (any case) below its directory, following
 * links, ordered by (directory, file name) as sorted(os.walk(...)) gives them.
 *
 * Unlike torchvision, the class list of both splits comes from DIR/train, so a
 * validation tree missing a class cannot shift every later label; a validation
 * class unknown to train is refused.  A link back to a directory the walk is
 * already in (os.walk would recurse until its depth gave out, listing files
 * again under longer names or, from a link to the split, under the wrong
 * class) is left out, and so is a directory below a class that cannot be read
 * (as os.walk ignores it); both are counted in the dataset's description, and
 * so is a *.jpg file that cannot be looked at (a link to nothing, say).  A
 * directory that fails part way through listing is an error: its class would
 * silently come up short.  Decoding is imagefolder.c's. */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "imagefolder.h"

#define MAX_DEPTH 32 /* levels below a class directory */
/* Directories one class's walk may enter through a symbolic link (os.walk's
 * count: one reached by two links is entered twice).  Links that branch
 * without a loop (each level's two links to the next) multiply the visits by
 * 2 per level: the scan never ended, and its file list filled memory.  Plain
 * subdirectories are not counted (a class of 200000 sample folders is
 * fine). */
#define MAX_CLASS_DIRS 100000
#define PATH_BUF 4096

/* A path split where its last component starts: s + name is the name, and the
 * directory is the first name - 1 characters (none when name is 0). */
struct entry {
  char *s;
  int name;
};

/* A growable list of entries. */
struct names {
  struct entry *e;
  size_t n, cap;
};

static void names_free(struct names *l) {
  for (size_t i = 0; i < l->n; i++) free(l->e[i].s);
  free(l->e);
  memset(l, 0, sizeof *l);
}

static int names_push(struct names *l, const char *dir, const char *name) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    struct entry *e = realloc(l->e, cap * sizeof *e);
    if (!e) return -1;
    l->e = e;
    l->cap = cap;
  }
  size_t dl = dir ? strlen(dir) + 1 : 0, nl = strlen(name);
  char *p = malloc(dl + nl + 1);
  if (!p) return -1;
  if (dir) {
    memcpy(p, dir, dl - 1);
    p[dl - 1] = '/';
  }
  memcpy(p + dl, name, nl + 1);
  l->e[l->n].s = p;
  l->e[l->n++].name = (int)dl;
  return 0;
}

/* dir/name into out [PATH_BUF]; -1 (with the message) when it does not fit. */
static int join(char *out, const char *dir, const char *name) {
  int n = snprintf(out, PATH_BUF, "%s/%s", dir, name);
  if (n >= 0 && n < PATH_BUF) return 0;
  gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: the path %s/%s is longer than %d bytes", dir, name, PATH_BUF - 1);
  return -1;
}

/* The names the scan lists, as IMAGE_NAMES says them. */
#if GW_HAVE_PNG
#define IMAGE_NAMES ".jpg, .jpeg or .png"
#else
#define IMAGE_NAMES ".jpg or .jpeg"
#endif
static int ends_with(const char *name, const char *ext) {
  const size_t n = strlen(name), k = strlen(ext);
  return n > k && !strcasecmp(name + n - k, ext);
}

static int is_image_name(const char *name) {
  return ends_with(name, ".jpg") || ends_with(name, ".jpeg") || (GW_HAVE_PNG && ends_with(name, ".png"));
}

/* An image file torchvision's ImageFolder would read and this one does not
 * decode (JPEG and PNG only): counted and said, not left out silently. */
static int is_other_image_name(const char *name) {
  static const char *const ext[] = {".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  for (size_t i = GW_HAVE_PNG ? 1 : 0; i < sizeof ext / sizeof ext[0]; i++)
    if (ends_with(name, ext[i])) return 1;
  return 0;
}

static void other_image(struct gw__folder *f, const char *dir, const char *name) {
  if (!f->scan_other_images++)
    snprintf(f->scan_other_note, sizeof f->scan_other_note, "%.200s/%.30s", dir, name);
}

/* Notes a directory the walk leaves out (the first one's path and why). */
static void skip_dir(struct gw__folder *f, const char *path, const char *why) {
  if (!f->scan_skipped++) snprintf(f->scan_note, sizeof f->scan_note, "%.200s: %s", path, why);
}

/* Notes a *.jpg / *.jpeg file the walk leaves out (the first one's path and
 * why: entry_kind's kind: stat's errno, a file that is no regular one, where
 * reading it would block or never end (a FIFO, a device), a path too long). */
static void skip_file(struct gw__folder *f, const char *dir, const char *name, int kind) {
  const char *why = kind == -1 ? "not a regular file" : kind == -3 ? "its path is too long"
                    : errno == ENOENT ? "a link to nothing" : strerror(errno);
  if (!f->scan_files_skipped++)
    snprintf(f->scan_file_note, sizeof f->scan_file_note, "%.100s/%.60s: %s", dir, name, why);
}

/* 1 directory, 0 regular file, -1 other, -2 when stat failed (errno says
 * why), -3 a path too long; links are followed. */
static int entry_kind(const char *dir, const struct dirent *e) {
  if (e->d_type == DT_DIR) return 1;
  if (e->d_type == DT_REG) return 0;
  char path[PATH_BUF];
  struct stat st;
  if (join(path, dir, e->d_name)) return -3;
  if (stat(path, &st) != 0) return -2;
  return S_ISDIR(st.st_mode) ? 1 : S_ISREG(st.st_mode) ? 0 : -1;
}

/* The code point at s[0..n) as Python decodes a file name (UTF-8 with
 * surrogateescape): a well-formed sequence (Unicode's table 3-7: no
 * overlong form, surrogate or value past U+10FFFF) is its value, any other
 * byte b alone is U+DC00 + b.  *len: the bytes taken. */
static uint32_t py_code_point(const unsigned char *s, size_t n, size_t *len) {
  const unsigned c = s[0];
  *len = 1;
  if (c < 0x80) return c;
  int k = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (!k || (size_t)k > n) return 0xdc00 + c;
  const unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
  if (s[1] < lo || s[1] > hi) return 0xdc00 + c;
  uint32_t v = c & (0x7f >> k);
  for (int i = 1; i < k; i++) {
    if (i > 1 && (s[i] & 0xc0) != 0x80) return 0xdc00 + c;
    v = v << 6 | (s[i] & 0x3f);
  }
  *len = (size_t)k;
  return v;
}

/* Python's order of two names (str comparison: by code point, as decoded
 * above; a prefix first).  For well-formed UTF-8 it is the bytes' order; a
 * name with other bytes (Latin-1 from an old archive) sorts where Python
 * puts it, so labels are torchvision's (bytes put b"\x80a" before "\xe9",
 * Python after it). */
static int cmp_py(const char *a, size_t na, const char *b, size_t nb) {
  const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
  while (na && nb) {
    if (*x == *y && *x < 0x80) {
      x++, y++, na--, nb--;
      continue;
    }
    size_t lx, ly;
    const uint32_t cx = py_code_point(x, na, &lx), cy = py_code_point(y, nb, &ly);
    if (cx != cy) return cx < cy ? -1 : 1;
    x += lx, y += ly, na -= lx, nb -= ly;
  }
  return na ? 1 : nb ? -1 : 0;
}

/* Whether entry e of dir is a symbolic link (d_type, or lstat where the
 * file system leaves it unknown). */
static bool is_link(const char *dir, const struct dirent *e) {
  if (e->d_type != DT_UNKNOWN) return e->d_type == DT_LNK;
  char path[PATH_BUF];
  struct stat st;
  return !join(path, dir, e->d_name) && lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

/* sorted(os.walk()) order: by directory, then by name within it (for the plain
 * names of list_subdirs, simply by name), each as Python compares str. */
static int cmp_entry(const void *a, const void *b) {
  const struct entry *x = a, *y = b;
  size_t dx = x->name ? (size_t)x->name - 1 : 0, dy = y->name ? (size_t)y->name - 1 : 0;
  int m = cmp_py(x->s, dx, y->s, dy);
  if (m) return m;
  return cmp_py(x->s + x->name, strlen(x->s + x->name), y->s + y->name, strlen(y->s + y->name));
}

/* The next entry of d other than . and ..; NULL at the end, or on a failed
 * read (then *res says so: the listing would come up short). */
static struct dirent *next_entry(DIR *d, const char *dir, gw_result_t *res) {
  for (;;) {
    errno = 0;
    struct dirent *e = readdir(d);
    if (!e && errno)
      *res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: reading %s failed: %s", dir, strerror(errno));
    if (!e || (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))) return e;
  }
}

/* The sorted subdirectory names of dir (the classes, or a split's).  A
 * listing that fails part way, or an entry that cannot be looked at, is an
 * error: a class left out shifts the label of every class after it.  A link to
 * nothing is left out (as torchvision does), noted in the description. */
static gw_result_t list_subdirs(struct gw__folder *f, const char *dir, struct names *out) {
  DIR *d = opendir(dir);
  if (!d) return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: cannot open %s: %s", dir, strerror(errno));
  gw_result_t res = GW_SUCCESS;
  for (struct dirent *e; (e = next_entry(d, dir, &res));) {
    const int kind = entry_kind(dir, e);
    if (kind == -2) {
      char path[PATH_BUF];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      if (errno == ENOENT) {
        skip_dir(f, path, "a link to nothing");
        continue;
      }
      res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: cannot look at %s: %s", path, strerror(errno));
      break;
    }
    if (kind == -3) { /* (join said it) a class left out would shift every later class's label */
      res = GW_ERR_INVALID_ARGUMENT;
      break;
    }
    if (kind != 1) continue;
    if (names_push(out, NULL, e->d_name)) {
      res = gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory listing %s", dir);
      break;
    }
  }
  closedir(d);
  if (res != GW_SUCCESS) return res;
  if (out->n) qsort(out->e, out->n, sizeof *out->e, cmp_entry);
  return GW_SUCCESS;
}

/* The directories from the split directory down to the one being listed. */
struct ancestry {
  dev_t dev[MAX_DEPTH + 2];
  ino_t ino[MAX_DEPTH + 2];
  int n;
  int64_t visits; /* directories walked under this class so far */
};

/* Appends every JPEG below dir (recursively, dir at `depth` below the class
 * directory) to files. */
static gw_result_t walk(struct gw__folder *f, const char *dir, int depth, bool via_link, struct ancestry *up,
                        struct names *files) {
  DIR *d = opendir(dir);
  struct stat st;
  if (!d || fstat(dirfd(d), &st) != 0) {
    if (depth == 0) {
      gw_result_t res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: cannot open %s: %s", dir, strerror(errno));
      if (d) closedir(d);
      return res;
    }
    skip_dir(f, dir, strerror(errno));
    if (d) closedir(d);
    return GW_SUCCESS;
  }
  for (int k = 0; k < up->n; k++)
    if (up->dev[k] == st.st_dev && up->ino[k] == st.st_ino) {
      skip_dir(f, dir, "a link back to a directory above it");
      closedir(d);
      return GW_SUCCESS;
    }
  if (via_link && ++up->visits > MAX_CLASS_DIRS) {
    closedir(d);
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: more than %d directories entered through symbolic links "
                          "below one class, the last %s (links that reach the same directories again and again?)",
                          MAX_CLASS_DIRS, dir);
  }
  up->dev[up->n] = st.st_dev, up->ino[up->n] = st.st_ino;
  up->n++;
  gw_result_t res = GW_SUCCESS;
  for (struct dirent *e; (e = next_entry(d, dir, &res));) {
    int kind = entry_kind(dir, e);
    char sub[PATH_BUF];
    if (kind == 1 && join(sub, dir, e->d_name)) {
      res = GW_ERR_INVALID_ARGUMENT;
    } else if (kind == 1 && depth + 1 > MAX_DEPTH) {
      skip_dir(f, sub, "more than 32 levels below its class");
    } else if (kind == 1) {
      res = walk(f, sub, depth + 1, is_link(dir, e), up, files);
    } else if (kind == 0 && is_image_name(e->d_name) && names_push(files, dir, e->d_name)) {
      res = gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory listing %s", dir);
    } else if (kind < 0 && is_image_name(e->d_name)) {
      skip_file(f, dir, e->d_name, kind);
    } else if (kind == 0 && is_other_image_name(e->d_name)) {
      other_image(f, dir, e->d_name);
    }
    if (res != GW_SUCCESS) break;
  }
  up->n--;
  closedir(d);
  return res;
}

/* Appends the files of one class, in order, to the dataset's path table
 * (split: the split directory's identity, the bottom of the ancestry). */
static gw_result_t add_class(struct gw__folder *f, const struct stat *split, const char *class_dir, int32_t label) {
  struct names files = {0};
  struct ancestry up = {.dev = {split->st_dev}, .ino = {split->st_ino}, .n = 1};
  gw_result_t res = walk(f, class_dir, 0, false, &up, &files);
  if (res == GW_SUCCESS && files.n) qsort(files.e, files.n, sizeof *files.e, cmp_entry);
  for (size_t i = 0; i < files.n && res == GW_SUCCESS; i++) res = gw__folder_add(f, files.e[i].s, label);
  names_free(&files);
  return res;
}

static gw_result_t set_class_names(struct gw__folder *f, const struct names *classes) {
  const char **names = malloc(classes->n * sizeof *names);
  if (!names) return gw__model_fail(GW_ERR_SYSTEM, "imagenet: out of memory");
  for (size_t i = 0; i < classes->n; i++) names[i] = classes->e[i].s;
  gw_result_t res = gw__dataset_set_classes(&f->base, names, (int)classes->n);
  free(names);
  return res;
}

/* Index of name in the sorted class list, or -1. */
static int find_class(const struct names *classes, const char *name) {
  struct entry key = {(char *)name, 0};
  const struct entry *hit = bsearch(&key, classes->e, classes->n, sizeof *classes->e, cmp_entry);
  return hit ? (int)(hit - classes->e) : -1;
}

/* The files of every class directory of split_dir.  The training split's
 * class directories are the classes, already listed (listing them again
 * would note each link to nothing twice). */
static gw_result_t scan_split(struct gw__folder *f, const char *split_dir, const struct names *classes, int is_train) {
  struct names listed = {0};
  const struct names *subdirs = is_train ? classes : &listed;
  struct stat split;
  if (stat(split_dir, &split) != 0)
    return gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: cannot open %s: %s", split_dir, strerror(errno));
  gw_result_t res = is_train ? GW_SUCCESS : list_subdirs(f, split_dir, &listed);
  for (size_t i = 0; res == GW_SUCCESS && i < subdirs->n; i++) {
    int label = find_class(classes, subdirs->e[i].s);
    char class_dir[PATH_BUF];
    if (join(class_dir, split_dir, subdirs->e[i].s))
      res = GW_ERR_INVALID_ARGUMENT;
    else if (label < 0)
      res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: %s is not a class of the training split", class_dir);
    else {
      const int64_t before = f->base.size, others = f->scan_other_images;
      res = add_class(f, &split, class_dir, label);
      /* An empty training class (.ipynb_checkpoints, lost+found) is still a
       * class: it shifted every later label and gave the model an output too
       * many; an empty evaluation class left the class out of the scores
       * unsaid (torchvision's ImageFolder refuses both). */
      char also[120] = "";
      if (f->scan_other_images > others)
        snprintf(also, sizeof also, " (it holds %lld image file%s of other formats; only " IMAGE_NAMES
                 " files are decoded)", (long long)(f->scan_other_images - others),
                 f->scan_other_images - others > 1 ? "s" : "");
      if (res == GW_SUCCESS && f->base.size == before)
        res = is_train ? gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: class directory %s holds no " IMAGE_NAMES
                                        " files%s: remove it (as a class it would shift every later class's label)",
                                        class_dir, also)
                       : gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: class directory %s holds no " IMAGE_NAMES
                                        " files%s: remove it (the evaluation would leave its class out unsaid)",
                                        class_dir, also);
    }
  }
  names_free(&listed);
  return res;
}

/* How many image files lie in dir itself, in no class folder (the message
 * for a split found empty). */
static size_t loose_images(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.' && e->d_type != DT_DIR && is_image_name(e->d_name);
  closedir(d);
  return n;
}

gw_result_t gw__folder_scan(struct gw__folder *f, const char *dir, enum gw_split split) {
  char train_dir[PATH_BUF], split_dir[PATH_BUF];
  if (join(train_dir, dir, "train") || join(split_dir, dir, split == GW_SPLIT_TRAIN ? "train" : "val"))
    return GW_ERR_INVALID_ARGUMENT;
  struct names classes = {0};
  gw_result_t res = list_subdirs(f, train_dir, &classes);
  if (res == GW_SUCCESS && classes.n == 0)
    res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: %s has no class directories", train_dir);
  if (res == GW_SUCCESS && classes.n > INT32_MAX / 2)
    res = gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: %s has too many classes", train_dir);
  if (res == GW_SUCCESS) {
    f->base.classes = (int)classes.n;
    res = set_class_names(f, &classes);
  }
  if (res == GW_SUCCESS) res = scan_split(f, split_dir, &classes, split == GW_SPLIT_TRAIN);
  if (res == GW_SUCCESS && f->base.size == 0) {
    const size_t loose = loose_images(split_dir);
    res = loose ? gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: %s has no images in class directories: its %zu "
                                 IMAGE_NAMES " file%s in it directly (ImageNet's original validation layout: sort "
                                 "them into one folder per class, as train/ has them, as torchvision's ImageFolder "
                                 "needs too)",
                                 split_dir, loose, loose > 1 ? "s lie" : " lies")
                : gw__model_fail(GW_ERR_INVALID_ARGUMENT, "imagenet: no " IMAGE_NAMES " files under %s", split_dir);
  }
  names_free(&classes);
  return res;
}
