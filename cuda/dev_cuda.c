/* dev_cuda.c - the device layer (dev.h) on the CUDA runtime: a table of thin
 * wrappers, with the kernels behind copy_async, reduce_async, flag_write, flag_wait and
 * sleep_async in kernels.cu.  A gw_dev_stream_t is a cudaStream_t (NULL: the
 * legacy default stream).  Failures leave "<call>: <cudaGetErrorName>:
 * <cudaGetErrorString>" in a per-thread buffer for error(). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cuda.h> /* types and enums only: the driver's functions come by entry point */
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "dev.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) <= GW_DEV_IPC_BYTES, "a cudaIpcMemHandle_t must fit in struct gw_dev_ipc");

static _Thread_local char cu_errbuf[256];

/* Records a failed CUDA call and returns nonzero (the error code).  A
 * non-sticky error is cleared from the runtime's per-thread last error: the
 * failures we fall back from (IPC, host registration) must not surface at the
 * caller's next unrelated kernel check (PyTorch checks cudaGetLastError after
 * every launch). */
static int cu_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cu_fail(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(cu_errbuf, sizeof cu_errbuf, fmt, ap);
  va_end(ap);
  if (e != cudaSuccess && cudaPeekAtLastError() == e) (void)cudaGetLastError(); /* a sticky one stays */
  if (len >= 0 && (size_t)len < sizeof cu_errbuf)
    snprintf(cu_errbuf + len, sizeof cu_errbuf - (size_t)len, ": %s: %s", cudaGetErrorName(e),
             cudaGetErrorString(e));
  return e != cudaSuccess ? (int)e : (int)cudaErrorUnknown;
}

/* Records a failure of ours (bad arguments) and returns nonzero. */
static int cu_fail_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int cu_fail_msg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cu_errbuf, sizeof cu_errbuf, fmt, ap);
  va_end(ap);
  return (int)cudaErrorInvalidValue;
}

static const char *cu_error(void) { return cu_errbuf; }

static cudaStream_t cs(gw_dev_stream_t s) { return (cudaStream_t)(void *)s; }

/* ---- devices ------------------------------------------------------------------------------ */
static int cu_device_count(int *n) {
  cudaError_t e = cudaGetDeviceCount(n);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaGetDeviceCount");
}

static int cu_get_device(int *dev) {
  cudaError_t e = cudaGetDevice(dev);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaGetDevice");
}

static int cu_set_device(int dev) {
  cudaError_t e = cudaSetDevice(dev);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaSetDevice(%d)", dev);
}

static void cu_relax_capture(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode); /* this thread's, for good (NCCL's proxy thread does so too) */
}

/* cuCtxGetCurrent from the driver, looked up once (NULL when unavailable). */
typedef int (*cu_ctx_get_current_fn)(void **ctx);
static pthread_once_t ctx_fn_once = PTHREAD_ONCE_INIT;
static cu_ctx_get_current_fn ctx_get_current;

/* A driver function by name (the version-12.0 form), or NULL: nothing links
 * libcuda. */
static void *driver_fn(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult qres = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &qres);
  if (e != cudaSuccess || qres != cudaDriverEntryPointSuccess || !fn) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

static void ctx_fn_lookup(void) {
  void *fn = driver_fn("cuCtxGetCurrent");
  /* a data pointer to a function pointer: the documented use of this API */
  if (fn) memcpy(&ctx_get_current, &fn, sizeof ctx_get_current);
}

static int cu_device_in_use(int *yes) {
  pthread_once(&ctx_fn_once, ctx_fn_lookup);
  void *ctx = NULL;
  *yes = ctx_get_current && ctx_get_current(&ctx) == 0 && ctx != NULL;
  return 0;
}

static int cu_ptr_kind(const void *p, int *is_device, int *device) {
  struct cudaPointerAttributes attr;
  *is_device = 0;
  *device = -1;
  if (!p) return 0;
  memset(&attr, 0, sizeof attr);
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* an unknown pointer is host memory, not an error */
    return 0;
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) {
    *is_device = 1;
    *device = attr.device;
  }
  return 0;
}

/* ---- memory ----------------------------------------------------------------------------------- */
static int cu_alloc(void **p, size_t bytes) {
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 1); /* a distinct pointer for 0 bytes too, as the emulator */
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaMalloc(%zu bytes)", bytes);
}

static int cu_free(void *p) {
  cudaError_t e = cudaFree(p);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaFree(%p)", p);
}

static int cu_host_alloc(void **p, size_t bytes) {
  size_t size = bytes ? bytes : 1;
  cudaError_t e = cudaHostAlloc(p, size, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return cu_fail(e, "cudaHostAlloc(%zu bytes, mapped | portable)", bytes);
  memset(*p, 0, size);
  return 0;
}

static int cu_host_free(void *p) {
  cudaError_t e = cudaFreeHost(p);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaFreeHost(%p)", p);
}

static int cu_host_register(void *p, size_t bytes) {
  cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) return cu_fail(e, "cudaHostRegister(%p, %zu bytes, mapped | portable)", p, bytes);
  void *dp = NULL;
  e = cudaHostGetDevicePointer(&dp, p, 0);
  if (e != cudaSuccess || dp != p) {
    cudaHostUnregister(p);
    if (e != cudaSuccess) return cu_fail(e, "cudaHostGetDevicePointer(%p)", p);
    return cu_fail_msg("registered host memory %p is %p on the device (not the same address)", p, dp);
  }
  return 0;
}

static int cu_host_unregister(void *p) {
  cudaError_t e = cudaHostUnregister(p);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaHostUnregister(%p)", p);
}

/* ---- streams ------------------------------------------------------------------------------------ */
static int cu_stream_create(gw_dev_stream_t *s) {
  cudaStream_t st = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cu_fail(e, "cudaStreamCreateWithFlags(cudaStreamNonBlocking)");
  *s = (gw_dev_stream_t)(void *)st;
  return 0;
}

static int cu_stream_destroy(gw_dev_stream_t s) {
  if (!s) return cu_fail_msg("stream_destroy: the default stream cannot be destroyed");
  cudaError_t e = cudaStreamDestroy(cs(s));
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaStreamDestroy");
}

static int cu_stream_sync(gw_dev_stream_t s) {
  cudaError_t e = cudaStreamSynchronize(cs(s));
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaStreamSynchronize");
}

static int cu_stream_idle(gw_dev_stream_t s, int *idle) {
  cudaError_t e = cudaStreamQuery(cs(s));
  if (e == cudaSuccess) {
    *idle = 1;
    return 0;
  }
  if (e == cudaErrorNotReady) { /* busy, not a failure */
    (void)cudaGetLastError();
    *idle = 0;
    return 0;
  }
  return cu_fail(e, "cudaStreamQuery");
}

static int cu_stream_capturing(gw_dev_stream_t s, int *yes) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(cs(s), &st);
  if (e != cudaSuccess) return cu_fail(e, "cudaStreamIsCapturing");
  *yes = st != cudaStreamCaptureStatusNone; /* active, or invalidated by an error */
  return 0;
}

static int cu_stream_device(gw_dev_stream_t s, int *dev) {
#if CUDART_VERSION >= 12080 /* cudaStreamGetDevice's first runtime; before it, nothing is refused */
  cudaError_t e = cudaStreamGetDevice(cs(s), dev);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaStreamGetDevice");
#else
  (void)s, (void)dev;
  return cu_fail(cudaErrorNotSupported, "cudaStreamGetDevice (CUDA 12.8 and later)");
#endif
}

/* ---- stream-ordered work ------------------------------------------------------------------------ */
static int cu_memcpy_async(void *dst, const void *src, size_t bytes, gw_dev_stream_t s) {
  if (!bytes) return 0;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cs(s));
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaMemcpyAsync(%p, %p, %zu bytes)", dst, src, bytes);
}

static int cu_copy_async(void *dst0, void *dst1, const void *src, size_t bytes, gw_dev_stream_t s) {
  if (!bytes) return 0;
  if (!dst0 || !src) return cu_fail_msg("copy_async(%p, %p, %p, %zu): NULL pointer", dst0, dst1, src, bytes);
  int e = gw__cuda_copy(dst0, dst1, src, bytes, (void *)cs(s));
  return e == 0 ? 0 : cu_fail((cudaError_t)e, "copy kernel launch (%zu bytes)", bytes);
}

static int cu_reduce_async(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype, int kop,
                           uint32_t div, gw_dev_stream_t s) {
  if (!n) return 0;
  if (!dst0 || !a || !b) return cu_fail_msg("reduce_async(%p, %p, %p, %p, %zu): NULL pointer", dst0, dst1, a, b, n);
  /* an unknown dtype or op comes back as cudaErrorInvalidValue */
  int e = gw__cuda_reduce(dst0, dst1, a, b, n, dtype, kop, div, (void *)cs(s));
  return e == 0 ? 0 : cu_fail((cudaError_t)e, "reduce kernel launch (dtype %d, op %d, %zu elements)", dtype, kop, n);
}

static int cu_cast_async(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, float scale,
                         gw_dev_stream_t s) {
  if (!n) return 0;
  if (!dst || !src) return cu_fail_msg("cast_async(%p, %p, %zu): NULL pointer", dst, src, n);
  int e = gw__cuda_cast(dst, dst_dtype, src, src_dtype, n, scale, (void *)cs(s));
  return e == 0 ? 0 : cu_fail((cudaError_t)e, "cast kernel launch (dtype %d to %d, %zu elements)", src_dtype, dst_dtype, n);
}

/* Flags by the driver's stream memory operations (cuStreamWriteValue64,
 * cuStreamWaitValue64), where it has them, else by one-thread kernels.  A
 * waiting kernel stays resident on an SM, and where several processes share
 * a GPU without MPS the GPU runs one process's context at a time, in slices of
 * a few ms: every rank's wait kept its context busy, so a collective between
 * ranks of one GPU advanced one time slice per step (2.3 ms for 4 bytes on an
 * H200).  A stream memory operation waits in the GPU's front end instead, with
 * nothing resident, so the other contexts run.  GW_DEV_FLAG_KERNEL=1 keeps the
 * kernels (measurements).  The driver's entry points are looked up once by
 * version, so nothing links libcuda. */
static pthread_once_t memop_once = PTHREAD_ONCE_INIT;
static PFN_cuStreamWriteValue64_v11070 memop_write;
static PFN_cuStreamWaitValue64_v11070 memop_wait;
static PFN_cuDeviceGetAttribute_v2000 memop_attr;
static PFN_cuDeviceGet_v2000 memop_device;
/* Per device ordinal: 0 not asked yet, 1 memops, -1 kernels (no 64-bit
 * memops, or a call answered "not supported"). */
#define MEMOP_DEVS 64
static _Atomic int memop_dev[MEMOP_DEVS];


static void memop_lookup(void) {
  const char *k = getenv("GW_DEV_FLAG_KERNEL");
  if (k && *k && strcmp(k, "0") != 0) return;
  void *w = driver_fn("cuStreamWriteValue64"), *t = driver_fn("cuStreamWaitValue64");
  void *a = driver_fn("cuDeviceGetAttribute"), *g = driver_fn("cuDeviceGet");
  if (!w || !t || !a || !g) return;
  /* data pointers to function pointers: the documented use of this API */
  memcpy(&memop_write, &w, sizeof w);
  memcpy(&memop_wait, &t, sizeof t);
  memcpy(&memop_attr, &a, sizeof a);
  memcpy(&memop_device, &g, sizeof g);
}

/* Whether flags on the calling thread's device go by stream memory operations
 * (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, asked once per device). */
static int cu_flag_memops(int *devp) {
  pthread_once(&memop_once, memop_lookup);
  int dev = -1;
  if (!memop_write || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MEMOP_DEVS) {
    (void)cudaGetLastError();
    return 0;
  }
  *devp = dev;
  int st = atomic_load_explicit(&memop_dev[dev], memory_order_relaxed);
  if (st == 0) {
    CUdevice d;
    int ok = 0;
    st = memop_device(&d, dev) == CUDA_SUCCESS &&
                 memop_attr(&ok, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d) == CUDA_SUCCESS && ok
             ? 1
             : -1;
    atomic_store_explicit(&memop_dev[dev], st, memory_order_relaxed);
  }
  return st > 0;
}

/* A memop that failed: "not supported" sends this device to the kernels for
 * good, said once; anything else (a fault on the stream, a bad handle, an
 * address the driver refuses) is an error: the flag kernel would dereference
 * that address and turn it into a sticky fault of the whole context. */
static int memop_result(CUresult r, int dev, const char *what) {
  if (r == CUDA_SUCCESS) return 0;
  if (r == CUDA_ERROR_NOT_SUPPORTED) {
    if (atomic_exchange(&memop_dev[dev], -1) != -1)
      fprintf(stderr, "gradwire: %s on device %d: CUresult %d: stream flags by kernels there from now on\n", what, dev,
              (int)r);
    return -1; /* take the kernel */
  }
  return cu_fail_msg("%s: CUresult %d", what, (int)r);
}

static int cu_flag_write(uint64_t *flag, uint64_t v, gw_dev_stream_t s) {
  if (!flag) return cu_fail_msg("flag_write: NULL flag");
  int dev = -1;
  if (cu_flag_memops(&dev)) {
    /* CU_STREAM_WRITE_VALUE_DEFAULT: after everything before it on s, its
     * writes visible first.  The flag's host address is its device address
     * (cudaHostAlloc'd mapped memory under unified addressing). */
    int r = memop_result(memop_write((CUstream)(void *)cs(s), (CUdeviceptr)(uintptr_t)flag, v,
                                     CU_STREAM_WRITE_VALUE_DEFAULT),
                         dev, "cuStreamWriteValue64");
    if (r >= 0) return r;
  }
  int e = gw__cuda_flag_write(flag, v, (void *)cs(s));
  return e == 0 ? 0 : cu_fail((cudaError_t)e, "flag write kernel launch");
}

static int cu_flag_wait(const uint64_t *flag, uint64_t v, gw_dev_stream_t s) {
  if (!flag) return cu_fail_msg("flag_wait: NULL flag");
  int dev = -1;
  if (cu_flag_memops(&dev)) {
    /* GEQ: until (int64_t)(*flag - v) >= 0; tickets only grow, far below 2^63. */
    int r = memop_result(memop_wait((CUstream)(void *)cs(s), (CUdeviceptr)(uintptr_t)flag, v, CU_STREAM_WAIT_VALUE_GEQ),
                         dev, "cuStreamWaitValue64");
    if (r >= 0) return r;
  }
  int e = gw__cuda_flag_wait(flag, v, (void *)cs(s));
  return e == 0 ? 0 : cu_fail((cudaError_t)e, "flag wait kernel launch");
}

static int cu_event_create(gw_dev_event_t *ev) {
  cudaEvent_t e = NULL;
  cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (r != cudaSuccess) return cu_fail(r, "cudaEventCreateWithFlags(cudaEventDisableTiming)");
  *ev = (gw_dev_event_t)(void *)e;
  return 0;
}

static int cu_event_destroy(gw_dev_event_t ev) {
  cudaError_t r = cudaEventDestroy((cudaEvent_t)(void *)ev);
  return r == cudaSuccess ? 0 : cu_fail(r, "cudaEventDestroy");
}

static int cu_event_record(gw_dev_event_t ev, gw_dev_stream_t s) {
  cudaError_t r = cudaEventRecord((cudaEvent_t)(void *)ev, cs(s));
  return r == cudaSuccess ? 0 : cu_fail(r, "cudaEventRecord");
}

static int cu_stream_wait_event(gw_dev_stream_t s, gw_dev_event_t ev) {
  cudaError_t r = cudaStreamWaitEvent(cs(s), (cudaEvent_t)(void *)ev, 0);
  return r == cudaSuccess ? 0 : cu_fail(r, "cudaStreamWaitEvent");
}

static int cu_sleep_async(double seconds, gw_dev_stream_t s) {
  int e = gw__cuda_sleep(seconds, (void *)cs(s));
  return e == 0 ? 0 : cu_fail((cudaError_t)e, "sleep kernel launch");
}

/* ---- IPC ------------------------------------------------------------------------------------------ */
static int cu_preload(void) {
  cudaError_t e = (cudaError_t)gw__cuda_preload();
  return e == cudaSuccess ? 0 : cu_fail(e, "loading the kernels (cudaFuncGetAttributes)");
}

static int cu_ipc_get(void *base, struct gw_dev_ipc *h) {
  cudaIpcMemHandle_t mh;
  cudaError_t e = cudaIpcGetMemHandle(&mh, base);
  if (e != cudaSuccess) return cu_fail(e, "cudaIpcGetMemHandle(%p)", base);
  memset(h, 0, sizeof *h);
  memcpy(h->bytes, &mh, sizeof mh);
  return 0;
}

static int cu_ipc_open(const struct gw_dev_ipc *h, void **p) {
  cudaIpcMemHandle_t mh;
  memcpy(&mh, h->bytes, sizeof mh);
  cudaError_t e = cudaIpcOpenMemHandle(p, mh, cudaIpcMemLazyEnablePeerAccess);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaIpcOpenMemHandle");
}

static int cu_ipc_close(void *p) {
  cudaError_t e = cudaIpcCloseMemHandle(p);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaIpcCloseMemHandle(%p)", p);
}

/* CUDA_DEVICE_MAX_CONNECTIONS as the runtime reads it at context creation
 * (1..32; 8 when unset or not a number): read once, at the first call (by
 * then the context exists, or is made at once): a program that changed the
 * variable later made gradwire count 8 queues where the hardware had 1, and
 * every synchronized-ring operation failed after 9 s of probing. */
static int cu_queues(void) {
  static _Atomic int cached;
  int q = atomic_load(&cached);
  if (q) return q;
  const char *v = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  char *end = NULL;
  long n = v && *v ? strtol(v, &end, 10) : 8;
  q = !v || !*v || *end || n < 1 ? 8 : n > 32 ? 32 : (int)n;
  int none = 0;
  atomic_compare_exchange_strong(&cached, &none, q);
  return atomic_load(&cached);
}

static int cu_can_access_peer(int dev, int peer, int *yes) {
  *yes = dev == peer;
  if (dev == peer) return 0;
  cudaError_t e = cudaDeviceCanAccessPeer(yes, dev, peer);
  return e == cudaSuccess ? 0 : cu_fail(e, "cudaDeviceCanAccessPeer(%d, %d)", dev, peer);
}

static const struct gw_dev_ops cuda_ops = {
    .name = "cuda",
    .device_count = cu_device_count,
    .get_device = cu_get_device,
    .set_device = cu_set_device,
    .relax_capture = cu_relax_capture,
    .device_in_use = cu_device_in_use,
    .ptr_kind = cu_ptr_kind,
    .alloc = cu_alloc,
    .free = cu_free,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_sync = cu_stream_sync,
    .stream_idle = cu_stream_idle,
    .stream_capturing = cu_stream_capturing,
    .stream_device = cu_stream_device,
    .memcpy_async = cu_memcpy_async,
    .copy_async = cu_copy_async,
    .reduce_async = cu_reduce_async,
    .cast_async = cu_cast_async,
    .flag_write = cu_flag_write,
    .flag_wait = cu_flag_wait,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait_event,
    .sleep_async = cu_sleep_async,
    .ipc_get = cu_ipc_get,
    .ipc_open = cu_ipc_open,
    .ipc_close = cu_ipc_close,
    .preload = cu_preload,
    .queues = cu_queues,
    .can_access_peer = cu_can_access_peer,
    .error = cu_error,
};

/* Probed once: whether the process sees a GPU, and if not why. */
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static const struct gw_dev_ops *probe_ops;
static char probe_reason[256];

static void probe(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(probe_reason, sizeof probe_reason, "no CUDA device: cudaGetDeviceCount: %s", cudaGetErrorString(e));
    (void)cudaGetLastError();
  } else if (n < 1) {
    snprintf(probe_reason, sizeof probe_reason, "no CUDA device: cudaGetDeviceCount found none");
  } else {
    probe_ops = &cuda_ops;
  }
}

const struct gw_dev_ops *gw__dev_cuda_ops(const char **why_not) {
  pthread_once(&probe_once, probe);
  if (!probe_ops && why_not) *why_not = probe_reason;
  return probe_ops;
}
