/*
 * nccl.h -- tutti's NCCL-compatible C API.
 *
 * Contract
 * --------
 * This header is source- and binary-compatible with NCCL 2.28.9: every type,
 * enumerator value, struct layout, macro value and function signature matches,
 * so a program built against NVIDIA's header runs on tutti unchanged (via
 * LD_PRELOAD of libtutti.so or tutti's libnccl.so.2 on the library path) and a
 * program built against this header runs on NVIDIA's library.
 *
 * Struct tags and typedef forms are kept as well (e.g. `struct ncclComm`,
 * `struct ncclConfig_v22800`, unnamed enums given a typedef name): C++ name
 * mangling of user functions taking these types depends on them.
 *
 * The header is plain C99 and C++. It does not include any CUDA header unless
 * asked: `cudaStream_t` is declared as the opaque pointer type the CUDA runtime
 * uses (`struct CUstream_st*`). If <cuda_runtime.h> was included before this
 * header, or TUTTI_USE_CUDA_RUNTIME is defined, the runtime's own definition is
 * used instead. In C (before C11) include the CUDA runtime first if you need
 * both, since C99 forbids repeating a typedef.
 *
 * Streams. With a device backend the stream argument orders work exactly as in
 * NCCL. With host memory a NULL stream makes the call complete before it
 * returns (see docs/api.md, "Host memory").
 *
 * Errors. Every function returns an ncclResult_t; ncclGetLastError() gives a
 * readable reason for the last failure on the calling thread (or communicator).
 * Functions tutti does not implement yet return ncclInvalidUsage with a
 * "not supported by tutti yet" message (docs/api.md lists them).
 */
#ifndef NCCL_H_
#define NCCL_H_

/* Defined only by tutti's header: tells code (and tutti's tests) which nccl.h
 * the include path resolved to. */
#define TUTTI_NCCL_H 1

#include <limits.h>
#include <stddef.h>

/* ---- CUDA stream type ---------------------------------------------------- */
#if defined(TUTTI_USE_CUDA_RUNTIME) && !defined(__CUDA_RUNTIME_H__) && !defined(CUDART_VERSION)
#include <cuda_runtime.h>
#endif
#if !defined(__CUDA_RUNTIME_H__) && !defined(CUDART_VERSION) && !defined(__DRIVER_TYPES_H__) && \
    !defined(TUTTI_CUDA_STREAM_T_DEFINED)
#define TUTTI_CUDA_STREAM_T_DEFINED 1
/* Same type as the CUDA runtime's: an opaque pointer, NULL is the default stream. */
typedef struct CUstream_st* cudaStream_t;
#endif

/* ---- Version ------------------------------------------------------------- */
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

/* The version code of the NCCL API this header describes (2.28.9). */
#define NCCL_VERSION_CODE 22809
/* Version code of X.Y.Z. Releases up to 2.8 used X*1000+Y*100+Z; later ones
 * use X*10000+Y*100+Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

/* Deprecation marker, for compilers that understand it. */
#if defined(__GNUC__) || defined(__clang__)
#define TUTTI_NCCL_DEPRECATED_(msg) __attribute__((deprecated(msg)))
#else
#define TUTTI_NCCL_DEPRECATED_(msg)
#endif

/* ---- Handles ------------------------------------------------------------- */
/* A communicator. Created by ncclCommInitRank* / ncclCommSplit / ncclCommShrink,
 * released by ncclCommDestroy or ncclCommAbort. */
typedef struct ncclComm* ncclComm_t;
/* A registered memory window (ncclCommWindowRegister). */
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* The rendezvous token every rank of a new communicator must share: 128 opaque
 * bytes, produced by ncclGetUniqueId on one rank and copied to the others by
 * any means (pipe, MPI broadcast, file, ...). */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ---- Result codes -------------------------------------------------------- */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1, /* an accelerator runtime call failed */
  ncclSystemError = 2,        /* a system call or allocation failed */
  ncclInternalError = 3,      /* a bug inside the library */
  ncclInvalidArgument = 4,    /* a bad value was passed */
  ncclInvalidUsage = 5,       /* a call that is not allowed here, or not supported */
  ncclRemoteError = 6,        /* a peer failed or went away */
  ncclInProgress = 7,         /* non-blocking communicator: not finished yet */
  ncclNumResults = 8
} ncclResult_t;

/* ---- Configuration constants --------------------------------------------- */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* ncclCommWindowRegister winFlags */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink shrinkFlags */
#define NCCL_SHRINK_DEFAULT 0x00 /* the parent stays usable while shrinking */
#define NCCL_SHRINK_ABORT 0x01   /* abort the parent's pending work first */

/* ncclCommRevoke revokeFlags (only 0 is valid) */
#define NCCL_REVOKE_DEFAULT 0x00

/* Per-communicator options. Always start from NCCL_CONFIG_INITIALIZER and then
 * set the fields you care about; fields left at NCCL_CONFIG_UNDEF_* take the
 * library default (or the NCCL_* environment variable). `size`, `magic` and
 * `version` identify the struct revision and must not be changed by hand.
 * tutti reads blocking, splitShare, commName and netName; the CTA/NVLS/NVLink
 * tuning fields are accepted and ignored on backends they mean nothing to. */
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking; /* 0: calls may return ncclInProgress */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

/* clang-format off */
#define NCCL_CONFIG_INITIALIZER {                                                 \
  sizeof(ncclConfig_t),                                /* size                 */ \
  0xcafebeef,                                          /* magic                */ \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),    /* version              */ \
  NCCL_CONFIG_UNDEF_INT,                               /* blocking             */ \
  NCCL_CONFIG_UNDEF_INT,                               /* cgaClusterSize       */ \
  NCCL_CONFIG_UNDEF_INT,                               /* minCTAs              */ \
  NCCL_CONFIG_UNDEF_INT,                               /* maxCTAs              */ \
  NCCL_CONFIG_UNDEF_PTR,                               /* netName              */ \
  NCCL_CONFIG_UNDEF_INT,                               /* splitShare           */ \
  NCCL_CONFIG_UNDEF_INT,                               /* trafficClass         */ \
  NCCL_CONFIG_UNDEF_PTR,                               /* commName             */ \
  NCCL_CONFIG_UNDEF_INT,                               /* collnetEnable        */ \
  NCCL_CONFIG_UNDEF_INT,                               /* CTAPolicy            */ \
  NCCL_CONFIG_UNDEF_INT,                               /* shrinkShare          */ \
  NCCL_CONFIG_UNDEF_INT,                               /* nvlsCTAs             */ \
  NCCL_CONFIG_UNDEF_INT,                               /* nChannelsPerNetPeer  */ \
  NCCL_CONFIG_UNDEF_INT                                /* nvlinkCentricSched   */ \
}
/* clang-format on */

/* Output of ncclGroupSimulateEnd. Start from NCCL_SIM_INFO_INITIALIZER. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime; /* predicted time of the group, microseconds */
} ncclSimInfo_t;

/* clang-format off */
#define NCCL_SIM_INFO_INITIALIZER {                                               \
  sizeof(ncclSimInfo_t),                               /* size                 */ \
  0x74685283,                                          /* magic                */ \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),    /* version              */ \
  NCCL_UNDEF_FLOAT                                     /* estimatedTime        */ \
}
/* clang-format on */

/* ---- Reduction operators ------------------------------------------------- */
/* ncclRedOp_t must stay exactly as wide as a plain enum of the compiler in use
 * (4 bytes normally, 1 with -fshort-enums) while still leaving room for the
 * dynamic operators ncclRedOpCreatePreMulSum hands out (>= ncclNumOps). A
 * one-value helper enum measures that width, and ncclMaxRedOp is the largest
 * positive signed value that fits in it, so the bound never widens the type. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5, /* count of built-in operators; first dynamic operator value */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* ---- Element types ------------------------------------------------------- */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Where the scalar of ncclRedOpCreatePreMulSum lives. */
typedef enum {
  /* Device-visible memory, read when the collective runs (may change between
   * enqueue and execution). */
  ncclScalarDevice = 0,
  /* Host memory, read once before ncclRedOpCreatePreMulSum returns. */
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* ---- Memory -------------------------------------------------------------- */
/* Allocates memory suited to registration and zero-copy transfer on the current
 * device (host memory with the CPU backend); may round size up. */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);
/* Frees memory from ncclMemAlloc. */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* ---- Library information ------------------------------------------------- */
/* Stores the NCCL API version code the library implements (NCCL_VERSION_CODE of
 * this header for tutti). tutti's own version: tuttiGetVersion (tutti/tutti.h). */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/* Creates a new rendezvous id. Call on one rank and share the bytes with all
 * the others before they call ncclCommInitRank*. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/* ---- Communicator life cycle --------------------------------------------- */
/* Joins rank `rank` of `nranks` to the communicator named by commId, with
 * options (config may be NULL). Blocks until all ranks arrived unless
 * config->blocking == 0, in which case it may return ncclInProgress and
 * ncclCommGetAsyncError reports completion. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);

/* ncclCommInitRankConfig with default options. Collective over all nranks
 * ranks: call it from one thread or process per rank, or inside a group. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/* Creates ndev communicators in the calling process, one per device of devlist
 * (NULL: devices 0..ndev-1). comm must hold ndev handles. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/* Completes all outstanding work of comm and releases what its peers share;
 * afterwards ncclCommDestroy does not block. Non-blocking communicators may
 * return ncclInProgress. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/* Releases the local resources of comm. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/* Stops all pending work of comm and releases it. Safe to call from another
 * thread while comm is blocked. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/* Cancels in-flight work and leaves comm usable only for destroy/split/shrink.
 * revokeFlags must be NCCL_REVOKE_DEFAULT. */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* Partitions comm: ranks passing the same color form one new communicator,
 * ordered by key (ties by old rank). color NCCL_SPLIT_NOCOLOR yields
 * *newcomm == NULL. config NULL: inherit comm's options. Collective over comm. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);

/* Creates a communicator of comm's ranks minus excludeRanksList (ranks renumbered
 * densely in order). shrinkFlags: NCCL_SHRINK_*. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* ncclCommInitRankConfig with nId rendezvous ids (identical list on every
 * rank) to spread the bootstrap load at large scale. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/* ---- Errors and diagnostics ---------------------------------------------- */
/* A static description of a result code (never NULL). */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/* The message of the most recent failure (comm's if given, otherwise the calling
 * thread's); "" when there is none. Valid until the next failing call. */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/* Re-reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE. Not part of the
 * stable NCCL API (NVIDIA marks it deprecated); kept for compatibility. */
TUTTI_NCCL_DEPRECATED_("ncclResetDebugInit is not part of the stable NCCL API")
void ncclResetDebugInit(void);
TUTTI_NCCL_DEPRECATED_("pncclResetDebugInit is not part of the stable NCCL API")
void pncclResetDebugInit(void);

/* Stores comm's asynchronous state: ncclSuccess, ncclInProgress (non-blocking
 * operation pending) or the error that broke it. Never blocks. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

/* ---- Communicator queries ------------------------------------------------ */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

/* The device ordinal comm uses (the backend's numbering; 0 for host memory). */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* ---- Buffer registration ------------------------------------------------- */
/* Registers [buff, buff+size) with comm for zero-copy use; *handle identifies it. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/* Collective: registers a window over buff on every rank (winFlags: NCCL_WIN_*;
 * buff aligned to NCCL_WIN_REQUIRED_ALIGNMENT). */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags);

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ---- Custom reduction operators ------------------------------------------ */
/* Creates an operator computing sum(scalar * x_i) over ranks, usable only with
 * comm and datatype. *scalar has type datatype; residence says when it is read.
 * The returned value is >= ncclNumOps. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

/* Releases op; allowed as soon as the last call using it has returned. */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ---- Collectives ------------------------------------------------------------
 * Every rank of comm makes the same sequence of collective calls with matching
 * count/datatype/op/root. Calls are ordered on `stream`; a call returns once the
 * work is enqueued (host memory + NULL stream: once it is complete). Ranks
 * driven from one thread must use a group. Counts are in elements.
 */

/* Reduces count elements of every rank's sendbuff into root's recvbuff
 * (recvbuff ignored elsewhere). In place when sendbuff == recvbuff. */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream);

/* In-place broadcast of root's buff (older form of ncclBroadcast). */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream);

/* Copies root's sendbuff to every rank's recvbuff. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream);

/* Reduces count elements over all ranks; every rank receives the result. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/* Reduces nranks*recvcount elements; rank i receives block i. In place when
 * recvbuff == sendbuff + rank*recvcount. */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/* Every rank receives all ranks' sendcount elements, rank i's at
 * recvbuff + i*sendcount. In place when sendbuff == recvbuff + rank*sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* Block j of sendbuff (count elements) goes to rank j; block i of recvbuff
 * comes from rank i. */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/* root receives every rank's count elements at recvbuff + i*count. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* Rank i receives block i (count elements) of root's sendbuff. */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* ---- Point to point ---------------------------------------------------------
 * A send to peer matches the receive from this rank with the same count and
 * datatype, in call order. Sends and receives that must progress together
 * (exchanges, rings) belong in one group.
 */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* ---- Groups -----------------------------------------------------------------
 * Calls between ncclGroupStart and the matching ncclGroupEnd (groups nest) are
 * collected and launched together when the outermost group ends: this lets one
 * thread drive several ranks, lets matching sends/receives progress
 * concurrently, and lets small operations be fused. Communicator creation may
 * be grouped too, but not mixed with operations in the same group.
 */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

/* Launches the group. Like a single call, it returns once work is enqueued. */
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/* Ends the group without running it and reports the predicted time in simInfo
 * (initialised with NCCL_SIM_INFO_INITIALIZER). */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
