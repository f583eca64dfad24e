/* test_data_hostile.c - the data side against files made to hurt it:
 * - Fashion-MNIST: a header claiming ten million items in a file of three (the
 *   buffer grows as data arrives: no 7.8 GB allocation first), data after the
 *   last item (two files joined);
 * - image folders: link cycles (a link to its own directory, one from below a
 *   class back to the split), a "16384 x 16384" JPEG of a few hundred bytes, a
 *   file damaged early and cut short (the first warning hid the truncation), a
 *   stream of tables only (read without a size: the decoder was then asked for
 *   the stream's own size into no buffer; test/fuzz/fuzz_jpeg.c found it), a
 *   header with an extraneous byte (read, as PIL does), and one that then
 *   fails for good (TurboJPEG calls that a warning: skipped), a FIFO where a listed
 *   file was (skipped, not a hung thread), a damaged file whose path alone
 *   passes 512 bytes (named whole, with its reason); trees without classes,
 *   with an empty class in either split, with images of formats not decoded
 *   (counted and said), with links to nothing and to themselves. */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "dataset.h"
#include "loader.h"
#include "sampler.h"
#include "test_data.h"

/* A gzip file of stored (uncompressed) deflate blocks whose trailer starts at
 * file offset trailer_at (a file name in the header pads it there), its CRC-32
 * flipped when bad. */
static void write_stored_gz(const char *path, const unsigned char *data, size_t len, size_t trailer_at, int bad) {
  const size_t nblocks = len / 65535 + 1, head = trailer_at - len - 5 * nblocks;
  ck_assert_msg(trailer_at > len + 5 * nblocks + 11, "no room for the header");
  unsigned char *f = calloc(1, trailer_at + 8), *p = f;
  *p++ = 0x1f, *p++ = 0x8b, *p++ = 8, *p++ = 0x08; /* deflate, FNAME */
  p += 5, *p++ = 3;                                  /* mtime, xfl 0; OS unix */
  memset(p, 'a', head - 11), p += head - 11, *p++ = 0;
  for (size_t b = 0, off = 0; b < nblocks; b++) {
    const size_t n = b + 1 < nblocks ? 65535 : len - off;
    *p++ = b + 1 == nblocks; /* BFINAL, BTYPE 00 (stored), padding */
    *p++ = (unsigned char)n, *p++ = (unsigned char)(n >> 8), *p++ = (unsigned char)~n, *p++ = (unsigned char)(~n >> 8);
    memcpy(p, data + off, n), p += n, off += n;
  }
  ck_assert_uint_eq((size_t)(p - f), trailer_at);
  uLong crc = crc32(0L, data, (uInt)len) ^ (bad ? 0x5au : 0);
  for (int k = 0; k < 4; k++) *p++ = (unsigned char)(crc >> 8 * k);
  for (int k = 0; k < 4; k++) *p++ = (unsigned char)(len >> 8 * k);
  write_file(path, f, trailer_at + 8);
  free(f);
}

START_TEST(fmnist_lying_and_joined) {
  make_tmpdir();
  struct idx_spec s = good_idx();
  s.images = 10000000; /* the images file claims ten million; three follow */
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "truncated");
  s = good_idx();
  s.image_bytes += 784; /* a fourth image after the three announced */
  write_idx(&s);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "data follows its 3 items");
  s = good_idx();
  write_idx(&s);
  struct gw_dataset *ds = NULL;
  ck_assert_msg(gw_dataset_fashion_mnist(&ds, tmpdir, GW_SPLIT_TRAIN, 0) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_uint_ne(gw_dataset_fingerprint(ds), 0);
  gw_dataset_free(ds);
  /* The gzip trailer's CRC-32 damaged where zlib sees it only when asked past
   * the last item: the read of the items ends exactly where the reader's input
   * buffer (128 KiB, gzbuffer) does, and the trailer comes with the next fill.
   * That error was taken for the end of the file. */
  s.images = s.labels = 800, s.image_bytes = 800 * 784, s.label_bytes = 800;
  write_idx(&s);
  size_t len = 16 + s.image_bytes;
  unsigned char *raw = calloc(1, len);
  put_be32(raw, 0x803), put_be32(raw + 4, 800), put_be32(raw + 8, 28), put_be32(raw + 12, 28);
  write_stored_gz(in_tmp("train-images-idx3-ubyte.gz"), raw, len, 5 << 17, 0);
  ck_assert_msg(open_tmp_fmnist() == GW_SUCCESS, "%s", gw_data_last_error()); /* the file itself is right */
  write_stored_gz(in_tmp("train-images-idx3-ubyte.gz"), raw, len, 5 << 17, 1);
  /* the checksum covers every byte: the damage is not said to lie after the
   * items (it did: "damaged after its 800 items"), nor after where zlib's
   * read-ahead stopped */
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz",
               "corrupt: its gzip checksum does not match the data (zlib: incorrect data check): the file is damaged "
               "somewhere in it");
  /* the trailer cut off: nothing checks the items (a flipped pixel loaded
   * silently), and zlib says only that the input ended */
  write_stored_gz(in_tmp("train-images-idx3-ubyte.gz"), raw, len, 5 << 17, 0);
  ck_assert_int_eq(truncate(in_tmp("train-images-idx3-ubyte.gz"), 5 << 17), 0);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz",
               "truncated: the gzip stream ends after its 800 items without its trailer");
  /* the trailer in the fill that ends the items: zlib fails the items' read,
   * which is damage ("truncated or corrupt ... the file ends after ..." said
   * neither which, and a whole file was no truncated one) */
  write_stored_gz(in_tmp("train-images-idx3-ubyte.gz"), raw, len, len + 4096, 1);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz",
               "corrupt: its gzip checksum does not match the data (zlib: incorrect data check)");
  free(raw);
  remove_tmpdir();
}
END_TEST

static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *len = (size_t)ftell(f);
  rewind(f);
  unsigned char *b = malloc(*len + 1);
  ck_assert_uint_eq(fread(b, 1, *len, f), *len);
  fclose(f);
  return b;
}

/* Offset of the first FF m marker byte pair in b, past `from`. */
static size_t find_marker(const unsigned char *b, size_t n, size_t from, unsigned char m) {
  for (size_t i = from; i + 1 < n; i++)
    if (b[i] == 0xff && b[i + 1] == m) return i;
  ck_abort_msg("no marker FF %02X", m);
  return 0;
}

START_TEST(folder_hostile_files) {
  make_tree();
  size_t n;
  /* ant/bomb.jpg: ant/e.jpg (32 x 32) whose frame header says 16384 x 16384 */
  unsigned char *b = slurp(in_tmp("train/ant/e.jpg"), &n);
  size_t sof = find_marker(b, n, 2, 0xc0);
  b[sof + 5] = 0x40, b[sof + 6] = 0x00, b[sof + 7] = 0x40, b[sof + 8] = 0x00;
  write_file(in_tmp("train/ant/bomb.jpg"), b, n);
  /* ant/bomb2.jpg: 11000 x 16384 (above PIL's limit) with 100 kB of comments,
   * enough bytes for the pixels-per-byte rule */
  b[sof + 5] = 0x40, b[sof + 6] = 0x00, b[sof + 7] = 0x2a, b[sof + 8] = 0xf8;
  {
    const size_t pad = 2 * (4 + 50000);
    unsigned char *p = calloc(1, n + pad), *q = p;
    memcpy(q, b, 2), q += 2; /* SOI */
    for (int k = 0; k < 2; k++) {
      *q++ = 0xff, *q++ = 0xfe, *q++ = (unsigned char)((50002 >> 8) & 0xff), *q++ = (unsigned char)(50002 & 0xff);
      memset(q, 'c', 50000), q += 50000;
    }
    memcpy(q, b + 2, n - 2);
    write_file(in_tmp("train/ant/bomb2.jpg"), p, n + pad);
    free(p);
  }
  /* ant/tables.jpg: its tables, then the end: a header without a size (the fuzzer's find) */
  b[sof] = 0xff, b[sof + 1] = 0xd9;
  write_file(in_tmp("train/ant/tables.jpg"), b, sof + 2);
  free(b);
  /* cat/a0.jpg: cat/a.jpg with a stray byte before its quantization tables */
  b = slurp(in_tmp("train/cat/a.jpg"), &n);
  size_t dqt = find_marker(b, n, 2, 0xdb);
  unsigned char *c = malloc(n + 1);
  memcpy(c, b, dqt), c[dqt] = 0, memcpy(c + dqt + 1, b + dqt, n - dqt);
  write_file(in_tmp("train/cat/a0.jpg"), c, n + 1);
  /* cat/a3.jpg: a0.jpg whose scan asks for a Huffman table never defined: a
   * fatal error after the warning, which TurboJPEG 2.1 reports as a warning
   * (and nothing of the image was written) */
  size_t scan = find_marker(c, n + 1, 2, 0xda);
  c[scan + 6] = 0x33;
  write_file(in_tmp("train/cat/a3.jpg"), c, n + 1);
  free(c), free(b);
  /* dog/dt.jpg: dog/d.jpeg damaged inside its data, then cut at 60% */
  b = slurp(in_tmp("train/dog/d.jpeg"), &n);
  size_t sos = find_marker(b, n, 2, 0xda), mid = sos + (n - sos) / 3;
  for (size_t i = 0; i < 32; i++) b[mid + i] = (unsigned char)(0x11 * (i % 7) + 1);
  write_file(in_tmp("train/dog/dt.jpg"), b, n * 6 / 10);
  /* dog/dh.jpg: cut before its scan's header; dog/gif.jpg: a GIF's bytes
   * (each was "not a JPEG or PNG") */
  write_file(in_tmp("train/dog/dh.jpg"), b, sos);
  write_file(in_tmp("train/dog/gif.jpg"), "GIF89a\x01\x00\x01\x00\x00\x00\x00;", 14);
  free(b);
  /* link cycles: to the class itself, and from below the class to the split */
  char target[600];
  ck_assert_int_eq(symlink(".", in_tmp("train/cat/loop")), 0);
  snprintf(target, sizeof target, "%s/train", tmpdir);
  ck_assert_int_eq(symlink(target, in_tmp("train/cat/sub/up")), 0);

  struct gw_dataset *ds;
  char spec[128];
  snprintf(spec, sizeof spec, "imagenet:%s", tmpdir);
  ck_assert_msg(gw_dataset_open(&ds, spec, GW_SPLIT_TRAIN, NULL) == GW_SUCCESS, "%s", gw_data_last_error());
  /* ant/bomb ant/bomb2 ant/e ant/tables | cat/a cat/a0 cat/a3 cat/b.JPEG cat/sub/c | dog/bad dog/d dog/dh dog/dt
   * dog/gif dog/text */
  ck_assert_int_eq(gw_dataset_size(ds), 15); /* nothing twice */
  ck_assert_msg(strstr(gw_dataset_description(ds), "2 directories left out") &&
                    strstr(gw_dataset_description(ds), "a link back to a directory above it"),
                "%s", gw_dataset_description(ds));
  /* a FIFO where cat/b.JPEG was listed */
  ck_assert_int_eq(unlink(in_tmp("train/cat/b.JPEG")), 0);
  ck_assert_int_eq(mkfifo(in_tmp("train/cat/b.JPEG"), 0600), 0);
  const char *skip[15] = {"16384x16384 pixels from", "11000x16384 pixels from", NULL, "tables.jpg: holds no image",
                          NULL, NULL,
                          "a3.jpg: cannot decode: Huffman table 0x03 was not defined", "not a regular file", NULL,
                          "bad.jpg", NULL, "dh.jpg: a damaged or cut-short JPEG: ", "dt.jpg: ends early",
                          GW_HAVE_PNG ? "gif.jpg: a GIF image (JPEG and PNG are read)" : "gif.jpg: a GIF image",
                          GW_HAVE_PNG ? "text.jpg: not a JPEG or PNG" : "text.jpg: not a JPEG"};
  float *out = malloc(3 * 224 * 224 * sizeof *out);
  for (int i = 0; i < 15; i++) {
    int32_t y;
    gw_result_t r = gw_dataset_get(ds, i, 0, 1, out, &y);
    if (skip[i])
      ck_assert_msg(r == GW_DATA_SKIPPED && strstr(gw_data_last_error(), skip[i]), "sample %d: %d %s", i, (int)r,
                    gw_data_last_error());
    else
      ck_assert_msg(r == GW_SUCCESS, "sample %d: %s", i, gw_data_last_error());
  }
  free(out);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* Links that branch without a loop: d0..d19 under a class, each holding two
 * links a and b to the next (2^19 visits of d19 as os.walk counts them):
 * refused at the bound naming the class (the scan never ended, its list of
 * d19's file filling memory). */
START_TEST(folder_link_fan_out_bounded) {
  make_tmpdir();
  mkdirs("train/ok");
  write_jpeg("train/ok/x.jpg", 8, 8, 0, NULL, 1.0);
  char rel[64], link[96];
  for (int i = 0; i < 20; i++) {
    snprintf(rel, sizeof rel, "train/fan/d%d", i);
    mkdirs(rel);
    if (i == 0) continue;
    snprintf(link, sizeof link, "../d%d", i);
    snprintf(rel, sizeof rel, "train/fan/d%d/a", i - 1);
    ck_assert_int_eq(symlink(link, in_tmp(rel)), 0);
    snprintf(rel, sizeof rel, "train/fan/d%d/b", i - 1);
    ck_assert_int_eq(symlink(link, in_tmp(rel)), 0);
  }
  write_jpeg("train/fan/d19/x.jpg", 8, 8, 0, NULL, 1.0);
  alarm(60);
  struct gw_dataset *ds;
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 8), "train/fan/d", "more than 100000 directories entered through symbolic links");
  alarm(0);
  remove_tmpdir();
}
END_TEST

/* A sample another process holds a write lease on (Samba's oplocks, an NFS
 * server's delegation) is read once the holder gives way: the non-blocking
 * open's EWOULDBLOCK was taken for the file's fault and the sample replaced
 * (differently from run to run). */
START_TEST(folder_leased_file_waited_for) {
  make_tmpdir();
  mkdirs("train/cat");
  write_jpeg("train/cat/x.jpg", 8, 8, 0, NULL, 1.0);
  struct gw_dataset *ds;
  ck_assert_msg(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 8) == GW_SUCCESS, "%s", gw_data_last_error());
  int ready[2];
  ck_assert_int_eq(pipe(ready), 0);
  const pid_t holder = fork();
  if (holder == 0) { /* holds a write lease for half a second, then lets go */
    signal(SIGIO, SIG_IGN); /* the lease break's notice */
    const int fd = open(in_tmp("train/cat/x.jpg"), O_RDWR);
    const char ok = fd >= 0 && fcntl(fd, F_SETLEASE, F_WRLCK) == 0 ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    usleep(500000);
    fcntl(fd, F_SETLEASE, F_UNLCK);
    _exit(0);
  }
  char ok = 0;
  ck_assert_int_eq(read(ready[0], &ok, 1), 1);
  float out[3 * 8 * 8];
  int32_t y;
  gw_result_t r = GW_SUCCESS;
  if (ok == 'y') r = gw_dataset_get(ds, 0, 1, 1, out, &y);
  int status;
  waitpid(holder, &status, 0);
  close(ready[0]), close(ready[1]);
  gw_dataset_free(ds);
  remove_tmpdir();
  if (ok != 'y') {
    fprintf(stderr, "folder_leased_file_waited_for: no file leases here (F_SETLEASE): not run\n");
    return;
  }
  ck_assert_msg(r == GW_SUCCESS, "a leased sample was not read: %s", gw_data_last_error());
}
END_TEST

/* A damaged file deep enough that its path alone passes 512 bytes (where the
 * message was cut, reason and file name lost): named whole, with the reason. */
START_TEST(folder_long_path_named) {
  make_tmpdir();
  char dir[1200], seg[201], file[1300];
  memset(seg, 'd', 200), seg[200] = 0;
  snprintf(dir, sizeof dir, "%s/train/cls", tmpdir);
  mkdirs("train/cls");
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(dir);
    snprintf(dir + n, sizeof dir - n, "/%s", seg);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
  }
  snprintf(file, sizeof file, "%s/the-last-part.jpg", dir);
  write_file(file, "hello, not an image\n", 20);
  struct gw_dataset *ds;
  char spec[128];
  snprintf(spec, sizeof spec, "imagenet:%s", tmpdir);
  ck_assert_msg(gw_dataset_open(&ds, spec, GW_SPLIT_TRAIN, NULL) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_dataset_size(ds), 1);
  float *out = malloc(3 * 224 * 224 * sizeof *out);
  int32_t y;
  ck_assert_int_eq(gw_dataset_get(ds, 0, 0, 1, out, &y), GW_DATA_SKIPPED);
  const char *msg = gw_data_last_error(), *at = strstr(msg, file);
  ck_assert_msg(strlen(file) > 600 && at && strlen(at + strlen(file)) > 8, "the path or the reason is cut: %s", msg);
  free(out);
  gw_dataset_free(ds);
  remove_tmpdir();
}
END_TEST

/* Image 2 of the train split in tmpdir, as get() gives it. */
static void third_image(float *out) {
  struct gw_dataset *ds = NULL;
  int32_t y;
  ck_assert_msg(gw_dataset_fashion_mnist(&ds, tmpdir, GW_SPLIT_TRAIN, 0) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_dataset_get(ds, 2, 0, 0, out, &y), GW_SUCCESS);
  gw_dataset_free(ds);
}

/* The gzip stream read member by member: a file of two members is one
 * stream (gzip's rule), a file without gzip's header is read as it is, and
 * bytes after the last member that are no member are damage (zlib's gzread
 * dropped them: junk appended passed). */
START_TEST(fmnist_gzip_members_and_junk) {
  make_tmpdir();
  struct idx_spec s = good_idx();
  write_idx(&s);
  const size_t len = 16 + s.image_bytes;
  unsigned char *raw = calloc(1, len);
  put_be32(raw, 0x803), put_be32(raw + 4, 3), put_be32(raw + 8, 28), put_be32(raw + 12, 28);
  for (size_t i = 16; i < len; i++) raw[i] = (unsigned char)(i * 7 + i / 784);
  const char *images = in_tmp("train-images-idx3-ubyte.gz");
  write_gz(images, raw, len);
  float want[784], got[784];
  third_image(want);
  ck_assert_float_ne(want[100], want[101]); /* (pixels that differ: a check that can fail) */
  /* two members, split inside the second image */
  size_t n1, n2;
  write_gz(images, raw, 1000);
  unsigned char *m1 = slurp(images, &n1);
  write_gz(images, raw + 1000, len - 1000);
  unsigned char *m2 = slurp(images, &n2), *both = malloc(n1 + n2 + 8);
  memcpy(both, m1, n1), memcpy(both + n1, m2, n2);
  write_file(images, both, n1 + n2);
  third_image(got);
  ck_assert_mem_eq(got, want, sizeof got);
  /* not gzip at all: the IDX bytes as they are */
  write_file(images, raw, len);
  third_image(got);
  ck_assert_mem_eq(got, want, sizeof got);
  /* junk after the stream, and a single byte of it (the magic needs two) */
  memcpy(both + n1 + n2, "junk\n", 5);
  write_file(images, both, n1 + n2 + 5);
  char words[160];
  snprintf(words, sizeof words, "damaged: 5 bytes after its gzip stream, from byte %zu, are no gzip data (its 3 items are "
           "whole and checked)", n1 + n2);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", words);
  both[n1 + n2] = 0;
  write_file(images, both, n1 + n2 + 1);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz", "damaged: 1 byte after its gzip stream");
  /* a member whose data ends before the items do, then junk: short, and said so */
  memcpy(both, m1, n1), memcpy(both + n1, "junk", 4);
  write_file(images, both, n1 + 4);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz",
               "truncated: the pixels needs 2352 bytes, its gzip stream ends after 984 (followed by 4 bytes that are no "
               "gzip data)");
  /* the items whole in their member, then a member cut after its magic bytes */
  write_gz(images, raw, len);
  size_t nw;
  unsigned char *whole = slurp(images, &nw), *cut = malloc(nw + 2);
  memcpy(cut, whole, nw), cut[nw] = 0x1f, cut[nw + 1] = 0x8b;
  write_file(images, cut, nw + 2);
  expect_error(open_tmp_fmnist(), "train-images-idx3-ubyte.gz",
               "truncated: a gzip member after its 3 items is cut short (the items' own members are whole and checked)");
  free(whole), free(cut);
  free(m1), free(m2), free(both), free(raw);
  remove_tmpdir();
}
END_TEST

/* The hash the ranks compare covers the pixels; the fingerprint (checkpoints
 * name it) the labels alone, as saved checkpoints had it.  Ranks whose
 * images differed under the same labels (another copy, a pre-processed one)
 * trained together without a word. */
START_TEST(fmnist_content_hash_covers_pixels) {
  make_tmpdir();
  struct idx_spec s = good_idx();
  write_idx(&s);
  uint64_t fp[2], content[2];
  for (int k = 0; k < 2; k++) {
    if (k) { /* one pixel of the last image other */
      unsigned char *buf = calloc(1, 16 + s.image_bytes);
      ck_assert_ptr_nonnull(buf);
      put_be32(buf, s.image_magic), put_be32(buf + 4, s.images), put_be32(buf + 8, s.rows), put_be32(buf + 12, s.cols);
      buf[16 + s.image_bytes - 1] = 7;
      write_gz(in_tmp("train-images-idx3-ubyte.gz"), buf, 16 + s.image_bytes);
      free(buf);
    }
    struct gw_dataset *ds = NULL;
    ck_assert_int_eq(gw_dataset_fashion_mnist(&ds, tmpdir, GW_SPLIT_TRAIN, 0), GW_SUCCESS);
    fp[k] = gw_dataset_fingerprint(ds), content[k] = gw_dataset_content_hash(ds);
    gw_dataset_free(ds);
  }
  ck_assert_msg(fp[0] == fp[1], "the fingerprint changed with a pixel: saved checkpoints would not resume");
  ck_assert_msg(content[0] != content[1] && content[0] != fp[0], "the compared hash does not cover the pixels");
}
END_TEST

void add_fmnist_hostile_tests(TCase *tc) {
  tcase_add_test(tc, fmnist_lying_and_joined);
  tcase_add_test(tc, fmnist_gzip_members_and_junk);
  tcase_add_test(tc, fmnist_content_hash_covers_pixels);
}
/* Trees a scan must refuse or note (moved from test_data.c): no classes, an
 * empty class in either split, files of formats not decoded, links to
 * nothing and to themselves. */
/* The training split of tmpdir scanned with one *.jpg left out and said
 * ("; 1 file left out (", then `said`), its one image and file list (the
 * fingerprint) as without that entry. */
static void expect_one_file_left_out(const char *said, uint64_t fingerprint) {
  struct gw_dataset *ds;
  ck_assert_msg(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_dataset_size(ds), 1);
  ck_assert_msg(strstr(gw_dataset_description(ds), "; 1 file left out (") && strstr(gw_dataset_description(ds), said),
                "%s", gw_dataset_description(ds));
  ck_assert_uint_eq(gw_dataset_fingerprint(ds), fingerprint);
  gw_dataset_free(ds);
}

START_TEST(folder_bad_trees) {
  make_tmpdir();
  mkdirs("train");
  struct gw_dataset *ds;
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 224), "train", "no class directories");
  mkdirs("train/a");
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 224), "train", "no " NAMES " files");
  mkdirs("val/zebra");
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_VAL, 224), "val/zebra", "not a class");
  /* A shard with no readable sample at all is an error, not an endless search. */
  write_file(in_tmp("train/a/t.jpg"), "text", 4);
  /* An empty training class beside a real one (Jupyter's checkpoints): refused
   * by name, not class 0 shifting every label. */
  mkdirs("train/.ipynb_checkpoints");
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32), "train/.ipynb_checkpoints",
               "no " NAMES " files");
  ck_assert_int_eq(rmdir(in_tmp("train/.ipynb_checkpoints")), 0);
  ck_assert_int_eq(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32), GW_SUCCESS);
  struct gw_sampler s;
  gw_sampler_init(&s, 1, 1, 0, 0, 0, 0);
  struct gw_loader_config cfg;
  gw_loader_config_default(&cfg);
  struct gw_loader *l;
  ck_assert_int_eq(gw_loader_init(&l, ds, &s, &cfg), GW_SUCCESS);
  const struct gw_batch *b;
  for (int k = 0; k < 2; k++) expect_error(gw_loader_next(l, &b), "none of the 1 samples", "t.jpg");
  gw_loader_free(l);
  /* An evaluation's loader gives a blank stand-in, scored nowhere: one rank
   * whose whole share is unreadable leaves it out as a single rank would
   * (it failed the job at 2 ranks, not at 1) */
  cfg.blank_unreadable = 1;
  ck_assert_int_eq(gw_loader_init(&l, ds, &s, &cfg), GW_SUCCESS);
  ck_assert_msg(gw_loader_next(l, &b) == GW_SUCCESS && b && b->n == 1 && b->stand_in[0] == 1 && b->skipped == 1 &&
                    b->x[0] == 0.0f,
                "the evaluation's unreadable shard: %s", gw_data_last_error());
  ck_assert_msg(strstr(gw_loader_last_skip(l), "t.jpg"), "the reason: %s", gw_loader_last_skip(l));
  gw_loader_free(l);
  gw_dataset_free(ds);
  /* Class entries: a link to nothing is left out and said; one that cannot be
   * looked at (a link to itself) stops the scan: a class left out silently
   * would shift every later class's label. */
  ck_assert_int_eq(symlink("nowhere", in_tmp("train/b")), 0);
  ck_assert_msg(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_int_eq(gw_dataset_classes(ds), 1);
  ck_assert_msg(strstr(gw_dataset_description(ds), "train/b: a link to nothing"), "%s", gw_dataset_description(ds));
  /* Counted once, though the training split's classes and its class
   * directories are the same listing. */
  ck_assert_msg(strstr(gw_dataset_description(ds), "; 1 directory left out ("), "%s", gw_dataset_description(ds));
  const uint64_t fingerprint = gw_dataset_fingerprint(ds);
  gw_dataset_free(ds);
  /* A *.jpg entry that cannot be looked at is left out and said, as a
   * directory would be; the file list (and its fingerprint) stays. */
  ck_assert_int_eq(symlink("nothing.jpg", in_tmp("train/a/x.jpg")), 0);
  expect_one_file_left_out("train/a/x.jpg: a link to nothing", fingerprint);
  /* and so is one that is no regular file (a FIFO: reading it would block;
   * it was left out unsaid) */
  ck_assert_int_eq(unlink(in_tmp("train/a/x.jpg")), 0);
  ck_assert_int_eq(mkfifo(in_tmp("train/a/f.jpg"), 0600), 0);
  expect_one_file_left_out("train/a/f.jpg: not a regular file", fingerprint);
  ck_assert_int_eq(unlink(in_tmp("train/a/f.jpg")), 0);
  /* Image files of formats torchvision reads and this scan does not decode
   * are counted and said (they were dropped without a word); an evaluation
   * class holding only those is refused as an empty training class is (its
   * class left the scores unsaid). */
  write_file(in_tmp("train/a/p.ppm"), "ppm", 3);
  ck_assert_msg(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32) == GW_SUCCESS, "%s", gw_data_last_error());
  ck_assert_msg(strstr(gw_dataset_description(ds), "; 1 image file of other formats left out (only " DECODED
                                                   " are decoded; the first: ") &&
                    strstr(gw_dataset_description(ds), "train/a/p.ppm)"),
                "%s", gw_dataset_description(ds));
  ck_assert_int_eq(gw_dataset_size(ds), 1);
  gw_dataset_free(ds);
  ck_assert_int_eq(rmdir(in_tmp("val/zebra")), 0);
  /* ImageNet's original validation layout, every image in val/ itself: said
   * so (it said "no .jpg ... files under val") */
  write_file(in_tmp("val/ILSVRC2012_val_00000001.JPEG"), "text", 4);
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_VAL, 32), "val",
               "has no images in class directories: its 1 " NAMES " file lies in it directly");
  ck_assert_int_eq(unlink(in_tmp("val/ILSVRC2012_val_00000001.JPEG")), 0);
  mkdirs("val/a");
  write_file(in_tmp("val/a/v.webp"), "webp", 4);
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_VAL, 32), "val/a",
               "holds no " NAMES " files (it holds 1 image file of other formats; only " NAMES " files are decoded)");
  ck_assert_int_eq(symlink("c", in_tmp("train/c")), 0);
  expect_error(gw_dataset_imagefolder(&ds, tmpdir, GW_SPLIT_TRAIN, 32), "cannot look at", "train/c");
  remove_tmpdir();
}
END_TEST

void add_folder_hostile_tests(TCase *tc) {
  tcase_add_test(tc, folder_bad_trees);
  tcase_add_test(tc, folder_hostile_files);
  tcase_add_test(tc, folder_long_path_named);
  tcase_add_test(tc, folder_link_fan_out_bounded);
  tcase_add_test(tc, folder_leased_file_waited_for);
}
