#include "transports/ncclnet/nccl_net.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "transports/ncclnet/net_abi.h"

namespace tutti::transport::ncclnet {
namespace {

using Clock = std::chrono::steady_clock;

// The tag tutti passes with every message: its streams need only order.
constexpr int kTag = 0x7475;
// v8 sizes are int; NCCL caps a message at 1 GiB (MAX_NET_SIZE) as well.
constexpr size_t kMaxV8Message = size_t{1} << 30;

const char* resultName(NetResult r) {
  switch (r) {
    case kNetSuccess:
      return "ncclSuccess";
    case 1:
      return "ncclUnhandledCudaError";
    case kNetSystemError:
      return "ncclSystemError";
    case kNetInternalError:
      return "ncclInternalError";
    case kNetInvalidArgument:
      return "ncclInvalidArgument";
    case kNetInvalidUsage:
      return "ncclInvalidUsage";
    case kNetRemoteError:
      return "ncclRemoteError";
    case 7:
      return "ncclInProgress";
    default:
      return "an unknown result";
  }
}

// The plugin's log callback: C varargs, formatted here, written to tutti's log.
extern "C" void pluginLog(NetLogLevel level, unsigned long flags, const char* file, int line,
                          const char* format, ...) {
  (void)flags;
  log::Level l = log::Level::kInfo;
  if (level == kNetLogNone) return;
  if (level == kNetLogWarn || level == kNetLogAbort) l = log::Level::kWarn;
  if (level == kNetLogTrace) l = log::Level::kTrace;
  if (!log::enabled(l, log::kNet) || !format) return;
  char buf[1024];
  va_list ap;
  va_start(ap, format);
  vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  if (l == log::Level::kTrace && file)
    log::write(l, log::kNet, fmt::format("net plugin: {} ({}:{})", buf, file, line));
  else
    log::write(l, log::kNet, fmt::format("net plugin: {}", buf));
}

extern "C" NetResult pluginProfile(void** eHandle, int, void*, int64_t, void*) {
  if (eHandle) *eHandle = nullptr;
  return kNetSuccess;
}

struct DeviceInfo {
  std::string name;
  int ptrSupport = 0;
  int maxRecvs = 1;
  int speedMbps = 0;
  size_t maxMessage = kMaxV8Message;
};

// One loaded plugin: the table of its version behind one set of calls.
class Plugin final : public NetTransport {
 public:
  Plugin(std::string path, int version, const void* table)
      : path_(std::move(path)), version_(version) {
    if (version == 8) v8_ = static_cast<const NetV8*>(table);
    if (version == 9) v9_ = static_cast<const NetV9*>(table);
    if (version == 10) v10_ = static_cast<const NetV10*>(table);
    const char* n = v8_ ? v8_->name : v9_ ? v9_->name : v10_->name;
    name_ = n ? n : "unnamed";
  }

  const char* name() const override { return name_.c_str(); }
  bool supportsDeviceMemory() const override {
    return !devices_.empty() && (devices_[0].ptrSupport & (kPtrCuda | kPtrDmaBuf)) != 0;
  }
  Result<std::unique_ptr<NetComm>> connect(const ConnectContext& ctx) override;

  Status init() {
    NetResult r = v8_   ? v8_->init(pluginLog)
                  : v9_ ? v9_->init(pluginLog)
                        : v10_->init(pluginLog, pluginProfile);
    TUTTI_RETURN_IF_ERROR(check(r, "init"));
    int n = 0;
    TUTTI_RETURN_IF_ERROR(check(call([&](auto* t) { return t->devices(&n); }), "devices"));
    if (n <= 0)
      return systemError(fmt::format("{} ('{}') reports no network devices", path_, name_));
    for (int d = 0; d < n; ++d) {
      DeviceInfo info;
      NetResult pr;
      if (v8_) {
        NetPropertiesV8 p{};
        pr = v8_->getProperties(d, &p);
        fill(&info, p.name, p.ptrSupport, p.maxRecvs, p.speed, kMaxV8Message);
      } else {
        NetPropertiesV9 p{};
        pr = v9_ ? v9_->getProperties(d, &p) : v10_->getProperties(d, &p);
        fill(&info, p.name, p.ptrSupport, p.maxRecvs, p.speed, p.maxP2pBytes);
      }
      TUTTI_RETURN_IF_ERROR(check(pr, "getProperties"));
      devices_.push_back(info);
    }
    std::string list;
    for (size_t d = 0; d < devices_.size(); ++d)
      list += fmt::format("{}{} {} ({} Mbit/s{})", d ? ", " : "", d, devices_[d].name,
                          devices_[d].speedMbps,
                          devices_[d].ptrSupport & kPtrCuda ? ", device memory" : "");
    TUTTI_INFO(log::kNet | log::kInit,
               "NET/Plugin: {} loaded from {} (ncclNet_v{}), {} device(s): {}", name_, path_,
               version_, devices_.size(), list);
    return Status::ok();
  }

  Status check(NetResult r, const char* what) const {
    if (r == kNetSuccess) return Status::ok();
    std::string m = fmt::format("net plugin {} ({}): {} returned {} ({})", name_, path_, what,
                                resultName(r), r);
    switch (r) {
      case kNetRemoteError:
        return remoteError(m);
      case kNetInvalidArgument:
        return invalidArgument(m);
      case kNetInvalidUsage:
        return invalidUsage(m);
      case kNetSystemError:
        return systemError(m);
      default:
        return internalError(m);
    }
  }

  // The version-independent calls.
  template <typename F>
  NetResult call(F f) const {
    if (v8_) return f(v8_);
    if (v9_) return f(v9_);
    return f(v10_);
  }
  NetResult connectDev(int dev, void* handle, void** sendComm) const {
    if (v10_) {
      NetCommConfigV10 cfg{kTrafficClassUndef};
      return v10_->connect(dev, &cfg, handle, sendComm, nullptr);
    }
    if (v9_) return v9_->connect(dev, handle, sendComm, nullptr);
    return v8_->connect(dev, handle, sendComm, nullptr);
  }
  NetResult isend(void* comm, void* data, size_t size, void* mh, void** req) const {
    if (v8_) return v8_->isend(comm, data, static_cast<int>(size), kTag, mh, req);
    if (v9_) return v9_->isend(comm, data, size, kTag, mh, req);
    return v10_->isend(comm, data, size, kTag, mh, nullptr, req);
  }
  NetResult irecv(void* comm, void* data, size_t size, void* mh, void** req) const {
    int tag = kTag;
    if (v8_) {
      int s = static_cast<int>(size);
      return v8_->irecv(comm, 1, &data, &s, &tag, &mh, req);
    }
    if (v9_) return v9_->irecv(comm, 1, &data, &size, &tag, &mh, req);
    void* ph = nullptr;
    return v10_->irecv(comm, 1, &data, &size, &tag, &mh, &ph, req);
  }

  const DeviceInfo& device(int d) const { return devices_[d]; }
  int deviceCount() const { return static_cast<int>(devices_.size()); }
  const std::string& path() const { return path_; }

 private:
  static void fill(DeviceInfo* info, const char* name, int ptr, int maxRecvs, int speed,
                   size_t maxMessage) {
    info->name = name ? name : "?";
    info->ptrSupport = ptr;
    info->maxRecvs = std::max(1, maxRecvs);
    info->speedMbps = speed;
    info->maxMessage = std::min(maxMessage ? maxMessage : kMaxV8Message, kMaxV8Message);
  }

  std::string path_;
  int version_;
  std::string name_;
  const NetV8* v8_ = nullptr;
  const NetV9* v9_ = nullptr;
  const NetV10* v10_ = nullptr;
  std::vector<DeviceInfo> devices_;
};

// A connection to one peer: the plugin's send comm (to it) and receive comm
// (from it).
class PluginComm final : public NetComm {
 public:
  PluginComm(const Plugin* p, int dev, void* send, void* recv, std::string peer)
      : p_(p), dev_(dev), send_(send), recv_(recv), peer_(std::move(peer)) {}

  ~PluginComm() override {
    for (auto& r : regions_) {
      if (r->handles[0]) p_->call([&](auto* t) { return t->deregMr(send_, r->handles[0]); });
      if (r->handles[1]) p_->call([&](auto* t) { return t->deregMr(recv_, r->handles[1]); });
    }
    p_->call([&](auto* t) { return t->closeSend(send_); });
    p_->call([&](auto* t) { return t->closeRecv(recv_); });
  }

  Result<const MemRegion*> registerMemory(void* base, size_t bytes, MemKind kind) override {
    if (aborted_) return aborted();
    auto* b = static_cast<uint8_t*>(base);
    for (auto& r : regions_) {
      auto* rb = static_cast<uint8_t*>(r->base);
      if (r->kind == kind && b >= rb && b + bytes <= rb + r->bytes) return r.get();
    }
    const int type = kind == MemKind::kHost ? kPtrHost : kPtrCuda;
    if (!(p_->device(dev_).ptrSupport & type))
      return invalidUsage(fmt::format("net plugin {} device {} cannot take {} memory", p_->name(),
                                      dev_, kind == MemKind::kHost ? "host" : "device"));
    auto r = std::make_unique<MemRegion>();
    r->base = base;
    r->bytes = bytes;
    r->kind = kind;
    TUTTI_RETURN_IF_ERROR(p_->check(
        p_->call([&](auto* t) { return t->regMr(send_, base, bytes, type, &r->handles[0]); }),
        "regMr"));
    Status st = p_->check(
        p_->call([&](auto* t) { return t->regMr(recv_, base, bytes, type, &r->handles[1]); }),
        "regMr");
    if (!st) {  // nothing half-registered stays in the cache
      p_->call([&](auto* t) { return t->deregMr(send_, r->handles[0]); });
      return st;
    }
    regions_.push_back(std::move(r));
    return regions_.back().get();
  }

  Result<NetRequest*> isend(const void* data, size_t bytes, const MemRegion* mr) override {
    if (aborted_) return aborted();
    void* req = nullptr;
    TUTTI_RETURN_IF_ERROR(
        p_->check(p_->isend(send_, const_cast<void*>(data), bytes, mr->handles[0], &req), "isend")
            .withContext(peerContext()));
    return static_cast<NetRequest*>(req);
  }

  Result<NetRequest*> irecv(void* data, size_t capacity, const MemRegion* mr) override {
    if (aborted_) return aborted();
    void* req = nullptr;
    TUTTI_RETURN_IF_ERROR(p_->check(p_->irecv(recv_, data, capacity, mr->handles[1], &req), "irecv")
                              .withContext(peerContext()));
    return static_cast<NetRequest*>(req);
  }

  Result<bool> test(NetRequest* r, size_t* bytes) override {
    if (aborted_) return aborted();
    int done = 0, size = 0;
    TUTTI_RETURN_IF_ERROR(
        p_->check(p_->call([&](auto* t) { return t->test(r, &done, &size); }), "test")
            .withContext(peerContext()));
    if (done && bytes) *bytes = static_cast<size_t>(std::max(size, 0));
    return done != 0;
  }

  size_t maxMessageBytes() const override { return p_->device(dev_).maxMessage; }
  void abort() override { aborted_.store(true); }
  const char* name() const override { return p_->name(); }

 private:
  Status aborted() const { return invalidUsage("communicator aborted"); }
  std::string peerContext() const { return "with " + peer_; }

  const Plugin* p_;
  int dev_;
  void* send_;
  void* recv_;
  std::string peer_;
  std::vector<std::unique_ptr<MemRegion>> regions_;
  std::atomic<bool> aborted_{false};
};

Result<std::unique_ptr<NetComm>> Plugin::connect(const ConnectContext& ctx) {
  const int dev = ctx.channel % deviceCount();
  const std::string peer = fmt::format("rank {}", ctx.peer);
  uint8_t handle[kHandleBytes] = {};
  void* listenComm = nullptr;
  TUTTI_RETURN_IF_ERROR(
      check(call([&](auto* t) { return t->listen(dev, handle, &listenComm); }), "listen"));
  struct CloseListen {
    const Plugin* p;
    void* lc;
    ~CloseListen() {
      if (lc) p->call([&](auto* t) { return t->closeListen(lc); });
    }
  } closeListen{this, listenComm};
  // Each side publishes its listen handle; each connects to the other's.
  const uint64_t tag = ctx.tagBase + 1;
  TUTTI_RETURN_IF_ERROR(ctx.control->send(ctx.peer, tag, handle, sizeof handle));
  auto theirs = ctx.control->recvUntil(ctx.peer, tag, ctx.deadline, ctx.abortFlag);
  if (!theirs) return theirs.status().withContext("waiting for the listen handle of " + peer);
  if (theirs->size() != kHandleBytes)
    return internalError(fmt::format("listen handle of {} has {} bytes, not {}", peer,
                                     theirs->size(), kHandleBytes));
  std::vector<uint8_t> peerHandle = std::move(theirs.value());
  void* sendComm = nullptr;
  void* recvComm = nullptr;
  // Connections left half-made by an error or a timeout are closed.
  struct CloseComms {
    const Plugin* p;
    void** s;
    void** r;
    ~CloseComms() {
      if (*s) p->call([&](auto* t) { return t->closeSend(*s); });
      if (*r) p->call([&](auto* t) { return t->closeRecv(*r); });
    }
  } closeComms{this, &sendComm, &recvComm};
  // connect/accept never block: call again until both hand out a comm.
  auto pause = std::chrono::microseconds(1);
  while (!sendComm || !recvComm) {
    if (!sendComm)
      TUTTI_RETURN_IF_ERROR(check(connectDev(dev, peerHandle.data(), &sendComm), "connect")
                                .withContext("connecting to " + peer));
    if (!recvComm)
      TUTTI_RETURN_IF_ERROR(
          check(call([&](auto* t) { return t->accept(listenComm, &recvComm, nullptr); }), "accept")
              .withContext("accepting " + peer));
    if (sendComm && recvComm) break;
    if (ctx.abortFlag && ctx.abortFlag->load()) return invalidUsage("communicator aborted");
    if (Clock::now() > ctx.deadline)
      return remoteError(fmt::format(
          "net plugin {}: no connection with {} before the deadline (TUTTI_INIT_TIMEOUT); {} "
          "is still missing",
          name_, peer,
          !sendComm && !recvComm ? "each direction"
          : !sendComm            ? "ours to it"
                                 : "its to us"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  auto comm =
      std::make_unique<PluginComm>(this, dev, sendComm, recvComm, fmt::format("rank {}", ctx.peer));
  sendComm = recvComm = nullptr;  // the comm owns them now
  return std::unique_ptr<NetComm>(std::move(comm));
}

// What a failed dlopen of each candidate said, joined.
Result<std::string> openLibrary(const std::string& setting, void** lib) {
  std::vector<std::string> candidates;
  if (setting.empty()) {
    candidates.push_back("libnccl-net.so");
  } else {
    if (setting.find('/') == std::string::npos)
      candidates.push_back("libnccl-net-" + setting + ".so");
    candidates.push_back(setting);
  }
  std::string errors;
  for (const auto& c : candidates) {
    dlerror();
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *lib = h;
      return c;
    }
    const char* e = dlerror();
    errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", c, e ? e : "not loadable");
  }
  *lib = nullptr;
  return errors;
}

struct Loaded {
  std::unique_ptr<Plugin> plugin;
  Status error;
};

std::mutex gMu;
std::map<std::string, Loaded>& loadedPlugins() {
  static auto* m = new std::map<std::string, Loaded>;  // never destroyed: plugins stay loaded
  return *m;
}

Result<std::unique_ptr<Plugin>> load(const std::string& setting, const PluginOptions& options) {
  void* lib = nullptr;
  auto opened = openLibrary(setting, &lib);
  if (!lib) {
    if (setting.empty()) return std::unique_ptr<Plugin>();  // no default plugin installed
    return invalidArgument(
        fmt::format("NCCL_NET_PLUGIN={}: cannot load the net plugin ({})", setting, *opened));
  }
  const std::string path = *opened;
  if (auto setOption = reinterpret_cast<TuttiNetSetOption>(dlsym(lib, kTuttiNetSetOptionSymbol))) {
    if (!options.ifname.empty()) {
      NetResult r = setOption("ifname", options.ifname.c_str());
      if (r != kNetSuccess)
        TUTTI_WARN("net plugin {}: option ifname={} refused ({}); it chooses its interfaces itself",
                   path, options.ifname, resultName(r));
    }
  }
  static const std::pair<int, const char*> kSymbols[] = {
      {10, "ncclNetPlugin_v10"}, {9, "ncclNetPlugin_v9"}, {8, "ncclNetPlugin_v8"}};
  for (const auto& [version, sym] : kSymbols) {
    if (const void* table = dlsym(lib, sym)) {
      auto p = std::make_unique<Plugin>(path, version, table);
      Status st = p->init();
      if (!st) return st;
      return p;
    }
  }
  std::string older;
  for (int v = 7; v >= 2 && older.empty(); --v)
    if (dlsym(lib, fmt::format("ncclNetPlugin_v{}", v).c_str()))
      older = fmt::format(" (it exports ncclNetPlugin_v{}, an older ABI)", v);
  dlclose(lib);
  return invalidArgument(fmt::format(
      "net plugin {} exports none of ncclNetPlugin_v10, _v9, _v8{}: tutti loads NCCL net "
      "plugins of ABI v8 or later",
      path, older));
}

}  // namespace

std::string pluginSetting() { return params::getStr("NCCL_NET_PLUGIN", ""); }

Result<NetTransport*> loadPlugin(const std::string& setting, const PluginOptions& options) {
  if (setting == "none") return static_cast<NetTransport*>(nullptr);
  std::lock_guard<std::mutex> lk(gMu);
  auto& m = loadedPlugins();
  auto it = m.find(setting);
  if (it == m.end()) {
    Loaded l;
    auto p = load(setting, options);
    if (p)
      l.plugin = std::move(p.value());
    else
      l.error = p.status();
    it = m.emplace(setting, std::move(l)).first;
  }
  if (!it->second.error) return it->second.error;
  return static_cast<NetTransport*>(it->second.plugin.get());
}

}  // namespace tutti::transport::ncclnet
