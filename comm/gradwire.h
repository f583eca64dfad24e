/* gradwire.h - the public API of gradwire, a gradient-communication runtime.
 *
 * Shaped like NCCL's API so code written for NCCL ports with a rename: the
 * collectives take (send, recv, count, dtype, [op|root], comm, stream) in the order
 * of ncclAllReduce, ncclBroadcast, ncclAllGather and ncclReduceScatter.  Buffers
 * may be host or device (CUDA) memory, found from the pointers; a CUDA stream
 * orders a call on that stream without blocking the caller.  The non-blocking forms
 * (gw_i...) take a request pointer last and complete through gw_wait / gw_test.
 *
 * Every function returns a gw_result_t; gw_comm_last_error() gives the detailed
 * message of the last failure (which rank, which peer, what to try).
 */
#ifndef GRADWIRE_H
#define GRADWIRE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GW_VERSION_MAJOR 0
#define GW_VERSION_MINOR 1
#define GW_VERSION_PATCH 0

typedef enum {
  GW_SUCCESS = 0,
  GW_ERR_INVALID_ARGUMENT = 1, /* bad argument, or calls that differ across ranks */
  GW_ERR_SYSTEM = 2,           /* a system call failed (socket, mmap, fork, ...) */
  GW_ERR_TIMEOUT = 3,          /* a deadline passed (GW_TIMEOUT, bootstrap deadline) */
  GW_ERR_REMOTE = 4,           /* a peer failed, disconnected or sent garbage */
  GW_ERR_INTERNAL = 5,         /* a bug in gradwire: please report it */
  GW_ERR_UNSUPPORTED = 6,      /* not available in this build or on this system */
  GW_ERR_CUDA = 7,             /* a CUDA call failed */
  GW_INPROGRESS = 8,           /* internal: not returned by the API (gw_test says *done = 0) */
  GW_ERR_ABORTED = 9           /* gw_comm_abort was called on the communicator */
} gw_result_t;

typedef enum {
  GW_INT8 = 0,
  GW_UINT8 = 1,
  GW_INT32 = 2,
  GW_INT64 = 3,
  GW_FLOAT16 = 4,
  GW_BFLOAT16 = 5,
  GW_FLOAT32 = 6,
  GW_FLOAT64 = 7,
  GW_NUM_DTYPES = 8
} gw_dtype_t;

/* Integer SUM and PROD wrap around in the type (as unsigned arithmetic does);
 * floating MAX and MIN propagate NaN (a NaN on any rank makes that element NaN
 * everywhere, whatever the algorithm) and order the zeros as IEEE 754-2019's
 * maximum and minimum do (+0 above -0: MAX of -0 and +0 is +0 whatever the
 * ranks' order). */
typedef enum {
  GW_SUM = 0,
  GW_PROD = 1,
  GW_MAX = 2,
  GW_MIN = 3,
  GW_AVG = 4, /* SUM, then one division by the number of ranks (integers: the
               * wrapped sum divided, truncating: int8 100 and 100 average -28).
               * The division goes with the last addition, float16 and bfloat16
               * in float32 there: a sum that overflows the type only in that
               * last addition (2 ranks: the only one) averages to a finite
               * value, one that overflows in an earlier partial sum (3 ranks
               * or more) to inf; gw_bucketer_set_divide_first divides first. */
  GW_NUM_OPS = 5
} gw_op_t;

typedef struct gw_comm *gw_comm_t;
typedef struct gw_request *gw_request_t;

/* ---- communicator lifecycle ---------------------------------------------- */

/* Rank, world size and master address from the environment: GW_RANK /
 * GW_WORLD_SIZE / GW_LOCAL_RANK / GW_MASTER_ADDR / GW_MASTER_PORT, else the
 * names torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
 * Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
 * OMPI_COMM_WORLD_LOCAL_RANK), MPICH / Intel MPI (PMI_RANK, PMI_SIZE,
 * MPI_LOCALRANKID) or Slurm in a task of a step srun started (SLURM_PROCID,
 * SLURM_STEP_NUM_TASKS or SLURM_NTASKS, SLURM_LOCALID; not a batch script's
 * or an salloc shell's own) set.  Under srun with no master set, rank 0's
 * host is the step's first node (SLURM_STEP_NODELIST) and the port one
 * derived from the job and step ids. */
gw_result_t gw_comm_init_env(gw_comm_t *comm);
/* Whether the environment holds a rank gw_comm_init_env would take (1), or
 * the program was started alone (0): a plain shell, or a batch script. */
int gw_env_launched(void);

/* master_host_port: "host:port" where rank 0 serves the rendezvous; nranks
 * at most 2^20. */
gw_result_t gw_comm_init(gw_comm_t *comm, int nranks, int rank, const char *master_host_port);

/* Frees everything the communicator holds; accepts NULL.  Only once every
 * call on it has returned (on every thread: after gw_comm_abort they return
 * promptly), after its bucketers (they use it) and once every request of its
 * non-blocking calls was waited for: while a call on it runs on another
 * thread, a bucketer uses it or a request is out, it is refused
 * (GW_ERR_INVALID_ARGUMENT, named in gw_comm_last_error) and the communicator
 * is left as it was; so is a second destroy racing one under way (its
 * message in gw_comm_last_error(NULL): the communicator may be gone by the
 * time it returns).  An accessor running on another thread (gw_comm_last_error,
 * gw_comm_get_async_error, gw_comm_rank, ...: a watchdog's) does not refuse
 * it: destroy waits for the accessor to return, and one that starts after
 * destroy went ahead is refused (its message in gw_comm_last_error(NULL)).
 * The handle is invalid afterwards: calls on it are refused as "not a live
 * communicator" (gw_comm_abort: GW_ERR_INVALID_ARGUMENT) until a later
 * gw_comm_init reuses its memory, as file descriptors are reused; from then
 * on the old handle names the new communicator, so drop it.  Stream-ordered
 * operations nobody waits for run first.  A child forked without exec
 * cannot use its parent's communicators or their bucketers: every call on
 * them, destroy included, is refused there, and nothing the child does
 * reaches the parent's peers. */
gw_result_t gw_comm_destroy(gw_comm_t comm);

/* From any thread, and from a signal handler (async-signal-safe: it sets a
 * flag): every operation of comm that is waiting, and every later one, fails
 * with GW_ERR_ABORTED, or with the error the communicator had already failed
 * with (peers are told, as for any failure).  Destroy the communicator once
 * its calls have returned; a new one can be made.  On a communicator being
 * destroyed or destroyed it returns GW_ERR_INVALID_ARGUMENT (a destroy under
 * way may still tell the peers; a destroyed one's handle leaves alone the
 * communicator a later gw_comm_init is making in its memory, which waits out
 * an abort begun earlier; once that init has returned, the handle names the
 * new communicator: drop stale handles), and so it does in a child forked
 * without exec on its parent's communicators. */
gw_result_t gw_comm_abort(gw_comm_t comm);

gw_result_t gw_comm_rank(gw_comm_t comm, int *rank);
gw_result_t gw_comm_size(gw_comm_t comm, int *size);
/* This rank's index among the ranks on its machine (found at the rendezvous from
 * host name and boot id, so it is right whatever the launcher set). */
gw_result_t gw_comm_local_rank(gw_comm_t comm, int *local_rank);
/* The number of ranks on this rank's machine, found the same way. */
gw_result_t gw_comm_local_size(gw_comm_t comm, int *local_size);

/* The device this rank is bound to (-1: none).  gw_comm_init binds it, on the
 * calling thread: GW_DEVICE if set (an ordinal, or "none"), else the device the
 * thread already uses (cudaSetDevice before init), else the local rank modulo
 * the number of devices.  Several ranks may share a device. */
gw_result_t gw_comm_device(gw_comm_t comm, int *device);

/* Registers [buf, buf + bytes) with the network devices (ncclCommRegister's
 * role): over ib, chunks of collectives whose data lies in a registered range
 * are written to the peer straight from it instead of being copied into staging
 * memory first.  Registrations are cached per process: a range inside one
 * already registered (by any communicator) takes a reference on it instead of
 * registering again.  Keep the memory mapped until gw_comm_deregister.  Without
 * an ib port it does nothing and succeeds.  *handle is for gw_comm_deregister. */
gw_result_t gw_comm_register(gw_comm_t comm, void *buf, size_t bytes, void **handle);
/* Drops a registration from gw_comm_register; accepts a NULL handle.  comm may
 * be NULL, or another communicator than the one it was made through
 * (registrations are the process's: one may outlive its communicator).  A
 * handle that is no live registration (dropped already) is refused, not
 * freed again. */
gw_result_t gw_comm_deregister(gw_comm_t comm, void *handle);

/* Per-communicator deadline for every blocking wait, in seconds (default
 * GW_TIMEOUT, 300 s).  0 or negative means wait forever.  Any thread may call
 * it at any time; a wait already under way keeps the limit it started with. */
gw_result_t gw_comm_set_timeout(gw_comm_t comm, double seconds);
/* Forces the algorithm ("auto", "ring", "tree", "exchange") and protocol ("auto",
 * "simple", "ll") of later operations, as GW_ALGO / GW_PROTO do at init.  Every
 * rank must make the same call at the same point between operations.  "tree"
 * needs a communicator made with GW_ALGO auto or tree, "exchange" one of 2
 * ranks or made with GW_ALGO auto or exchange, "ll" one whose connections are
 * all shared memory (GW_ERR_UNSUPPORTED otherwise). */
gw_result_t gw_comm_set_algo(gw_comm_t comm, const char *algo, const char *proto);

/* The path of the latest collective this communicator ran (barriers aside),
 * for reports such as gw-perf's: "ring/simple", "tree/ll", "exchange/simple",
 * or "ring/device" for device buffers on the device ring ("ring/device-async"
 * where it is stream-ordered, GW_DEV_ASYNC; device buffers
 * staged through host memory show their last piece's host path); "none"
 * before the first.  With several threads calling, it is one of theirs. */
gw_result_t gw_comm_last_path(gw_comm_t comm, char *buf, size_t len);

/* One measured allreduce time for gw_tune_write (gw-perf --tune). */
struct gw_tune_sample {
  const char *algo, *proto; /* as for gw_comm_set_algo */
  size_t bytes;
  double time_us;
};
/* Fits the cost model's latency and bandwidth for every (algorithm, protocol)
 * with at least two samples, measured on nranks ranks, and writes them as rows
 * for that world size into the tuning file (GW_TUNING_FILE) with `note` in its
 * comment, keeping the rows an existing file has for other world sizes (so one
 * file can hold tables fitted at 2, 4, 8 ... ranks); its rows for nranks, of
 * any transport, are replaced.  Errors are in gw_comm_last_error(NULL). */
gw_result_t gw_tune_write(const char *path, int nranks, const struct gw_tune_sample *samples, int nsamples,
                          const char *note);
/* gw_tune_write for samples measured on comm: its world size, and the depth
 * of its trees where they are hierarchical (ranks on several machines: a chain
 * inside each), which a fit by world size alone takes for log2(nranks) levels
 * (the tree's per-step latency then came out too high by their ratio); the
 * rows are tagged with the transport comm's ring crosses at worst (shm, ib or
 * tcp), and replace the file's rows for that world size and transport (and
 * its rows for that world size that name no transport), keeping the others'.
 * Any rank may call it; gw-perf --tune calls it on rank 0. */
gw_result_t gw_tune_write_comm(gw_comm_t comm, const char *path, const struct gw_tune_sample *samples, int nsamples,
                               const char *note);

const char *gw_strerror(gw_result_t result);

/* The detailed message of the last failure on comm; with comm == NULL, of the
 * last failure of this thread that had no communicator (e.g. gw_comm_init).
 * A copy made under the communicator's lock (the progress thread may be
 * writing a newer one): valid until this thread calls it again. */
const char *gw_comm_last_error(gw_comm_t comm);

/* Records msg as the reason this process is failing, for its launcher: under
 * gw-run (which sets GW_ERROR_FILE for each rank) a failed job names the rank
 * the failure began at when the rank it saw fail first only failed of it
 * (the one at fault often exits after the peers it told, which fail at
 * once).  own: 1 for a reason of this process's own (bad input, a failed
 * file), 0 when it gives up because another rank failed (it heard so other
 * than from this library).  Call it before the program aborts its
 * communicators or exits: only the process's first failure is recorded, and
 * the library records a communicator's first failure itself (a timeout, a
 * mismatch, the program's gw_comm_abort once it takes effect, at the next
 * call or the destroy: as its own; another rank's failure notice or a peer
 * gone: not), so a call after one of those does nothing.  GW_ERROR_FILE is
 * read once, at the first gw_comm_init or gw_record_failure; the record is
 * one line (docs/architecture.md, "Where a failure began") in a file that
 * must not exist yet: another launcher gives each rank a fresh path, as
 * gw-run does (an existing file is left as it is).  Thread-safe; without
 * GW_ERROR_FILE it does nothing. */
void gw_record_failure(const char *msg, int own);

/* The failure of an operation that ran asynchronously (stream-ordered calls
 * report nothing when they return): GW_SUCCESS, or the code of the first
 * failure; the message is gw_comm_last_error's.  A failed stream-ordered
 * operation still releases its stream, with its output undefined: check this
 * after synchronizing the stream (ncclCommGetAsyncError's role). */
gw_result_t gw_comm_get_async_error(gw_comm_t comm, gw_result_t *async_error);

/* ---- collectives ---------------------------------------------------------- */
/* stream: NULL with host buffers: the call blocks until done.  A CUDA stream
 * (cudaStream_t): the operation runs after everything enqueued on the stream
 * before it, later work on the stream waits for its result, and the call
 * returns at once (errors of the run: gw_comm_get_async_error; with the gw_i...
 * forms also gw_wait).  Device buffers with a NULL stream: ordered on the
 * default stream, and the call blocks until done.  sendbuf and recvbuf must
 * both be host or both device memory of the communicator's device, each at an
 * address that is a multiple of the dtype's size (as C's pointers to it: a
 * float at an odd address is refused).  A stream-ordered call on a communicator
 * that already failed is refused with the first error.  In place when
 * sendbuf == recvbuf (allgather: sendbuf == recvbuf + rank * sendcount elements;
 * reduce-scatter: recvbuf == sendbuf + rank * recvcount elements; equal
 * pointers there are in place on rank 0 only, elsewhere an overlap, refused).
 * Every rank must make the same calls in the same order.  As with NCCL, one
 * thread drives a communicator at a time: calls from several threads at once
 * run one after another, but in an order the ranks need not agree on.  A call
 * refused for its arguments (GW_ERR_INVALID_ARGUMENT, GW_ERR_UNSUPPORTED:
 * nothing ran) is not seen by the other ranks, which wait for it until
 * GW_TIMEOUT: make the call right, or gw_comm_abort. */

gw_result_t gw_allreduce(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype,
                         gw_op_t op, gw_comm_t comm, void *stream);
gw_result_t gw_broadcast(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype,
                         int root, gw_comm_t comm, void *stream);
/* recvbuf holds nranks * sendcount elements, rank r's contribution at r * sendcount. */
gw_result_t gw_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                         gw_dtype_t dtype, gw_comm_t comm, void *stream);
/* sendbuf holds nranks * recvcount elements; rank r receives block r, reduced. */
gw_result_t gw_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                              gw_dtype_t dtype, gw_op_t op, gw_comm_t comm, void *stream);
gw_result_t gw_barrier(gw_comm_t comm);

/* Non-blocking forms: the operation runs on the communicator's progress thread in
 * call order; the buffers must stay untouched until gw_wait / gw_test says done. */
gw_result_t gw_iallreduce(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype,
                          gw_op_t op, gw_comm_t comm, void *stream, gw_request_t *req);
gw_result_t gw_ibroadcast(const void *sendbuf, void *recvbuf, size_t count, gw_dtype_t dtype,
                          int root, gw_comm_t comm, void *stream, gw_request_t *req);
gw_result_t gw_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                          gw_dtype_t dtype, gw_comm_t comm, void *stream, gw_request_t *req);
gw_result_t gw_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                               gw_dtype_t dtype, gw_op_t op, gw_comm_t comm, void *stream,
                               gw_request_t *req);
gw_result_t gw_ibarrier(gw_comm_t comm, gw_request_t *req);

/* Waits for *req, frees it and sets *req = NULL; returns the operation's result.
 * A NULL *req returns GW_SUCCESS at once.  Every request is waited for (or
 * tested done) before gw_comm_destroy (which refuses while one is out).  One
 * thread at a time per request: a request completed already (through a copy
 * of the handle) or in gw_wait / gw_test on another thread is refused with
 * GW_ERR_INVALID_ARGUMENT (message in gw_comm_last_error(NULL)); a handle
 * never names a later request (it is a number, not an address). */
gw_result_t gw_wait(gw_request_t *req);
/* Sets *done.  When done, frees *req, sets it to NULL and returns the operation's
 * result; otherwise returns GW_SUCCESS and leaves *req alone. */
gw_result_t gw_test(gw_request_t *req, int *done);

/* ---- gradient buckets (DDP-style overlap of allreduce with backward) ---------
 * A bucketer owns nothing but bookkeeping over the caller's contiguous gradient
 * buffer: buckets are consecutive ranges [bounds[i], bounds[i+1]) of it.  During
 * backward the caller marks ranges ready (in any order, each element once per
 * step); as soon as bucket 0..k are all complete, their in-place allreduces are
 * started in bucket order, so every rank issues the same sequence whatever order
 * its gradients finished in.  gw_bucketer_wait() waits for all of them and makes
 * the bucketer ready for the next step.  Host or device buffers (device:
 * give the allreduces a stream with gw_bucketer_set_stream).  Several
 * bucketers (and calls of the caller's own) may share a communicator when
 * their allreduces start in the same order on every rank; where that order
 * differs, the calls fail on every rank naming both (each bucketer's
 * allreduces carry its number and the bucket's), never summing one
 * bucketer's gradients with another's.  A bucketer's number is the lowest
 * from 1 that no live bucketer of the communicator holds on any rank (a
 * destroyed one's is taken again, as file descriptors are); at most 16383
 * bucketers of one communicator live at once. */
typedef struct gw_bucketer *gw_bucketer_t;

/* Bucket boundaries in the style of PyTorch DDP: the first bucket first_bytes,
 * the others bucket_bytes (both rounded up to whole elements, at least one), the
 * last one whatever remains.  Writes nbuckets + 1 bounds (bounds[0] = 0,
 * bounds[nbuckets] = count) into bounds[0..max_bounds) and returns nbuckets, or
 * -1 if max_bounds is too small or an argument is zero. */
int gw_bucket_bounds(size_t count, size_t elem_size, size_t first_bytes, size_t bucket_bytes, size_t *bounds,
                     int max_bounds);

/* op is applied by every allreduce (GW_AVG averages gradients across ranks).
 * Collective: every rank of comm calls it, with the same count, dtype, op and
 * bounds (buckets pair up across ranks by their order; layouts that differ but
 * whose sizes happen to line up would sum unrelated gradients).  It compares
 * the layouts (rank 0's broadcast, one small allreduce) and refuses, on every
 * rank, naming a rank whose layout differs and how.  buf is host memory or the
 * communicator's device's, the same kind on every rank, checked here (as a
 * stream given to the setters below is) rather than at the first bucket's
 * allreduce, which would fail the communicator. */
gw_result_t gw_bucketer_create(gw_comm_t comm, void *buf, size_t count, gw_dtype_t dtype, gw_op_t op,
                               const size_t *bounds, int nbuckets, gw_bucketer_t *out);
/* Marks buf[offset, offset + count) ready; starts every allreduce that became
 * startable.  Marking an element twice in one step, or outside the buffer, is
 * GW_ERR_INVALID_ARGUMENT.  Marks may come from several threads (they are
 * serialized).  When a bucket cannot start, this and every later mark of the
 * step return that error, and gw_bucketer_wait reports it.  Once the
 * communicator has failed (a bucket's allreduce, a peer's notice, an abort)
 * every mark returns its failure at once (it returned success until the
 * mark that completed a bucket, or the wait). */
gw_result_t gw_bucketer_ready(gw_bucketer_t b, size_t offset, size_t count);
/* Waits for every bucket's allreduce and resets for the next step.  A step is
 * all or nothing: when some bucket was never completely marked (or could not
 * start), wait fails naming it and the step's first refused mark (or the
 * reason it could not start) without waiting forever, and the communicator
 * fails with it, its peers told at once: they may be waiting in that bucket's
 * allreduce, or would pair it with this rank's next step.  A wait with nothing
 * marked is such a step too; destroying a bucketer part way through a step
 * (something marked, or a mark refused) does the same.  A complete step in
 * which a range was marked twice (refused: likely written twice, maybe during
 * its allreduce) fails too, naming the range, but its buckets were reduced on
 * every rank and the communicator goes on.  After a failed wait the buffer's
 * contents are unspecified. */
gw_result_t gw_bucketer_wait(gw_bucketer_t b);
/* The format buckets travel in: the buffer's own dtype (the default), or for
 * a float32 buffer GW_BFLOAT16 or GW_FLOAT16: each bucket travels rounded to
 * 16 bits (half the bytes on the wire), every reduction step of the
 * allreduce computes in float32 and rounds once, and the result, widened
 * back, is in the float32 buffer by gw_bucketer_wait (the same on every
 * rank; written during the allreduce, as a float32 bucket's result is).
 * Host gradients are converted by the allreduce itself, on the
 * communicator's progress and channel threads (the ring's steps read float32
 * and write 16 bits), not by the thread that marks them: as with float32
 * buckets, a marked range must not be written before gw_bucketer_wait.  Every
 * rank must choose the same; only between steps.  Device gradients are
 * converted on the device, on the bucketer's stream (set_stream or
 * set_compute_stream: required), into a device buffer of half the size, and
 * back before gw_bucketer_wait's ordering of the compute stream. */
gw_result_t gw_bucketer_set_wire(gw_bucketer_t b, gw_dtype_t wire);
/* With GW_AVG and a 16-bit wire: on (nonzero), each rank's gradients are
 * divided by the number of ranks on the way into the wire and the buckets
 * summed (NCCL's floating average), instead of summed and divided once at the
 * end.  The float16 partial sums then stay in range whenever the mean does
 * (n ranks' gradients that fit could sum past 65504), for log2(n) bits lost
 * at the small end: meant for loss-scaled gradients, whose scale can then be
 * n times larger.  Off by default; no effect without a 16-bit wire or
 * GW_AVG.  Every rank must choose the same (a step with ranks that differ
 * fails on every rank naming this setting); only between steps. */
gw_result_t gw_bucketer_set_divide_first(gw_bucketer_t b, int on);
/* The stream every bucket's allreduce is ordered on (NULL, the default: host
 * buffers and no stream).  With device gradients, make it a communication
 * stream that waits (cudaStreamWaitEvent) for the kernels that wrote each
 * bucket's gradients before marking them ready; gw_bucketer_wait then returns
 * once every allreduce ran, and later work on the stream sees the results.
 * With a 16-bit device wire (gw_bucketer_set_wire) the conversion back to
 * float32 is still queued on this stream when wait returns: synchronize it
 * before the host reads the gradients.  Only between steps; a stream is
 * GW_ERR_UNSUPPORTED without a device layer and GW_ERR_INVALID_ARGUMENT on a
 * communicator bound to no device (GW_DEVICE=none). */
gw_result_t gw_bucketer_set_stream(gw_bucketer_t b, void *stream);
/* The stream the gradients are written on (backward's), so that the bucketer
 * orders the two streams itself, on the device, as DDP does: when a bucket
 * starts, an event recorded on `compute` makes the allreduce's stream (the one
 * given to gw_bucketer_set_stream, which must not be this one, or when none was,
 * a stream the bucketer makes and owns) wait for the work that
 * wrote it, so ready ranges may be marked as soon as their kernels are queued;
 * gw_bucketer_wait makes `compute` wait for the last allreduce, so the
 * optimizer queued on it after reads the results.  Neither backward nor the
 * calling thread waits for communication in between; gw_bucketer_wait itself
 * returns once every allreduce has finished (the host waits for them before
 * it orders `compute` after them).  NULL turns it off.
 * Only between steps; GW_ERR_UNSUPPORTED without a device layer,
 * GW_ERR_INVALID_ARGUMENT on a communicator bound to no device. */
gw_result_t gw_bucketer_set_compute_stream(gw_bucketer_t b, void *compute);
/* Timing of the last completed step, in seconds on the monotonic clock: when the
 * first allreduce started, when the last bucket became ready, and when wait()
 * returned. */
struct gw_bucketer_times {
  double first_start, last_ready, done;
};
gw_result_t gw_bucketer_times(gw_bucketer_t b, struct gw_bucketer_times *t);
/* Waits for what is in flight; a complete step not waited for is finished
 * as gw_bucketer_wait would (16-bit wire converted back, compute stream
 * ordered after it), and the compute stream is ordered after a step left part
 * way too; accepts NULL.  Exclusive, as gw_comm_destroy is not: no call on
 * the bucketer may run or be about to start on another thread (a mark or wait
 * blocked on the bucketer's lock would wake up in freed memory).  Calls on
 * it afterwards (a second destroy too) are refused with
 * GW_ERR_INVALID_ARGUMENT, the message in gw_comm_last_error(NULL), as is
 * a communicator given as a bucketer.  Its memory is kept back for the next
 * 64 destroys; after that, as a communicator's, it may go to a new bucketer,
 * which the old handle then names: drop it. */
void gw_bucketer_destroy(gw_bucketer_t b);

/* ---- helpers -------------------------------------------------------------- */
size_t gw_dtype_size(gw_dtype_t dtype);          /* 0 for an unknown dtype */
const char *gw_dtype_name(gw_dtype_t dtype);     /* "float32", ...; "?" if unknown */
const char *gw_op_name(gw_op_t op);              /* "sum", ...; "?" if unknown */
/* Parses "float32"/"float"/"fp32"/"half"/... and "sum"/"prod"/...; -1 if unknown. */
int gw_dtype_from_name(const char *name);
int gw_op_from_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* GRADWIRE_H */
