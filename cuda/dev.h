/* dev.h - the device layer: everything comm/ and transport/ need from a GPU,
 * behind one table with two implementations:
 *   - "cuda" (dev_cuda.c + kernels.cu): built when the CUDA toolkit exists, used
 *     when the process sees a GPU;
 *   - "emulated" (dev_emu.c): always built, chosen with GW_DEV_EMULATE=N (N
 *     devices, 1..1024; anything else leaves no device, with the reason).  Device memory is memfd-backed host
 *     memory that other processes open by IPC handle, a stream is a thread that
 *     runs its work in order.  It keeps the same contract, so the stream-ordered
 *     collectives are tested on machines without a GPU, as the verbs emulator
 *     does for ib.
 * Not installed.  Functions return 0 on success, else nonzero with a message
 * for error() (per thread). */
#ifndef GW_DEV_H
#define GW_DEV_H

#include <stddef.h>
#include <stdint.h>

/* A stream: a cudaStream_t for "cuda".  NULL is the default (legacy) stream. */
typedef struct gw_dev_stream *gw_dev_stream_t;
/* An event: a cudaEvent_t (timing disabled) for "cuda". */
typedef struct gw_dev_event *gw_dev_event_t;

/* What one process passes to another to map a device allocation. */
#define GW_DEV_IPC_BYTES 64
struct gw_dev_ipc {
  unsigned char bytes[GW_DEV_IPC_BYTES]; /* cudaIpcMemHandle_t, or the emulator's (pid, fd, size) */
};

struct gw_dev_ops {
  const char *name; /* "cuda" or "emulated" */
  int (*device_count)(int *n);
  int (*get_device)(int *dev);
  int (*set_device)(int dev); /* for the calling thread */
  /* The calling thread's CUDA calls allowed while another thread captures a
   * graph in global mode (PyTorch's torch.cuda.graph): a stream query or a
   * pinned allocation of the progress thread failed there
   * (cudaErrorStreamCaptureUnsupported), taken for a device fault, and
   * invalidated the user's capture.  NULL: nothing to do (the emulator). */
  void (*relax_capture)(void);
  /* *yes = 1 when the calling thread already works on a device (a CUDA
   * context is current), so binding it to another would surprise its owner. */
  int (*device_in_use)(int *yes);
  /* *is_device = 1 for memory only the device should touch (cudaMalloc'd,
   * managed, IPC-mapped), and *device its ordinal; 0 for host memory (pageable
   * or pinned).  Never fails for an unknown pointer: that is host memory. */
  int (*ptr_kind)(const void *p, int *is_device, int *device);

  int (*alloc)(void **p, size_t bytes); /* device memory on the current device */
  int (*free)(void *p);
  /* Pinned host memory, mapped for the device at the same address (flags,
   * staging buffers). */
  int (*host_alloc)(void **p, size_t bytes);
  int (*host_free)(void *p);
  /* Makes host memory the process already has (a shared-memory mapping) usable
   * by the device at the same address, as host_alloc's: flag_write and
   * flag_wait may then name it.  bytes from p, p page-aligned.  Fails where
   * the device would see it at another address. */
  int (*host_register)(void *p, size_t bytes);
  int (*host_unregister)(void *p);

  int (*stream_create)(gw_dev_stream_t *s); /* does not synchronize with the default stream */
  int (*stream_destroy)(gw_dev_stream_t s);
  int (*stream_sync)(gw_dev_stream_t s);           /* waits for everything enqueued so far */
  int (*stream_idle)(gw_dev_stream_t s, int *idle); /* *idle = 1 when it has nothing left */
  /* *yes = 1 while s is being captured into a CUDA graph (work enqueued on it
   * is recorded, not run). */
  int (*stream_capturing)(gw_dev_stream_t s, int *yes);
  int (*stream_device)(gw_dev_stream_t s, int *dev); /* the device s was made on (cudaStreamGetDevice) */

  /* Stream-ordered work.  Copies take any pair of host/device pointers. */
  int (*memcpy_async)(void *dst, const void *src, size_t bytes, gw_dev_stream_t s);
  /* dst0 = src, and dst1 = src when dst1 is not NULL (bytes; dst0/dst1 device
   * memory, src any): on the SMs, reading src once ("cuda": the reduction's
   * kernel, 16-byte chunks when the pointers share their 16-byte phase), where
   * memcpy_async uses a copy engine.  No overlaps. */
  int (*copy_async)(void *dst0, void *dst1, const void *src, size_t bytes, gw_dev_stream_t s);
  /* dst0[i] = dst1[i] = (a[i] OP b[i]) / div over n elements (dst1 may be NULL;
   * div 0 or 1: none); dtype a gw_dtype_t, kop GW_KOP_* of reduce.h; fp16 and
   * bf16 computed in fp32.  Same aliasing rules as the host kernels. */
  int (*reduce_async)(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype, int kop,
                      uint32_t div, gw_dev_stream_t s);
  /* *flag = v once everything before it on s has finished (flag in host_alloc
   * memory); and: later work on s waits until *flag >= v.  These order a
   * stream with the host thread that runs a collective, without blocking the
   * thread that enqueued them. */
  int (*flag_write)(uint64_t *flag, uint64_t v, gw_dev_stream_t s);
  int (*flag_wait)(const uint64_t *flag, uint64_t v, gw_dev_stream_t s);
  /* Events order two streams without the host: event_record marks the point
   * after everything enqueued on s so far; stream_wait_event makes later work
   * on s wait for the latest record of e (none yet: no wait).  An event may be
   * destroyed while work still refers to it. */
  int (*event_create)(gw_dev_event_t *e);
  int (*event_destroy)(gw_dev_event_t e);
  int (*event_record)(gw_dev_event_t e, gw_dev_stream_t s);
  int (*stream_wait_event)(gw_dev_stream_t s, gw_dev_event_t e);
  /* dst [n] (dst_dtype) = src [n] (src_dtype): float32 to float16 / bfloat16
   * (round to nearest even) or back (exact); comm/reduce_cvt.h's conversions.
   * To 16 bits each element is multiplied by scale first (in float32; the
   * bucketer's float16 average divides before the sum); back, scale is 1. */
  int (*cast_async)(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, float scale,
                    gw_dev_stream_t s);
  /* A kernel that takes `seconds` (tests: slow work ahead of a collective). */
  int (*sleep_async)(double seconds, gw_dev_stream_t s);
  /* Loads every kernel this layer launches on the current device now.  CUDA
   * loads a kernel at its first launch by default (lazy loading), and loading
   * may wait for the whole context: with a caller's stream spinning on a flag
   * that only the progress thread's kernels release, a first launch there
   * would never return.  Called when a communicator binds its device. */
  int (*preload)(void);
  /* How many hardware work queues the streams of a device share (CUDA: the
   * process's CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set; the emulator:
   * GW_DEV_EMU_CONNECTIONS, 0 for one per stream).  Work of two streams in
   * one queue runs in the order it was enqueued, so with one queue a stream
   * that waits (flag_wait) for the host holds up every stream behind it. */
  int (*queues)(void);
  /* *yes = 1 when kernels on device dev may read and write memory of device
   * peer (the same device, or peer access possible: cudaDeviceCanAccessPeer);
   * the emulator says yes unless GW_DEV_EMU_NO_PEER=1. */
  int (*can_access_peer)(int dev, int peer, int *yes);

  /* IPC: a handle for an allocation made by alloc (its base pointer), opened
   * once by another process of the same machine; close unmaps. */
  int (*ipc_get)(void *base, struct gw_dev_ipc *h);
  int (*ipc_open)(const struct gw_dev_ipc *h, void **p);
  int (*ipc_close)(void *p);

  const char *(*error)(void); /* the calling thread's last failure */
};

/* The device layer this process uses: the emulator under GW_DEV_EMULATE, else
 * CUDA when built with it and a GPU is visible, else NULL (host memory only).
 * Decided once. */
const struct gw_dev_ops *gw__dev(void);
/* Why gw__dev() is NULL, for messages ("built without CUDA", "no GPU: ..."). */
const char *gw__dev_absent_reason(void);

/* The emulator's reduction runs the host kernels; comm/ hands them over
 * (cuda/ sits below comm/). */
typedef void (*gw_dev_host_reduce_fn)(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype,
                                      int kop, uint32_t div);
void gw__dev_set_host_reduce(gw_dev_host_reduce_fn fn);
gw_dev_host_reduce_fn gw__dev_host_reduce(void);
/* And its casts (cast_async), the host's conversions. */
typedef void (*gw_dev_host_cast_fn)(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, float scale);
void gw__dev_set_host_cast(gw_dev_host_cast_fn fn);
gw_dev_host_cast_fn gw__dev_host_cast(void);

/* Tests: makes an emulated stream report that it is being captured. */
void gw__dev_emu_set_capturing(gw_dev_stream_t s, int on);
/* Tests: the emulator's enqueues fail once n more went in (-1: never again). */
void gw__dev_emu_fail_pushes_after(long n);
/* Tests: the emulated device faults at the n-th stream item run from now (a
 * kernel's illegal address): that item and all later ones do nothing, and
 * every later call reaching the device fails with the error, sticky, as a
 * CUDA context's (-1: no fault, and a fault cleared). */
void gw__dev_emu_fault_after(long n);

/* The implementations (dev.c picks one). */
const struct gw_dev_ops *gw__dev_emu_ops(int ndevices);
const struct gw_dev_ops *gw__dev_cuda_ops(const char **why_not); /* NULL with a reason when no GPU */

/* ---- CUDA launchers (kernels.cu; only with CUDA).  Return a cudaError_t. */
int gw__cuda_reduce(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype, int kop,
                    uint32_t div, void *stream);
int gw__cuda_copy(void *dst0, void *dst1, const void *src, size_t bytes, void *stream);
int gw__cuda_flag_write(uint64_t *flag, uint64_t v, void *stream);
int gw__cuda_flag_wait(const uint64_t *flag, uint64_t v, void *stream);
int gw__cuda_sleep(double seconds, void *stream);
int gw__cuda_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, float scale, void *stream);
/* Loads every kernel above on the current device (cudaFuncGetAttributes). */
int gw__cuda_preload(void);

#endif
