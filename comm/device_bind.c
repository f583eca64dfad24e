/* device_bind.c - a rank's device (GW_DEVICE, or the local rank modulo the
 * devices, or the one already current) and the checks of a call's buffers and
 * stream against it: host or device memory, whose device, a stream of another
 * device, one being captured.  The stream-ordered machinery is device.c's. */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "dev.h"
#include "devring.h"
#include "reduce.h"

/* The emulator's reductions are the host kernels. */
static void host_reduce(void *dst0, void *dst1, const void *a, const void *b, size_t n, int dtype, int kop,
                        uint32_t div) {
  (*gw__reduce_table())[dtype][kop](dst0, dst1, a, b, n, div);
}

/* The emulator's cast_async: the bucketer's wire conversions on the host. */
static void host_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, float scale) {
  if (dst_dtype == GW_FLOAT32) gw__cvt_to_f32((gw_dtype_t)src_dtype, dst, src, n);
  else gw__cvt_from_f32_scaled((gw_dtype_t)dst_dtype, dst, src, n, scale);
}

/* ---- binding a rank to a device ------------------------------------------------------- */
gw_result_t gw__dev_bind(struct gw_comm *comm, struct gw_errctx *err) {
  comm->device = -1;
  const struct gw_dev_ops *dv = gw__dev();
  if (!dv) return GW_SUCCESS;
  const char *want = gw__env_str("GW_DEVICE", NULL);
  if (want && !strcmp(want, "none")) return GW_SUCCESS;
  int ndev = 0, dev = -1, in_use = 0;
  if (dv->device_count(&ndev) || ndev < 1) return gw__dev_fail(err, comm, "counting the devices");
  if (want && *want) {
    char *end;
    long v = strtol(want, &end, 10);
    if (*end || v < 0 || v >= ndev)
      return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: GW_DEVICE=%s is not 'none' or a device in 0..%d",
                     comm->rank, want, ndev - 1);
    dev = (int)v;
  } else {
    if (dv->device_in_use(&in_use)) return gw__dev_fail(err, comm, "asking for the current device");
    if (in_use && dv->get_device(&dev)) return gw__dev_fail(err, comm, "asking for the current device");
    if (!in_use) dev = comm->local_rank % ndev;
  }
  if (dv->set_device(dev)) return gw__dev_fail(err, comm, "binding to a device");
  comm->device = dev;
  if (dv->preload && dv->preload()) return gw__dev_fail(err, comm, "loading the device kernels");
  gw__dev_set_host_reduce(host_reduce);
  gw__dev_set_host_cast(host_cast);
  GW_INFO(GW_SUB_INIT, "rank %d: device %d of %d (%s, %s)", comm->rank, dev, ndev, dv->name,
          want && *want ? "GW_DEVICE" : in_use ? "already current" : "local rank modulo devices");
  return GW_SUCCESS;
}

void gw__dev_thread_start(struct gw_comm *comm) {
  const struct gw_dev_ops *dv = gw__dev();
  if (dv && dv->relax_capture) dv->relax_capture();
  if (dv && comm->device >= 0 && dv->set_device(comm->device))
    GW_WARN(GW_SUB_PROXY, "rank %d: the progress thread cannot use device %d: %s", comm->rank, comm->device,
            dv->error());
}

/* ---- argument checks --------------------------------------------------------------------- */
/* What p is (host or device memory, of which device), and for device memory
 * whether the call's `bytes` from it are too: a buffer shorter than the call
 * made the copies and kernels fault, and a CUDA fault is sticky (the
 * context is dead for the rest of the process).  The last byte is asked
 * about as the first is: past the end of an allocation's pages it is no
 * device memory (not caught: a shorter buffer whose end still lies in the
 * allocation's rounding, or in the next allocation). */
static gw_result_t kind_of(struct gw_comm *comm, const char *fn, const char *name, const void *p, size_t bytes,
                           int *is_dev, struct gw_errctx *err) {
  int dev = -1;
  *is_dev = 0;
  const struct gw_dev_ops *dv = gw__dev();
  if (!dv || !p) return GW_SUCCESS;
  dv->ptr_kind(p, is_dev, &dev);
  if (!*is_dev) return GW_SUCCESS;
  if (comm->device < 0)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: %s is device memory, but this communicator is "
                   "bound to no device (GW_DEVICE=none)", comm->rank, fn, name);
  if (dev != comm->device)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: %s is memory of device %d, but this communicator "
                   "is bound to device %d", comm->rank, fn, name, dev, comm->device);
  int end_dev = 0, end_device = -1;
  if (bytes > 1) dv->ptr_kind((const char *)p + bytes - 1, &end_dev, &end_device);
  if (bytes > 1 && (!end_dev || end_device != dev))
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: %s starts in device %d's memory, but its last byte "
                   "for this call (%zu bytes on) is not: the buffer is shorter than the call's count", comm->rank, fn,
                   name, dev, bytes - 1);
  return GW_SUCCESS;
}

/* What a stream given to fn must be: of the communicator's device, not
 * under capture, and a device layer there to take it. */
static gw_result_t stream_check(struct gw_comm *comm, const char *fn, void *stream, struct gw_errctx *err) {
  if (!gw__dev())
    return gw__err(err, GW_ERR_UNSUPPORTED, "rank %d: %s: a CUDA stream was given, but %s; pass stream = NULL with "
                   "host buffers", comm->rank, fn, gw__dev_absent_reason());
  if (comm->device < 0)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: a CUDA stream was given, but this communicator is "
                   "bound to no device (GW_DEVICE=none)", comm->rank, fn);
  int capturing = 0;
  if (gw__dev()->stream_capturing(stream, &capturing) == 0 && capturing)
    return gw__err(err, GW_ERR_UNSUPPORTED, "rank %d: %s: the stream is being captured into a CUDA graph; gradwire "
                   "calls cannot be captured yet (make the call outside the capture)", comm->rank, fn);
  /* A stream of another device: its work would run there, the copies and
   * kernels on this device's memory from another context (a fault, or peer
   * traffic).  Only a definite answer refuses (a stream the runtime cannot
   * place is left to the calls that use it). */
  int stream_dev = -1;
  if (gw__dev()->stream_device(stream, &stream_dev) == 0 && stream_dev != comm->device)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: the stream is device %d's, but this communicator is "
                   "bound to device %d (a stream's work runs on its own device: pass one of device %d's streams)",
                   comm->rank, fn, stream_dev, comm->device, comm->device);
  return GW_SUCCESS;
}

static gw_result_t dev_check(struct gw_comm *comm, const char *fn, struct gw_op *op, void *stream, size_t send_elems,
                             size_t recv_elems, struct gw_errctx *err) {
  op->stream = stream;
  op->ordered = false;
  op->device_mem = false;
  int sdev = 0, rdev = 0;
  const size_t es = gw_dtype_size((gw_dtype_t)op->desc.dtype); /* the sizes were checked not to overflow */
  if (send_elems) GW_CHECK(kind_of(comm, fn, "sendbuf", op->sendbuf, send_elems * es, &sdev, err));
  if (recv_elems) GW_CHECK(kind_of(comm, fn, "recvbuf", op->recvbuf, recv_elems * es, &rdev, err));
  if (send_elems && recv_elems && sdev != rdev)
    return gw__err(err, GW_ERR_INVALID_ARGUMENT, "rank %d: %s: sendbuf is %s memory but recvbuf is %s memory; both "
                   "must be on the same side (copy one of them first)", comm->rank, fn, sdev ? "device" : "host",
                   rdev ? "device" : "host");
  op->device_mem = sdev || rdev;
  if (stream) GW_CHECK(stream_check(comm, fn, stream, err));
  op->ordered = stream || op->device_mem;
  if (op->device_mem && comm->devring) op->desc.pad |= GW_DESC_DEVICE;
  return GW_SUCCESS;
}

/* The checks run on the communicator's device: asking CUDA about a pointer
 * on a thread that never used a device makes device 0's context current
 * there (a host-buffer call from a fresh thread cost half a GB on GPU 0). */
gw_result_t gw__dev_check_buffer(struct gw_comm *comm, const char *fn, const char *name, const void *p, size_t bytes,
                                 int *is_dev, struct gw_errctx *err) {
  int prev = -1, dev = 0;
  (void)gw__dev_enter(comm->device, &prev);
  gw_result_t r = kind_of(comm, fn, name, p, bytes, &dev, err);
  gw__dev_switch_back(prev);
  if (is_dev) *is_dev = dev;
  return r;
}

gw_result_t gw__dev_check(struct gw_comm *comm, const char *fn, struct gw_op *op, void *stream, size_t send_elems,
                          size_t recv_elems, struct gw_errctx *err) {
  int prev = -1;
  (void)gw__dev_enter(comm->device, &prev); /* a failure shows in the checks or the operation */
  gw_result_t r = dev_check(comm, fn, op, stream, send_elems, recv_elems, err);
  gw__dev_switch_back(prev);
  return r;
}

gw_result_t gw__dev_check_stream(struct gw_comm *comm, const char *fn, void *stream, struct gw_errctx *err) {
  int prev = -1;
  (void)gw__dev_enter(comm->device, &prev);
  gw_result_t r = stream_check(comm, fn, stream, err);
  gw__dev_switch_back(prev);
  return r;
}
