/*
 * tutti/tutti.h -- tutti's extensions beyond the NCCL API.
 *
 * Contract
 * --------
 * Plain C (C99) and C++. Everything here is exported by libtutti.so and by
 * tutti's libnccl.so.2 under the `tutti` prefix and never by NVIDIA's
 * library, so `dlsym(RTLD_DEFAULT, "tuttiGetVersion") != NULL` is a reliable
 * way for a program to tell that tutti answers its NCCL calls.
 *
 * The version and library queries are thread-safe and never block; returned
 * strings are owned by the library and live as long as it stays loaded. The
 * compression functions follow the rules of the NCCL calls they resemble
 * (see each).
 *
 * Stability: functions are only ever added. A program that wants to use a newer
 * extension while still running on older tutti releases should look it up with
 * dlsym() rather than link it directly.
 */
#ifndef TUTTI_TUTTI_H_
#define TUTTI_TUTTI_H_

#include "../nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Encodes a tutti release the way tuttiGetVersion reports it, for comparisons:
 *   int v; tuttiGetVersion(&v); if (v >= TUTTI_VERSION(0, 2, 0)) ... */
#define TUTTI_VERSION(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))

/* Stores tutti's own release as major*10000 + minor*100 + patch (0.1.0 ->
 * 100). ncclGetVersion still reports the NCCL API level (22809).
 * Returns ncclInvalidArgument if version is NULL, ncclSuccess otherwise. */
ncclResult_t tuttiGetVersion(int* version);

/* tutti's release as text, e.g. "0.1.0" (may carry a suffix such as
 * "0.2.0-rc1" or a build tag). Never NULL; static storage. */
const char* tuttiGetVersionString(void);

/* Absolute path of the shared object that contains tutti's code in this
 * process (libtutti.so.* or tutti's libnccl.so.2), as found by dladdr(). Useful
 * to confirm which library LD_PRELOAD / LD_LIBRARY_PATH selected and where the
 * plugin directory (<prefix>/lib/tutti) is searched from. Never NULL: "" if the
 * path cannot be determined (e.g. tutti linked statically into the program).
 * Static storage. */
const char* tuttiLibraryPath(void);

/* ---- Device backend (docs/backends.md) -----------------------------------
 *
 * One device backend serves the process: the built-in CPU backend, or a
 * plugin chosen by TUTTI_BACKEND_PLUGIN (cuda, xpu_emu, a vendor's). Buffers
 * from ncclMemAlloc are that backend's device memory, which the host may not
 * be able to touch; these two calls let portable programs (tutti-perf, tests)
 * fill and read such buffers. */

/* The process backend's name ("cpu", "cuda", "xpu_emu", ...), loading it on
 * first use. NULL if it cannot be loaded; ncclGetLastError(NULL) says why.
 * Static storage. */
const char* tuttiBackendName(void);

/* Devices of the process backend: how many (1 on the CPU backend), and the
 * calling thread's current one. The current device is what ncclMemAlloc
 * allocates on and what a communicator created afterwards on this thread is
 * bound to (ncclCommCuDevice), as cudaSetDevice is for NCCL programs; the one
 * rule tutti's launchers follow is device = local rank % device count
 * (docs/backends.md). tuttiSetDevice returns ncclInvalidArgument for a device
 * the backend does not have. */
ncclResult_t tuttiGetDeviceCount(int* count);
ncclResult_t tuttiSetDevice(int device);

/* Copies `bytes` from src to dst, each host memory or memory of the process
 * backend (device or pinned), and returns when the copy has completed. It is
 * ordered after earlier work on the backend's default queue. Overlapping
 * ranges are allowed only on the CPU backend. Returns ncclInvalidArgument
 * for NULL pointers with bytes > 0, the backend's error otherwise. */
ncclResult_t tuttiMemcpy(void* dst, const void* src, size_t bytes);

/* ---- Gradient compression (docs/compression.md) --------------------------
 *
 * A compressor belongs to one communicator and holds the state of compressed
 * all-reduces across calls: error-feedback residuals and PowerSGD's Q
 * matrices, per gradient (named by a caller-chosen key). Every rank of the
 * communicator creates one with the same configuration, calls
 * tuttiAllReduceCompressed for the same keys in the same order, and destroys
 * it before the communicator. One compressor per model: two models must not
 * share one, or their residuals mix.
 *
 * Results: float32 sum or average, approximate (the codecs are lossy), and
 * bit-identical on every rank. Error feedback (on by default for 1-bit and
 * PowerSGD) keeps what a call did not transmit and adds it to the next call
 * with the same key, so over many calls nothing is lost: the sum of the
 * outputs plus the residuals equals the sum of the exact results. PowerSGD
 * keeps one residual per node for large matrices, split by rows among the
 * node's ranks, which read each other's inputs during the call (cross-memory
 * attach; off where the ranks cannot, or with TUTTI_POWERSGD_NODE_FEEDBACK=0):
 * the outputs are the same up to rounding. */

typedef enum {
  tuttiCompressNone = 0,     /* exact all-reduce (for comparisons) */
  tuttiCompressFp16 = 1,     /* binary16 on the wire, scaled by a power of two */
  tuttiCompressBf16 = 2,     /* bfloat16 on the wire */
  tuttiCompressOneBit = 3,   /* signs plus one scale per 512 values */
  tuttiCompressPowerSGD = 4  /* rank-r factors P (rows x r) and Q (cols x r) */
} tuttiCompression_t;

typedef struct {
  size_t size;                 /* sizeof(tuttiCompressionConfig_t): set by the initializer */
  tuttiCompression_t kind;
  int errorFeedback;           /* 1 on, 0 off, -1 default (on for 1-bit/PowerSGD, off else) */
  int powerSgdRank;            /* PowerSGD: r >= 1 (default 4) */
  unsigned long long seed;     /* PowerSGD: seed of the initial Q, equal on every rank */
  float epsilon;               /* PowerSGD: added to column norms when orthogonalising */
  float minCompressionRate;    /* PowerSGD: rows*cols / ((rows+cols)*r) below this: exact */
  int warmStart;               /* PowerSGD: 1 reuses each key's Q from the last call */
  size_t minBytes;             /* smaller all-reduces run exact (default 0) */
} tuttiCompressionConfig_t;

#define TUTTI_COMPRESSION_CONFIG_INITIALIZER \
  { sizeof(tuttiCompressionConfig_t), tuttiCompressNone, -1, 4, 0ull, 1e-8f, 2.0f, 1, 0 }

typedef struct tuttiCompressor* tuttiCompressor_t;

/* Creates a compressor for `comm` (local: no communication). Invalid
 * configurations (unknown kind, r < 1, a size from a newer header than this
 * library knows is accepted; from an older one, its fields are used) return
 * ncclInvalidArgument with the reason in ncclGetLastError. */
ncclResult_t tuttiCompressorCreate(ncclComm_t comm, const tuttiCompressionConfig_t* config,
                                   tuttiCompressor_t* compressor);

/* Frees the compressor and all its state. NULL is accepted. */
ncclResult_t tuttiCompressorDestroy(tuttiCompressor_t compressor);

/* All-reduce of `count` float32 values (datatype must be ncclFloat32; op
 * ncclSum or ncclAvg) through the compressor. `key` names the gradient
 * across calls: its state is created on first use and must keep the same
 * count (and shape). PowerSGD treats the data as a row-major rows x cols
 * matrix (rows * cols == count); other kinds ignore rows and cols. In place
 * when sendbuff == recvbuff. Ordered on `stream` like ncclAllReduce (it
 * starts after earlier work on the stream; later work sees the result) and,
 * like every tutti collective, returns once done, or once queued on a device
 * stream that the engine holds, or with ncclInProgress on a non-blocking
 * communicator (docs/api.md, "When the call returns"). Not allowed inside
 * ncclGroupStart/End. */
ncclResult_t tuttiAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op,
                                      tuttiCompressor_t compressor, unsigned long long key,
                                      size_t rows, size_t cols, cudaStream_t stream);

typedef struct {
  size_t size;                       /* set by the caller: sizeof(tuttiCompressionStats_t) */
  unsigned long long calls;          /* tuttiAllReduceCompressed calls */
  unsigned long long payloadBytes;   /* float32 bytes all-reduced (count * 4 per call) */
  unsigned long long wireBytesSent;  /* bytes this rank put on the wire, headers excluded */
  unsigned long long exactCalls;     /* calls that ran exact (minBytes, PowerSGD fallback) */
} tuttiCompressionStats_t;

/* This rank's counters since the compressor was created. */
ncclResult_t tuttiCompressorGetStats(tuttiCompressor_t compressor,
                                     tuttiCompressionStats_t* stats);

/*
 * Reserved for later extensions (each will be documented in docs/api.md):
 *  - communicator introspection (chosen backend, transports per peer, algorithm
 *    selected for a call), statistics and counters;
 *  - host-memory specific controls (progress-thread placement, inline threshold);
 *  - explicit backend selection and plugin loading.
 * New declarations go below this comment; existing ones never change.
 */

/* Receive from any source (MPI's MPI_ANY_SOURCE): ncclRecv from whichever
 * rank's point-to-point message to this rank comes first, written into
 * *peer once the receive runs (on return, for host memory and a NULL
 * stream; else when the stream has reached it). Messages are still matched
 * in order per pair: the receive takes the first rank whose next
 * send/receive group towards this rank is under way, and consumes exactly
 * one message of `count` elements from it, as ncclRecv(..., *peer, ...)
 * would (a different size is an error naming both). Its own call, never
 * inside a group (ncclInvalidUsage); count > 0 (a zero-length send sends
 * no message); ncclInvalidArgument for a NULL peer. It waits up to
 * TUTTI_TIMEOUT, and ends with an error on ncclCommAbort, on a peer's
 * failure, or when every other rank has destroyed its communicator. */
ncclResult_t tuttiRecvAny(void* recvbuff, size_t count, ncclDataType_t datatype, int* peer,
                          ncclComm_t comm, cudaStream_t stream);

/* Whom the communicator's running operation waits for, as this rank sees it:
 * the ranks it still expects messages from or still sends to, once the
 * operation has made no progress for 100 ms (until then, and when nothing
 * runs, none). Writes up to `capacity` ranks, ascending, into `ranks` and
 * how many there are into *count (which may exceed `capacity`). Callable
 * from any thread while another runs the operation: for a watchdog that
 * names the ranks in its timeout error. ncclInvalidArgument for a NULL or
 * destroyed comm, a NULL count, or a NULL ranks with capacity > 0. */
ncclResult_t tuttiCommWaitingOn(ncclComm_t comm, int* ranks, int capacity, int* count);

/* Stragglers as this rank measured them in its last collective that
 * exchanged messages (docs/api.md, "Stragglers"): one row per peer it
 * received from (kind tuttiStragglerObserved), then the late rank and the
 * slow link its view names, if any, with the operations in a row they held.
 * Collectives on the one-shot and device-IPC paths send no messages and are
 * not measured. */
typedef enum {
  tuttiStragglerObserved = 0, /* rank: this rank; peer: a rank it received from */
  tuttiStragglerLate = 1,     /* rank: the rank that arrives late; peer: -1 */
  tuttiStragglerSlowLink = 2  /* the link from peer to rank */
} tuttiStragglerKind_t;

typedef struct {
  int kind; /* tuttiStragglerKind_t */
  int rank;
  int peer;
  /* observed: how much later than this rank the peer started (ms, negative:
   * earlier); late: by how much (ms) */
  double lateMs;
  /* observed: the rate of the link from this rank to the peer; slow link:
   * its rate while saturated (MB/s, 0: not measured) */
  double mbps;
  double ratio;           /* slow link: how many times slower than the reference */
  unsigned long long ops; /* late and slow link: measured operations in a row */
} tuttiStraggler_t;

/* Writes up to `capacity` rows into `rows` and how many there are into
 * *count (which may exceed `capacity`). Callable from any thread.
 * ncclInvalidArgument for a NULL or destroyed comm, a NULL count, or a NULL
 * rows with capacity > 0. */
ncclResult_t tuttiCommStragglers(ncclComm_t comm, tuttiStraggler_t* rows, int capacity, int* count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TUTTI_TUTTI_H_ */
