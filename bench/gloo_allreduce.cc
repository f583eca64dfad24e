// gloo_allreduce.cc - Gloo's allreduce over its TCP transport, measured the way gw-perf
// measures ours.
//
// A peer harness for bench/compare-tcp.sh, written against the Gloo that Debian
// packages (libgloo-dev, 0.0~git20220518, GLOO_VERSION 0.5.0): float32 sum with
// gloo::allreduce (the options-based API that PyTorch's ProcessGroupGloo uses; ring
// algorithm, segments of at most 1 MiB, two in flight), sizes from -b to -e stepping by
// a factor -f, the same table as nccl-tests / gw-perf on rank 0 and the same CSV as
// bench/mpi_allreduce.c.  It links nothing of gradwire.
//
// Out-of-place is real: gloo::allreduce takes a separate input buffer (setInput) and
// output buffer (setOutput); in-place passes the output only, which Gloo then also
// reads.  The AllreduceOptions (and with them Gloo's "unbound buffers" for the user's
// pointers) are built for every call, as ProcessGroupGloo does, so their cost is in
// the figures, as the cost of MPI_Allreduce's argument checks is in mpi_allreduce's.
//
// Ranks: GW_RANK and GW_WORLD_SIZE from the environment (gw-run sets them; so can a
// script starting the processes itself).  Rendezvous: Gloo's FileStore (the packaged
// Gloo has no TCP store) in --store-dir, under a prefix that every rank of one job
// derives alike (from GW_JOB_TOKEN, else GW_MASTER_PORT, else --store-prefix), so a
// directory left from an earlier job does not mix in.  Each rank removes its own key
// files at the end.  Every rank must see the same directory: two network namespaces
// on one host do.  Device: Gloo's TCP transport bound to --iface (or GLOO_IFACE) if
// given, else to --host (or GLOO_HOST, default 127.0.0.1).
//
// Buffers are allocated, initialised and freed once per size, as nccl-tests and
// mpi_allreduce do, from posix_memalign at a page boundary, as gw-perf's mmap'd buffers
// start (malloc gives 16 bytes).  Time per size is the average per iteration on the
// slowest rank (MAX over ranks of each rank's average).  algbw = bytes / time,
// busbw = algbw * 2(n-1)/n.
//
// The check (-c 1, once per size after the timed runs) follows gw-perf's: the output
// and the 64 bytes after it first hold all ones (NaN as float32), so an output left
// unwritten never passes for a sum; those 64 bytes must still hold them afterwards,
// and out of place the input must be unchanged.  (As mpi_allreduce.)
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

struct Options {
  size_t min_bytes = 8;
  size_t max_bytes = size_t(256) << 20;
  size_t factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  const char *csv_path = nullptr;
  std::string store_dir;
  std::string store_prefix;
  std::string host;
  std::string iface;
  int timeout_s = 300;
};

struct Result {
  double time_us = 0; // average per iteration, slowest rank
  double algbw = 0;   // GB/s, 1e9 bytes per second
  double busbw = 0;
  long long wrong = -1; // wrong elements summed over ranks, -1 when not checked
};

int g_rank = 0, g_nranks = 1;
std::shared_ptr<gloo::Context> g_ctx;
uint32_t g_tag = 0;

[[noreturn]] void die(const std::string &msg) {
  fprintf(stderr, "gloo_allreduce: rank %d: %s\n", g_rank, msg.c_str());
  fflush(stderr);
  // No MPI_Abort here: the peer sees its connection close (or times out) and fails.
  _exit(1);
}

void usage(FILE *f) {
  fprintf(f,
          "usage: gloo_allreduce [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
          "                      [-c 0|1] [--csv FILE] [--store-dir DIR] [--store-prefix P]\n"
          "                      [--host ADDR | --iface NAME] [--timeout SECONDS]\n"
          "  float32 sum gloo::allreduce over Gloo's TCP transport, out-of-place and\n"
          "  in-place, sizes in bytes with optional suffix K, M or G (powers of 1024).\n"
          "  Defaults: -b 8 -e 256M -f 2 -n 20 -w 5 -c 1, --store-dir $TMPDIR or /tmp,\n"
          "  --host $GLOO_HOST or 127.0.0.1, --iface $GLOO_IFACE, --timeout 300 (per\n"
          "  operation).  Rank and size come from GW_RANK and GW_WORLD_SIZE: start it\n"
          "  with 'gw-run -n 2 gloo_allreduce ...' or set them per process.  Rank 0\n"
          "  prints the table.\n");
}

// "8", "64K", "256M", "1G" -> bytes; 0 on a malformed or overflowing value.
size_t parse_size(const char *s) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return 0;
  unsigned long long mult = 1;
  switch (*end) {
  case '\0': break;
  case 'k': case 'K': mult = 1ULL << 10; end++; break;
  case 'm': case 'M': mult = 1ULL << 20; end++; break;
  case 'g': case 'G': mult = 1ULL << 30; end++; break;
  default: return 0;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || v > SIZE_MAX / mult) return 0;
  return size_t(v * mult);
}

int parse_int(const char *s, int *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0 || v > INT_MAX) return -1;
  *out = int(v);
  return 0;
}

const char *env_or(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// 64-bit FNV-1a: the job token names the store prefix without appearing in it.
uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

int parse_args(int argc, char **argv, Options *o) {
  o->store_dir = env_or("TMPDIR", "/tmp");
  o->host = env_or("GLOO_HOST", "127.0.0.1");
  o->iface = env_or("GLOO_IFACE", "");
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      if (g_rank == 0) usage(stdout);
      return 1;
    }
    if (i + 1 >= argc) {
      if (g_rank == 0) fprintf(stderr, "gloo_allreduce: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    bool bad = false;
    if (strcmp(a, "-b") == 0) bad = (o->min_bytes = parse_size(v)) == 0;
    else if (strcmp(a, "-e") == 0) bad = (o->max_bytes = parse_size(v)) == 0;
    else if (strcmp(a, "-f") == 0) bad = (o->factor = parse_size(v)) < 2;
    else if (strcmp(a, "-n") == 0) bad = parse_int(v, &o->iters) != 0 || o->iters < 1;
    else if (strcmp(a, "-w") == 0) bad = parse_int(v, &o->warmup) != 0;
    else if (strcmp(a, "-c") == 0) bad = parse_int(v, &o->check) != 0 || o->check > 1;
    else if (strcmp(a, "--csv") == 0) o->csv_path = v;
    else if (strcmp(a, "--store-dir") == 0) bad = *(o->store_dir = v).c_str() == '\0';
    else if (strcmp(a, "--store-prefix") == 0) bad = *(o->store_prefix = v).c_str() == '\0';
    else if (strcmp(a, "--host") == 0) bad = *(o->host = v).c_str() == '\0';
    else if (strcmp(a, "--iface") == 0) o->iface = v;
    else if (strcmp(a, "--timeout") == 0) bad = parse_int(v, &o->timeout_s) != 0 || o->timeout_s < 1;
    else {
      if (g_rank == 0) {
        fprintf(stderr, "gloo_allreduce: unknown option %s\n", a);
        usage(stderr);
      }
      return -1;
    }
    if (bad) {
      if (g_rank == 0) fprintf(stderr, "gloo_allreduce: bad value '%s' for %s\n", v, a);
      return -1;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    if (g_rank == 0) fprintf(stderr, "gloo_allreduce: -b is larger than -e\n");
    return -1;
  }
  if (o->store_prefix.empty()) {
    const char *token = getenv("GW_JOB_TOKEN"), *port = getenv("GW_MASTER_PORT");
    char buf[64];
    if (token != nullptr && *token != '\0')
      snprintf(buf, sizeof buf, "gloo_allreduce-%016llx",
               (unsigned long long)fnv1a(token));
    else if (port != nullptr && *port != '\0')
      snprintf(buf, sizeof buf, "gloo_allreduce-port%.20s", port);
    else
      snprintf(buf, sizeof buf, "gloo_allreduce");
    o->store_prefix = buf;
  }
  return 0;
}

// Rank r's element i: a small integer, so any order of summation is exact in float32
// for fewer than 2^16 ranks.  The period 257 is not a divisor of any power-of-two
// chunk size, so a chunk reduced into the wrong place is caught.  (As mpi_allreduce.)
float value_of(int r, size_t i) { return float(long((i + 3 * size_t(r)) % 257) - 128); }

void fill(float *buf, size_t count, int r) {
  for (size_t i = 0; i < count; i++) buf[i] = value_of(r, i);
}

long long count_wrong(const float *buf, size_t count) {
  long long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float expect = 0.0f;
    for (int r = 0; r < g_nranks; r++) expect += value_of(r, i);
    if (buf[i] != expect) wrong++;
  }
  return wrong;
}

// Tags only have to differ between operations in flight at once; each call here
// waits for its result, but a fresh tag per call costs nothing and is what
// ProcessGroupGloo does.
template <typename T>
void allreduce_raw(const T *send, T *recv, size_t count,
                   void (*fn)(void *, const void *, const void *, size_t)) {
  gloo::AllreduceOptions opts(g_ctx);
  if (send != nullptr) opts.setInput(const_cast<T *>(send), count);
  opts.setOutput(recv, count);
  opts.setReduceFunction(fn);
  opts.setTag(g_tag++);
  gloo::allreduce(opts);
}

// send == nullptr means in place on recv.
void allreduce(const float *send, float *recv, size_t count) {
  allreduce_raw<float>(send, recv, count, &gloo::sum<float>);
}

void barrier() {
  gloo::BarrierOptions opts(g_ctx);
  opts.setTag(g_tag++);
  gloo::barrier(opts);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// In place, the values grow by a factor of nranks per iteration and may reach inf;
// that does not change the speed of float addition, and the checked run starts
// from fresh values.
Result measure(const float *send, float *recv, size_t count, const Options &o) {
  Result res;
  for (int i = 0; i < o.warmup; i++) allreduce(send, recv, count);
  barrier();
  double t0 = now_s();
  for (int i = 0; i < o.iters; i++) allreduce(send, recv, count);
  double slowest = (now_s() - t0) / o.iters;
  allreduce_raw<double>(nullptr, &slowest, 1, &gloo::max<double>);
  double bytes = double(count) * sizeof(float);
  res.time_us = slowest * 1e6;
  res.algbw = slowest > 0 ? bytes / slowest / 1e9 : 0.0;
  res.busbw = res.algbw * 2.0 * (g_nranks - 1) / g_nranks;
  return res;
}

// Bytes after the output that the check expects untouched (gw-perf's 64).
constexpr size_t kSlack = 64;

// A page-aligned buffer of `bytes` plus kSlack, as gw-perf's buffers are aligned.
float *alloc_buffer(size_t bytes) {
  void *p = nullptr;
  if (posix_memalign(&p, 4096, bytes + kSlack) != 0) die("out of memory allocating the buffers");
  return static_cast<float *>(p);
}

// One fresh run from known values, counted on every rank and summed: wrong output
// elements, bytes written past the output, and out of place input elements changed
// (gw-perf's fill_run_check).  The output and the kSlack bytes after it first hold all
// ones, a NaN that equals no sum; in place the input then goes over the output.
long long check(float *send, float *recv, size_t count, bool in_place) {
  const unsigned char *after = reinterpret_cast<const unsigned char *>(recv + count);
  memset(recv, 0xff, count * sizeof(float) + kSlack);
  fill(in_place ? recv : send, count, g_rank);
  allreduce(in_place ? nullptr : send, recv, count);
  int64_t total = count_wrong(recv, count);
  for (size_t b = 0; b < kSlack; b++) total += after[b] != 0xff;
  for (size_t i = 0; !in_place && i < count; i++) total += send[i] != value_of(g_rank, i);
  allreduce_raw<int64_t>(nullptr, &total, 1, &gloo::sum<int64_t>);
  return (long long)total;
}

// nccl-tests' widths: fewer decimals as the time grows, so columns stay aligned.
void print_time(double us) {
  if (us >= 10000.0) printf("  %7.0f", us);
  else if (us >= 100.0) printf("  %7.1f", us);
  else printf("  %7.2f", us);
}

void print_result(const Result &r) {
  print_time(r.time_us);
  printf("  %6.2f  %6.2f  ", r.algbw, r.busbw);
  if (r.wrong < 0) printf("%5s", "N/A");
  else printf("%5lld", r.wrong);
}

int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  int out;
  if (v == nullptr) return fallback;
  if (parse_int(v, &out) != 0) die(std::string("bad ") + name + "='" + v + "'");
  return out;
}

int run(int argc, char **argv) {
  g_rank = env_int("GW_RANK", 0);
  g_nranks = env_int("GW_WORLD_SIZE", 1);
  if (g_nranks < 1 || g_rank >= g_nranks) die("need 0 <= GW_RANK < GW_WORLD_SIZE");

  Options o;
  int rc = parse_args(argc, argv, &o);
  if (rc != 0) return rc < 0 ? 2 : 0;

  gloo::transport::tcp::attr attr;
  if (!o.iface.empty()) attr.iface = o.iface;
  else attr.hostname = o.host;
  auto dev = gloo::transport::tcp::CreateDevice(attr);

  gloo::rendezvous::FileStore file_store(o.store_dir);
  gloo::rendezvous::PrefixStore store(o.store_prefix, file_store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(g_rank, g_nranks);
  ctx->setTimeout(std::chrono::seconds(o.timeout_s));
  ctx->connectFullMesh(store, dev);
  g_ctx = ctx;

  FILE *csv = nullptr;
  if (g_rank == 0 && o.csv_path != nullptr) {
    csv = fopen(o.csv_path, "w");
    if (csv == nullptr) die(std::string("cannot write ") + o.csv_path + ": " + strerror(errno));
    fprintf(csv, "size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
                 "ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
  }

  if (g_rank == 0) {
    printf("# gloo_allreduce: %d ranks, Gloo %d.%d.%d, %s, iters %d, warmup %d, check %d\n",
           g_nranks, GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH,
           dev->str().c_str(), o.iters, o.warmup, o.check);
    // The header of nccl-tests and gw-perf, character for character.
    printf("#                                                       out-of-place"
           "                       in-place\n");
    printf("#       size         count      type   redop    root     time   algbw   busbw"
           " #wrong     time   algbw   busbw #wrong\n");
    printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
           "            (us)  (GB/s)  (GB/s)\n");
    fflush(stdout);
  }

  // connectFullMesh has connected every pair; a few small operations here keep
  // anything else that is set up on first use out of the first size's timed loop.
  for (int i = 0; i < 32; i++) {
    float one = 1.0f;
    allreduce(nullptr, &one, 1);
    barrier();
  }
  // Then the warmup's count at the largest size and at the smallest, out of
  // place, as nccl-tests (and gw-perf) do before a sweep.
  for (size_t bytes : {o.max_bytes, o.min_bytes}) {
    size_t count = bytes / sizeof(float);
    if (count == 0) continue;
    float *send = alloc_buffer(count * sizeof(float)), *recv = alloc_buffer(count * sizeof(float));
    fill(send, count, g_rank);
    for (int i = 0; i < o.warmup; i++) allreduce(send, recv, count);
    free(send);
    free(recv);
  }

  double busbw_sum = 0.0;
  int n_results = 0;
  long long wrong_total = 0;
  for (size_t size = o.min_bytes; size <= o.max_bytes;) {
    size_t count = size / sizeof(float);
    if (count > 0) {
      size_t bytes = count * sizeof(float);
      float *send = alloc_buffer(bytes), *recv = alloc_buffer(bytes);
      fill(send, count, g_rank);
      memcpy(recv, send, bytes);

      Result oop = measure(send, recv, count, o);
      memcpy(recv, send, bytes);
      Result ip = measure(nullptr, recv, count, o);
      if (o.check) {
        oop.wrong = check(send, recv, count, false);
        ip.wrong = check(send, recv, count, true);
        wrong_total += oop.wrong + ip.wrong;
      }
      free(send);
      free(recv);

      // "Avg bus bandwidth" is the mean over the out-of-place and the in-place result
      // of every size, as nccl-tests computes it (gw-perf does the same).
      busbw_sum += oop.busbw + ip.busbw;
      n_results += 2;
      if (g_rank == 0) {
        printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, "float32", "sum", -1);
        print_result(oop);
        print_result(ip);
        printf("\n");
        fflush(stdout);
        if (csv != nullptr)
          fprintf(csv, "%zu,%zu,float32,sum,-1,%.3f,%.4f,%.4f,%lld,%.3f,%.4f,%.4f,%lld\n",
                  bytes, count, oop.time_us, oop.algbw, oop.busbw, oop.wrong, ip.time_us,
                  ip.algbw, ip.busbw, ip.wrong);
      }
    }
    if (size > SIZE_MAX / o.factor) break;
    size *= o.factor;
  }

  if (g_rank == 0) {
    printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "ERROR" : "OK");
    printf("# Avg bus bandwidth    : %g\n", n_results > 0 ? busbw_sum / n_results : 0.0);
    fflush(stdout);
  }
  if (csv != nullptr && fclose(csv) != 0) die(std::string("writing ") + o.csv_path + " failed");

  // Every rank has read every key by now (connectFullMesh waits for all of them), so
  // each can remove the files it wrote; the barrier keeps a slow reader safe anyway.
  barrier();
  for (const std::string &path : file_store.getAllKeyFilePaths()) unlink(path.c_str());
  g_ctx.reset();
  return wrong_total > 0 ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception &e) {
    die(std::string("Gloo failed: ") + e.what());
  }
}
