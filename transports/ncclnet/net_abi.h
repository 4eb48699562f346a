// The ABI of NCCL's network plugins (ncclNet_v8, v9 and v10), as tutti loads
// them: plain structs and function pointers, laid out as a plugin built
// against NVIDIA's headers expects. Written from the published facts (field
// order, types, constants); names are tutti's own so that this header can sit
// beside tutti's nccl.h in one translation unit. A plugin exports one table
// under the symbol ncclNetPlugin_v<N>; tutti looks for v10, then v9, then v8.
//
// Contract of a table (what NCCL promises plugins, and tutti keeps):
// - init() once per process before anything else; devices()/getProperties()
//   describe the NICs; several devices may share one name.
// - listen() fills a handle of at most kHandleBytes that the peer passes to
//   connect(); connect()/accept() never block: a NULL comm means "call again".
// - Comms are one-directional: connect() gives a send comm, accept() a
//   receive comm. Every buffer goes through regMr() before isend/irecv.
// - isend()/irecv() may return a NULL request: nothing was posted, retry
//   later. irecv() takes at most props.maxRecvs buffers at once (often 1).
// - test() drives progress; a request that reports done is freed by the
//   plugin. Messages on one comm arrive in the order they were sent.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::transport::ncclnet {

// ncclResult_t: 0 is success; the rest are NCCL's error codes.
using NetResult = int;
constexpr NetResult kNetSuccess = 0;
constexpr NetResult kNetSystemError = 2;
constexpr NetResult kNetInternalError = 3;
constexpr NetResult kNetInvalidArgument = 4;
constexpr NetResult kNetInvalidUsage = 5;
constexpr NetResult kNetRemoteError = 6;

constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kPtrHost = 0x1;         // NCCL_PTR_HOST
constexpr int kPtrCuda = 0x2;         // NCCL_PTR_CUDA
constexpr int kPtrDmaBuf = 0x4;       // NCCL_PTR_DMABUF
constexpr int kMaxDevsPerNic = 4;     // NCCL_NET_MAX_DEVS_PER_NIC (v9, v10)
constexpr int kTrafficClassUndef = -1;

// ncclDebugLogLevel and the subsystem bit NCCL passes for network messages.
enum NetLogLevel : int {
  kNetLogNone = 0,
  kNetLogVersion = 1,
  kNetLogWarn = 2,
  kNetLogInfo = 3,
  kNetLogAbort = 4,
  kNetLogTrace = 5
};
constexpr unsigned long kNetLogSubsysNet = 16;  // NCCL_NET

extern "C" {
typedef void (*NetLogger)(NetLogLevel level, unsigned long flags, const char* file, int line,
                          const char* fmt, ...);
// v10: the profiler callback (tutti passes one that records nothing).
typedef NetResult (*NetProfilerCallback)(void** eHandle, int type, void* pHandle, int64_t pluginId,
                                         void* extData);
}

// ncclNetDeviceHandle_v7..v10: device offload (tutti never requests it and
// passes NULL; a plugin must then not fill one in).
struct NetDeviceHandle {
  int netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};

struct NetPropertiesV8 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;  // Mbit/s
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
};

struct NetVDeviceProps {
  int ndevs;
  int devs[kMaxDevsPerNic];
};

// v9 and v10 share this layout.
struct NetPropertiesV9 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  NetVDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
using NetPropertiesV10 = NetPropertiesV9;

struct NetCommConfigV10 {
  int trafficClass;
};

struct NetV8 {
  const char* name;
  NetResult (*init)(NetLogger log);
  NetResult (*devices)(int* ndev);
  NetResult (*getProperties)(int dev, NetPropertiesV8* props);
  NetResult (*listen)(int dev, void* handle, void** listenComm);
  NetResult (*connect)(int dev, void* handle, void** sendComm, NetDeviceHandle** sendDevComm);
  NetResult (*accept)(void* listenComm, void** recvComm, NetDeviceHandle** recvDevComm);
  NetResult (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  NetResult (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle);
  NetResult (*deregMr)(void* comm, void* mhandle);
  NetResult (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  NetResult (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                     void** request);
  NetResult (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                      void** request);
  NetResult (*test)(void* request, int* done, int* sizes);
  NetResult (*closeSend)(void* sendComm);
  NetResult (*closeRecv)(void* recvComm);
  NetResult (*closeListen)(void* listenComm);
  NetResult (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  NetResult (*irecvConsumed)(void* recvComm, int n, void* request);
};

// v9: sizes become size_t in isend/irecv (not in iflush/test), and makeVDevice.
struct NetV9 {
  const char* name;
  NetResult (*init)(NetLogger log);
  NetResult (*devices)(int* ndev);
  NetResult (*getProperties)(int dev, NetPropertiesV9* props);
  NetResult (*listen)(int dev, void* handle, void** listenComm);
  NetResult (*connect)(int dev, void* handle, void** sendComm, NetDeviceHandle** sendDevComm);
  NetResult (*accept)(void* listenComm, void** recvComm, NetDeviceHandle** recvDevComm);
  NetResult (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  NetResult (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle);
  NetResult (*deregMr)(void* comm, void* mhandle);
  NetResult (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request);
  NetResult (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request);
  NetResult (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                      void** request);
  NetResult (*test)(void* request, int* done, int* sizes);
  NetResult (*closeSend)(void* sendComm);
  NetResult (*closeRecv)(void* recvComm);
  NetResult (*closeListen)(void* listenComm);
  NetResult (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  NetResult (*irecvConsumed)(void* recvComm, int n, void* request);
  NetResult (*makeVDevice)(int* d, NetVDeviceProps* props);
};

// v10: init takes a profiler callback, connect a comm config, and isend/irecv
// a profiler handle per buffer (tutti passes NULL).
struct NetV10 {
  const char* name;
  NetResult (*init)(NetLogger log, NetProfilerCallback prof);
  NetResult (*devices)(int* ndev);
  NetResult (*getProperties)(int dev, NetPropertiesV10* props);
  NetResult (*listen)(int dev, void* handle, void** listenComm);
  NetResult (*connect)(int dev, NetCommConfigV10* config, void* handle, void** sendComm,
                       NetDeviceHandle** sendDevComm);
  NetResult (*accept)(void* listenComm, void** recvComm, NetDeviceHandle** recvDevComm);
  NetResult (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  NetResult (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle);
  NetResult (*deregMr)(void* comm, void* mhandle);
  NetResult (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                     void** request);
  NetResult (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** phandles, void** request);
  NetResult (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                      void** request);
  NetResult (*test)(void* request, int* done, int* sizes);
  NetResult (*closeSend)(void* sendComm);
  NetResult (*closeRecv)(void* recvComm);
  NetResult (*closeListen)(void* listenComm);
  NetResult (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  NetResult (*irecvConsumed)(void* recvComm, int n, void* request);
  NetResult (*makeVDevice)(int* d, NetVDeviceProps* props);
};

// tutti's extension for its own plugins (lib/tutti/libtutti-net-<name>.so):
// an optional export, called before init() once per option. Options:
// "ifname", the network interfaces to use, in NCCL_SOCKET_IFNAME's syntax
// (loopback when every rank is on one host, as tutti's TCP). A plugin that
// does not know an option returns an error; tutti goes on without it.
extern "C" {
typedef NetResult (*TuttiNetSetOption)(const char* key, const char* value);
}
constexpr const char* kTuttiNetSetOptionSymbol = "tuttiNetSetOption";

// The layouts NVIDIA's headers give on LP64 (x86-64, aarch64).
static_assert(sizeof(NetDeviceHandle) == 32, "ncclNetDeviceHandle layout");
static_assert(sizeof(NetPropertiesV8) == 64, "ncclNetProperties_v8_t layout");
static_assert(sizeof(NetPropertiesV9) == 104, "ncclNetProperties_v9_t layout");
static_assert(sizeof(NetV8) == 19 * sizeof(void*), "ncclNet_v8_t layout");
static_assert(sizeof(NetV9) == 20 * sizeof(void*), "ncclNet_v9_t layout");
static_assert(sizeof(NetV10) == 20 * sizeof(void*), "ncclNet_v10_t layout");

}  // namespace tutti::transport::ncclnet
