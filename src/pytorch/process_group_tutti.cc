// tutti_torch: tutti as a torch.distributed process-group backend.
//
// Contract
// - One ProcessGroupTutti owns one tutti communicator (rank 0 creates the
//   unique id and shares it through the c10d Store; every rank calls
//   ncclCommInitRank in the constructor, which blocks until all ranks joined
//   or TUTTI_INIT_TIMEOUT passed) and one worker thread.
// - tutti's host-memory calls block, so every collective is packed into a
//   Task and queued; the worker runs tasks in FIFO order, which is the order
//   the Python program issued them, identical on every rank. Calls return a
//   Work at once; Work::wait() and the Work's future complete when the worker
//   finished the task (and copied results back into non-contiguous outputs).
// - A watchdog thread aborts the communicator when a task runs longer than
//   its timeout (the process group's, or the call's own): the blocked tutti
//   call returns within about 100 ms, the task and every later one fail with
//   a RuntimeError naming the timeout. Work::wait(t) with an explicit t that
//   passes first throws and aborts the same way.
// - Destruction waits (at most min(timeout, 10 s)) for queued tasks, then
//   aborts what is left, joins both threads and destroys the communicator.
// - Only dense, strided CPU tensors are accepted; anything else is rejected
//   with a RuntimeError before anything is queued.
//
// Builds against PyTorch 1.13 (base class c10d::ProcessGroup) and 2.x (base
// class c10d::Backend); the differences are confined to the #if blocks.

#include <torch/extension.h>
#include <torch/version.h>
#include <pybind11/chrono.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define TUTTI_TORCH_V2 1
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#define TUTTI_TORCH_V2 0
#endif
#include <execinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "nccl.h"
#include "tutti/tutti.h"

namespace tutti_torch {

namespace py = pybind11;
using Clock = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

#if TUTTI_TORCH_V2
using PGBase = c10d::Backend;
#else
using PGBase = c10d::ProcessGroup;
#endif

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error("tutti: " + msg); }

// ---- the worker ---------------------------------------------------------------

class Engine;

// One queued operation: `issue` makes the NCCL calls (throws on failure),
// `post` copies results into the caller's tensors after success.
struct Task {
  std::string name;
  std::function<void(ncclComm_t)> issue;
  std::function<void()> post;
  bool p2p = false;
  ms timeout{0};
};

// ---- tracing (TUTTI_TORCH_TRACE=<prefix>) -------------------------------------
// When set, every queued item appends one JSON line to <prefix>.<rank>.jsonl:
// op name, bytes, and its enqueue, start and end times (CLOCK_MONOTONIC ns,
// the clock of Python's time.monotonic_ns()). Off: one branch per item.
int64_t monoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

class Tracer {
 public:
  // The process-wide tracer for `rank`, or nullptr when tracing is off.
  static Tracer* get(int rank) {
    const char* prefix = std::getenv("TUTTI_TORCH_TRACE");
    if (!prefix || !*prefix) return nullptr;
    static std::mutex mu;
    static std::map<int, Tracer*> tracers;  // leaked: lines may come until exit
    std::lock_guard<std::mutex> lk(mu);
    auto& t = tracers[rank];
    if (!t) {
      std::string path = std::string(prefix) + "." + std::to_string(rank) + ".jsonl";
      FILE* f = std::fopen(path.c_str(), "a");
      if (!f) {
        std::fprintf(stderr,
                     "tutti_torch: TUTTI_TORCH_TRACE: cannot open %s for appending; not tracing\n",
                     path.c_str());
        return nullptr;
      }
      t = new Tracer(f);
    }
    return t;
  }
  int newGroup() { return nextGroup_.fetch_add(1); }
  void write(int group, uint64_t seq, const std::string& op, size_t ntasks, size_t bytes,
             int64_t enq, int64_t start, int64_t end, bool ok) {
    std::lock_guard<std::mutex> lk(mu_);
    std::fprintf(f_,
                 "{\"group\":%d,\"seq\":%llu,\"op\":\"%s\",\"tasks\":%zu,\"bytes\":%zu,"
                 "\"enqueue_ns\":%lld,\"start_ns\":%lld,\"end_ns\":%lld,\"ok\":%s}\n",
                 group, static_cast<unsigned long long>(seq), op.c_str(), ntasks, bytes,
                 static_cast<long long>(enq), static_cast<long long>(start),
                 static_cast<long long>(end), ok ? "true" : "false");
    std::fflush(f_);
  }

 private:
  explicit Tracer(FILE* f) : f_(f) {}
  FILE* f_;
  std::mutex mu_;
  std::atomic<int> nextGroup_{0};
};

class TuttiWork : public c10d::Work {
 public:
  TuttiWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
            std::shared_ptr<Engine> engine, std::string name)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        engine_(std::move(engine)),
        name_(std::move(name)),
        future_(c10::make_intrusive<at::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  bool wait(ms timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive from any source: the rank it received from, once it ended
  // (written by the engine before the work completes).
  int sourceRank() const override {
    if (!source_) return c10d::Work::sourceRank();  // throws: not a receive from any source
    return *source_;
  }
  void setSource(std::shared_ptr<const int> source) { source_ = std::move(source); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  void complete(std::exception_ptr ep) {
    finish(ep);  // sets completed_/exception_, wakes wait()
    if (ep)
      future_->setError(ep);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<Engine> engine_;
  std::string name_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<const int> source_;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(ncclComm_t comm, int rank, ms timeout)
      : comm_(comm), rank_(rank), timeout_(timeout), tracer_(Tracer::get(rank)) {
    if (tracer_) traceGroup_ = tracer_->newGroup();
  }
  ~Engine() { shutdown(); }

  void start() {
    worker_ = std::thread([this] { workerLoop(); });
    watchdog_ = std::thread([this] { watchdogLoop(); });
  }

  ms timeout() const { return timeout_; }
  bool onOwnThread() const {
    return std::this_thread::get_id() == worker_.get_id() ||
           std::this_thread::get_id() == watchdog_.get_id();
  }
  int rank() const { return rank_; }

  // " (waiting for rank(s) 1, 2)": whom the running operation waits for, as
  // tutti sees it (tuttiCommWaitingOn), or "" when it cannot tell. Takes
  // commMu_: call without holding mu_.
  std::string waitingOn() {
    std::lock_guard<std::mutex> lk(commMu_);
    if (commGone_) return "";
    int ranks[16];
    int n = 0;
    if (tuttiCommWaitingOn(comm_, ranks, 16, &n) != ncclSuccess || n <= 0) return "";
    std::string list;
    for (int i = 0; i < n && i < 16; ++i) list += (i ? ", " : "") + std::to_string(ranks[i]);
    if (n > 16) list += ", ... (" + std::to_string(n) + " in all)";
    return std::string(" (waiting for rank") + (n > 1 ? "s " : " ") + list + ")";
  }

  // Queues tasks that run as one unit (one NCCL group when more than one).
  // `bytes` is only used by the trace.
  void enqueue(std::vector<Task> tasks, std::vector<c10::intrusive_ptr<TuttiWork>> works,
               size_t bytes = 0) {
    int64_t enq = tracer_ ? monoNs() : 0;
    std::unique_lock<std::mutex> lk(mu_);
    if (stop_) fail("the process group has been shut down");
    queue_.push_back(Item{std::move(tasks), std::move(works), bytes, enq});
    lk.unlock();
    cv_.notify_all();
  }

  // From any thread: fails the running task and everything queued, for good.
  void abort(const std::string& why) {
    ncclComm_t c = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (aborted_) return;
      aborted_ = true;
      reason_ = why;
      c = comm_;
    }
    {
      std::lock_guard<std::mutex> lk(commMu_);
      if (c && !commGone_) {
        ncclCommAbort(c);  // a blocked call returns within ~100 ms
        commGone_ = true;
      }
    }
    cv_.notify_all();
  }

  void shutdown() {
    std::unique_lock<std::mutex> lk(mu_);
    if (shutDown_) return;
    if (onOwnThread()) {
      // Released from one of our own threads (a future callback dropped the
      // last reference): they cannot join themselves; let them run out.
      // Detached before the lock is released: a shutdown on another thread
      // that sees shutDown_ returns, and its owner may then destroy the
      // threads' handles, which must not be joinable by then.
      shutDown_ = stop_ = true;
      worker_.detach();
      watchdog_.detach();
      lk.unlock();
      cv_.notify_all();
      return;
    }
    shutDown_ = true;
    stop_ = true;
    cv_.notify_all();
    ms grace = std::min(timeout_, ms(10000));
    bool drained = cv_.wait_for(lk, grace, [&] { return queue_.empty() && !busy_; });
    size_t left = queue_.size() + (busy_ ? 1 : 0);
    lk.unlock();
    if (!drained)
      abort("the process group was destroyed with " + std::to_string(left) +
            " operation(s) unfinished");
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    if (watchdog_.joinable()) watchdog_.join();
    std::lock_guard<std::mutex> clk(commMu_);
    if (!commGone_) {
      for (auto& kv : compressors_) tuttiCompressorDestroy(kv.second);
      ncclCommDestroy(comm_);
      commGone_ = true;
    }
    // After an abort the compressors are leaked on purpose: their
    // communicator is gone and they are never used again.
    compressors_.clear();
  }

  // Worker thread only: the compressor for a configuration id.
  tuttiCompressor_t compressor(ncclComm_t comm, int id, const tuttiCompressionConfig_t& cfg) {
    auto it = compressors_.find(id);
    if (it != compressors_.end()) return it->second;
    tuttiCompressor_t c = nullptr;
    check(tuttiCompressorCreate(comm, &cfg, &c), comm, "tuttiCompressorCreate");
    compressors_[id] = c;
    return c;
  }
  // Any thread, between tasks: statistics of a compressor (zeros if unused).
  tuttiCompressionStats_t stats(int id) {
    tuttiCompressionStats_t s{};
    s.size = sizeof(s);
    std::lock_guard<std::mutex> lk(commMu_);
    auto it = compressors_.find(id);
    if (it != compressors_.end() && !commGone_) tuttiCompressorGetStats(it->second, &s);
    return s;
  }

  // Throws a RuntimeError carrying tutti's message when rc is an error.
  void check(ncclResult_t rc, ncclComm_t comm, const char* what) {
    if (rc == ncclSuccess) return;
    std::string msg;
    {
      std::lock_guard<std::mutex> lk(commMu_);
      if (commGone_) {
        std::lock_guard<std::mutex> lk2(mu_);
        msg = reason_;
      } else {
        const char* last = ncclGetLastError(comm);
        msg = (last && *last) ? last : "";
      }
    }
    std::ostringstream os;
    os << what << " failed on rank " << rank_ << ": " << ncclGetErrorString(rc);
    if (!msg.empty()) os << " (" << msg << ")";
    fail(os.str());
  }

 private:
  struct Item {
    std::vector<Task> tasks;
    std::vector<c10::intrusive_ptr<TuttiWork>> works;
    size_t bytes = 0;
    int64_t enqueueNs = 0;
  };

  void workerLoop() {
    for (;;) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      Item item = std::move(queue_.front());
      queue_.pop_front();
      std::exception_ptr ep;
      int64_t startNs = tracer_ ? monoNs() : 0;
      uint64_t seq = seq_;
      if (aborted_) {
        ep = std::make_exception_ptr(std::runtime_error("tutti: " + reason_));
      } else {
        busy_ = true;
        ms t = ms(0);
        for (auto& task : item.tasks) t = std::max(t, task.timeout.count() > 0 ? task.timeout : timeout_);
        deadline_ = Clock::now() + t;
        runningName_ = item.tasks.empty() ? "" : item.tasks.front().name;
        runningTimeout_ = t;
        seq = ++seq_;
        ncclComm_t comm = comm_;
        lk.unlock();
        cv_.notify_all();  // the watchdog picks up the new deadline
        ep = run(item, comm);
        lk.lock();
        busy_ = false;
        if (ep && aborted_) ep = std::make_exception_ptr(std::runtime_error("tutti: " + reason_));
      }
      lk.unlock();
      cv_.notify_all();
      if (tracer_)
        tracer_->write(traceGroup_, seq, item.tasks.empty() ? "" : item.tasks.front().name,
                       item.tasks.size(), item.bytes, item.enqueueNs, startNs, monoNs(), !ep);
      for (auto& w : item.works) w->complete(ep);
    }
  }

  std::exception_ptr run(Item& item, ncclComm_t comm) {
    std::exception_ptr ep;
    try {
      if (item.tasks.size() == 1) {
        item.tasks[0].issue(comm);
      } else {
        ncclResult_t rc = ncclGroupStart();
        if (rc != ncclSuccess) check(rc, comm, "ncclGroupStart");
        for (auto& t : item.tasks) {
          try {
            t.issue(comm);
          } catch (...) {
            if (!ep) ep = std::current_exception();
          }
        }
        rc = ncclGroupEnd();
        if (ep) return ep;
        check(rc, comm, "ncclGroupEnd");
      }
      for (auto& t : item.tasks)
        if (t.post) t.post();
    } catch (...) {
      ep = std::current_exception();
    }
    return ep;
  }

  void watchdogLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!(stop_ && queue_.empty() && !busy_) && !aborted_) {
      if (busy_) {
        uint64_t s = seq_;
        auto dl = deadline_;
        if (cv_.wait_until(lk, dl, [&] { return !busy_ || seq_ != s || aborted_; })) continue;
        const std::string name = runningName_;
        const ms limit = runningTimeout_;
        lk.unlock();  // waitingOn() takes commMu_, which is taken before mu_
        std::string msg = "Timed out after " + std::to_string(limit.count()) +
                          " ms waiting for operation '" + name + "' on rank " +
                          std::to_string(rank_) + waitingOn() + "; the communicator was aborted";
        abort(msg);
        lk.lock();
      } else {
        cv_.wait(lk);
      }
    }
  }

  ncclComm_t comm_;
  const int rank_;
  const ms timeout_;
  std::mutex mu_;  // queue, flags, deadline
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false, shutDown_ = false, aborted_ = false, busy_ = false;
  std::string reason_;
  Clock::time_point deadline_;
  std::string runningName_;
  ms runningTimeout_{0};
  uint64_t seq_ = 0;
  std::mutex commMu_;  // commGone_, ncclGetLastError, ncclCommAbort
  bool commGone_ = false;
  std::map<int, tuttiCompressor_t> compressors_;
  Tracer* tracer_ = nullptr;
  int traceGroup_ = -1;
  std::thread worker_, watchdog_;
};

bool TuttiWork::wait(ms timeout) {
  std::unique_lock<std::mutex> lk(mutex_);
  if (timeout == kNoTimeout) {
    // The watchdog bounds every running task by its timeout.
    cv_.wait(lk, [&] { return completed_; });
  } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
    lk.unlock();
    std::string msg = "Timed out after " + std::to_string(timeout.count()) + " ms in wait() on '" +
                      name_ + "' on rank " + std::to_string(engine_->rank()) +
                      engine_->waitingOn() + "; the communicator was aborted";
    engine_->abort(msg);
    fail(msg);
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

// ---- tensors and types --------------------------------------------------------

// The name Python users know (torch.int16), not ATen's (Short).
std::string dtypeName(at::ScalarType st) {
  switch (st) {
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    case at::kComplexHalf: return "complex32";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return c10::toString(st);
  }
}

void checkTensor(const at::Tensor& t, const char* op) {
  if (!t.defined()) fail(std::string(op) + ": undefined tensor");
  if (!t.device().is_cpu())
    fail(std::string(op) + ": only CPU tensors are supported by this build (got a tensor on " +
         t.device().str() + ")");
  if (t.layout() != at::kStrided)
    fail(std::string(op) + ": only dense (strided) tensors are supported (sparse/other layouts are not)");
  if (t.is_quantized()) fail(std::string(op) + ": quantized tensors are not supported");
}

void checkOne(const std::vector<at::Tensor>& v, const char* op) {
  if (v.size() != 1)
    fail(std::string(op) + ": expects exactly one tensor per process (got " +
         std::to_string(v.size()) + ")");
  checkTensor(v[0], op);
}

void checkSame(const at::Tensor& a, const at::Tensor& ref, const char* op, const char* what) {
  checkTensor(a, op);
  if (a.scalar_type() != ref.scalar_type())
    fail(std::string(op) + ": " + what + " has dtype " + dtypeName(a.scalar_type()) +
         " but the input has " + dtypeName(ref.scalar_type()));
  if (a.numel() != ref.numel())
    fail(std::string(op) + ": " + what + " has " + std::to_string(a.numel()) +
         " elements but the input has " + std::to_string(ref.numel()));
}

at::Tensor contig(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

size_t nbytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }

// A reducible view of a tensor: NCCL type, element count, reduction op.
struct RedSpec {
  ncclDataType_t dt;
  size_t count;
  ncclRedOp_t op;
  bool premul = false;
  double factor = 1.0;
};

RedSpec redSpec(const at::Tensor& t, const c10d::ReduceOp& rop, const char* opname) {
  RedSpec s{};
  s.count = static_cast<size_t>(t.numel());
  at::ScalarType st = t.scalar_type();
  bool isBool = st == at::kBool;
  switch (st) {
    case at::kHalf: s.dt = ncclFloat16; break;
    case at::kFloat: s.dt = ncclFloat32; break;
    case at::kDouble: s.dt = ncclFloat64; break;
    case at::kBFloat16: s.dt = ncclBfloat16; break;
    case at::kChar: s.dt = ncclInt8; break;
    case at::kByte: s.dt = ncclUint8; break;
    case at::kInt: s.dt = ncclInt32; break;
    case at::kLong: s.dt = ncclInt64; break;
    case at::kBool: s.dt = ncclUint8; break;
    case at::kComplexFloat: s.dt = ncclFloat32; s.count *= 2; break;
    case at::kComplexDouble: s.dt = ncclFloat64; s.count *= 2; break;
    default:
      fail(std::string(opname) + ": dtype " + dtypeName(st) +
           " cannot be reduced (supported: float16, bfloat16, float32, float64, int8, uint8, "
           "int32, int64, bool, complex64/128 with SUM/AVG)");
  }
  bool isComplex = st == at::kComplexFloat || st == at::kComplexDouble;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: s.op = isBool ? ncclMax : ncclSum; break;  // logical or
    case c10d::ReduceOp::PRODUCT: s.op = isBool ? ncclMin : ncclProd; break;  // logical and
    case c10d::ReduceOp::MIN: s.op = ncclMin; break;
    case c10d::ReduceOp::MAX: s.op = ncclMax; break;
    case c10d::ReduceOp::AVG:
      if (isBool) fail(std::string(opname) + ": ReduceOp.AVG is not defined for bool tensors");
      s.op = ncclAvg;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!(st == at::kFloat || st == at::kDouble))
        fail(std::string(opname) + ": PREMUL_SUM is supported for float32 and float64 only");
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      if (!sup) fail(std::string(opname) + ": PREMUL_SUM without a factor");
      s.premul = true;
      s.factor = sup->tensor_factors.empty() ? sup->double_factor
                                             : sup->tensor_factors[0].item<double>();
      s.op = ncclSum;
      break;
    }
    default:
      fail(std::string(opname) + ": ReduceOp " + std::to_string(static_cast<int>(rop.op_)) +
           " (bitwise AND/OR/XOR) is not supported by tutti");
  }
  if (isComplex && !(s.op == ncclSum || s.op == ncclAvg || s.premul))
    fail(std::string(opname) + ": complex tensors support only SUM, AVG and PREMUL_SUM");
  return s;
}

// Runs fn with the reduction op of spec (creating a pre-multiplied sum for
// PREMUL_SUM on the worker's communicator and destroying it afterwards).
void withOp(const RedSpec& s, ncclComm_t comm, Engine& eng, const std::function<ncclResult_t(ncclRedOp_t)>& fn,
            const char* what) {
  if (!s.premul) {
    eng.check(fn(s.op), comm, what);
    return;
  }
  ncclRedOp_t op;
  float f32 = static_cast<float>(s.factor);
  double f64 = s.factor;
  void* scalar = s.dt == ncclFloat32 ? static_cast<void*>(&f32) : static_cast<void*>(&f64);
  eng.check(ncclRedOpCreatePreMulSum(&op, scalar, s.dt, ncclScalarHostImmediate, comm), comm,
            "ncclRedOpCreatePreMulSum");
  ncclResult_t rc = fn(op);
  ncclRedOpDestroy(op, comm);
  eng.check(rc, comm, what);
}

// ---- the process group --------------------------------------------------------

class ProcessGroupTutti : public PGBase {
 public:
  ProcessGroupTutti(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, ms timeout)
      : PGBase(rank, size) {
    if (size < 1 || rank < 0 || rank >= size)
      fail("invalid rank " + std::to_string(rank) + " of world size " + std::to_string(size));
    ncclUniqueId id;
    const std::string key = "tutti_torch/unique_id";
    if (rank == 0) {
      ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc != ncclSuccess)
        fail(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(rc) + " (" +
             ncclGetLastError(nullptr) + ")");
      std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id),
                                 reinterpret_cast<uint8_t*>(&id) + sizeof(id));
      store->set(key, bytes);
    } else {
      std::vector<uint8_t> bytes = store->get(key);
      if (bytes.size() != sizeof(id))
        fail("the store holds a malformed unique id (" + std::to_string(bytes.size()) + " bytes)");
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    ncclComm_t comm = nullptr;
    ncclResult_t rc = ncclCommInitRank(&comm, size, id, rank);
    if (rc != ncclSuccess)
      fail(std::string("ncclCommInitRank failed on rank ") + std::to_string(rank) + ": " +
           ncclGetErrorString(rc) + " (" + ncclGetLastError(nullptr) + ")");
    engine_ = std::make_shared<Engine>(comm, rank, timeout.count() > 0 ? timeout : ms(1800000));
    engine_->start();
    store_ = store;
  }

  ~ProcessGroupTutti() override {
    if (engine_->onOwnThread()) {
      // Destroyed from a future callback on the worker: it cannot join
      // itself. Stop it and keep the engine alive for the rest of the process.
      new std::shared_ptr<Engine>(engine_);
    }
    engine_->shutdown();
  }

  const std::string getBackendName() const override { return "tutti"; }

  // ---- collectives ----
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts =
                                               c10d::AllreduceOptions()) override {
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse())
      return allreduceSparse(tensors, opts);
    checkOne(tensors, "allreduce");
    return submit(c10d::OpType::ALLREDUCE, tensors, {allreduceTask(tensors[0], opts.reduceOp, opts.timeout)});
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override {
    std::vector<Task> tasks;
    for (auto& t : tensors) {
      checkTensor(t, "allreduce_coalesced");
      tasks.push_back(allreduceTask(t, opts.reduceOp, opts.timeout));
    }
    return submit(c10d::OpType::ALLREDUCE_COALESCED, tensors, std::move(tasks));
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts =
                                               c10d::BroadcastOptions()) override {
    checkOne(tensors, "broadcast");
    checkRoot(opts.rootRank, "broadcast");
    at::Tensor t = tensors[0], buf = contig(t);
    int root = static_cast<int>(opts.rootRank);
    bool copyBack = !buf.is_same(t) && root != getRank();
    auto eng = engine_.get();
    Task task{"broadcast",
              [=](ncclComm_t c) {
                eng->check(ncclBroadcast(ptr(buf), ptr(buf), nbytes(buf), ncclUint8, root, c, nullptr),
                           c, "ncclBroadcast");
              },
              [=]() mutable {
                if (copyBack) t.copy_(buf);
              },
              false, opts.timeout};
    return submit(c10d::OpType::BROADCAST, tensors, {task});
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override {
    checkOne(tensors, "reduce");
    checkRoot(opts.rootRank, "reduce");
    at::Tensor t = tensors[0], buf = contig(t);
    RedSpec s = redSpec(t, opts.reduceOp, "reduce");
    int root = static_cast<int>(opts.rootRank);
    bool isRoot = root == getRank();
    // Non-roots keep their input untouched: their receive buffer is scratch.
    at::Tensor out = isRoot ? buf : at::empty_like(buf);
    bool copyBack = isRoot && !buf.is_same(t);
    auto eng = engine_.get();
    Task task{"reduce",
              [=](ncclComm_t c) {
                withOp(s, c, *eng, [&](ncclRedOp_t op) {
                  return ncclReduce(ptr(buf), ptr(out), s.count, s.dt, op, root, c, nullptr);
                }, "ncclReduce");
              },
              [=]() mutable {
                if (copyBack) t.copy_(buf);
              },
              false, opts.timeout};
    return submit(c10d::OpType::REDUCE, tensors, {task});
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts =
                                               c10d::AllgatherOptions()) override {
    checkOne(inputs, "allgather");
    if (outputs.size() != 1) fail("allgather: expects one output list per process");
    auto& outs = outputs[0];
    checkListSize(outs, "allgather", "output list");
    at::Tensor in = contig(inputs[0]);
    for (auto& o : outs) checkSame(o, in, "allgather", "an output tensor");
    at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
    auto eng = engine_.get();
    std::vector<at::Tensor> outCopy = outs;
    Task task{"allgather",
              [=](ncclComm_t c) {
                eng->check(ncclAllGather(ptr(in), ptr(flat), nbytes(in), ncclUint8, c, nullptr), c,
                           "ncclAllGather");
              },
              [=]() mutable {
                int64_t n = in.numel();
                for (size_t i = 0; i < outCopy.size(); ++i)
                  outCopy[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outCopy[i].sizes()));
              },
              false, opts.timeout};
    return submit(c10d::OpType::ALLGATHER, outs, {task});
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts =
                                                     c10d::AllgatherOptions()) override {
    checkTensor(input, "_allgather_base");
    checkTensor(output, "_allgather_base");
    if (output.scalar_type() != input.scalar_type()) fail("_allgather_base: output and input dtypes differ");
    if (output.numel() != input.numel() * getSize())
      fail("_allgather_base: output has " + std::to_string(output.numel()) +
           " elements, expected world size x input = " + std::to_string(input.numel() * getSize()));
    at::Tensor in = contig(input), out = output, obuf = contig(output);
    bool copyBack = !obuf.is_same(out);
    auto eng = engine_.get();
    Task task{"_allgather_base",
              [=](ncclComm_t c) {
                eng->check(ncclAllGather(ptr(in), ptr(obuf), nbytes(in), ncclUint8, c, nullptr), c,
                           "ncclAllGather");
              },
              [=]() mutable {
                if (copyBack) out.copy_(obuf);
              },
              false, opts.timeout};
    return submit(c10d::OpType::_ALLGATHER_BASE, {output}, {task});
  }

  // Gloo's semantics: outputs[r][i] receives rank r's inputs[i]; every rank
  // gives inputs of the same shapes and types. One group of all-gathers.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    const char* op = "allgather_coalesced";
    if (inputs.empty()) fail(std::string(op) + ": no input tensors");
    if (static_cast<int>(outputs.size()) != getSize())
      fail(std::string(op) + ": " + std::to_string(outputs.size()) +
           " output lists, expected one per rank (" + std::to_string(getSize()) + ")");
    std::vector<Task> tasks;
    std::vector<at::Tensor> all;
    auto eng = engine_.get();
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkTensor(inputs[i], op);
      at::Tensor in = contig(inputs[i]);
      std::vector<at::Tensor> column;
      for (auto& list : outputs) {
        if (list.size() != inputs.size())
          fail(std::string(op) + ": an output list has " + std::to_string(list.size()) +
               " tensors, expected one per input (" + std::to_string(inputs.size()) + ")");
        checkSame(list[i], in, op, "an output tensor");
        column.push_back(list[i]);
        all.push_back(list[i]);
      }
      at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
      tasks.push_back(Task{op,
                           [=](ncclComm_t c) {
                             eng->check(ncclAllGather(ptr(in), ptr(flat), nbytes(in), ncclUint8, c,
                                                      nullptr),
                                        c, "ncclAllGather");
                           },
                           [=]() mutable {
                             const int64_t n = in.numel();
                             for (size_t r = 0; r < column.size(); ++r)
                               column[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n)
                                                   .view(column[r].sizes()));
                           },
                           false, opts.timeout});
    }
    return submit(c10d::OpType::ALLGATHER_COALESCED, all, std::move(tasks));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts =
                                                    c10d::ReduceScatterOptions()) override {
    checkOne(outputs, "reduce_scatter");
    if (inputs.size() != 1) fail("reduce_scatter: expects one input list per process");
    checkListSize(inputs[0], "reduce_scatter", "input list");
    at::Tensor out = outputs[0];
    for (auto& i : inputs[0]) checkSame(i, out, "reduce_scatter", "an input tensor");
    std::vector<at::Tensor> flat;
    for (auto& i : inputs[0]) flat.push_back(i.reshape({-1}));
    at::Tensor in = at::cat(flat);
    return submit(c10d::OpType::REDUCE_SCATTER, outputs,
                  {reduceScatterTask(out, in, opts.reduceOp, opts.timeout, "reduce_scatter")});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts =
                                                          c10d::ReduceScatterOptions()) override {
    checkTensor(input, "_reduce_scatter_base");
    checkTensor(output, "_reduce_scatter_base");
    if (output.scalar_type() != input.scalar_type())
      fail("_reduce_scatter_base: output and input dtypes differ");
    if (input.numel() != output.numel() * getSize())
      fail("_reduce_scatter_base: input has " + std::to_string(input.numel()) +
           " elements, expected world size x output = " + std::to_string(output.numel() * getSize()));
    return submit(c10d::OpType::_REDUCE_SCATTER_BASE, {output},
                  {reduceScatterTask(output, contig(input), opts.reduceOp, opts.timeout,
                                     "_reduce_scatter_base")});
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions& opts =
                                                   c10d::AllToAllOptions()) override {
    checkTensor(input, "alltoall_base");
    checkTensor(output, "alltoall_base");
    if (output.scalar_type() != input.scalar_type()) fail("alltoall_base: output and input dtypes differ");
    at::Tensor in = contig(input), out = output, obuf = contig(output);
    bool copyBack = !obuf.is_same(out);
    auto eng = engine_.get();
    int n = getSize(), me = getRank();
    Task task{"alltoall_base", nullptr,
              [=]() mutable {
                if (copyBack) out.copy_(obuf);
              },
              false, opts.timeout};
    if (outSplits.empty() && inSplits.empty()) {
      if (in.numel() % n != 0 || out.numel() != in.numel())
        fail("alltoall_base: equal splits need input and output of the same size, divisible by "
             "the world size (input " + std::to_string(in.numel()) + ", output " +
             std::to_string(out.numel()) + " elements, world size " + std::to_string(n) + ")");
      size_t chunk = nbytes(in) / n;
      task.issue = [=](ncclComm_t c) {
        eng->check(ncclAlltoAll(ptr(in), ptr(obuf), chunk, ncclUint8, c, nullptr), c, "ncclAlltoAll");
      };
    } else {
      std::vector<size_t> sOff, sLen, rOff, rLen;
      splitBytes(in, inSplits, "input", sOff, sLen);
      splitBytes(obuf, outSplits, "output", rOff, rLen);
      task.issue = [=](ncclComm_t c) {
        auto* sb = static_cast<const char*>(ptr(in));
        auto* rb = static_cast<char*>(ptr(obuf));
        if (sLen[me] != rLen[me])
          fail("alltoall_base: rank " + std::to_string(me) + " sends itself " +
               std::to_string(sLen[me]) + " bytes but expects " + std::to_string(rLen[me]));
        if (sLen[me]) std::memcpy(rb + rOff[me], sb + sOff[me], sLen[me]);
        if (n == 1) return;
        eng->check(ncclGroupStart(), c, "ncclGroupStart");
        ncclResult_t first = ncclSuccess;
        for (int p = 0; p < n; ++p) {
          if (p == me) continue;
          ncclResult_t rc = ncclSend(sb + sOff[p], sLen[p], ncclUint8, p, c, nullptr);
          if (first == ncclSuccess) first = rc;
          rc = ncclRecv(rb + rOff[p], rLen[p], ncclUint8, p, c, nullptr);
          if (first == ncclSuccess) first = rc;
        }
        ncclResult_t rc = ncclGroupEnd();
        eng->check(first != ncclSuccess ? first : rc, c, "alltoall (grouped send/recv)");
      };
    }
    return submit(c10d::OpType::ALLTOALL_BASE, {output}, {task});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts =
                                              c10d::AllToAllOptions()) override {
    int n = getSize(), me = getRank();
    checkListSize(outputs, "alltoall", "output list");
    checkListSize(inputs, "alltoall", "input list");
    std::vector<at::Tensor> ins, obufs;
    for (int p = 0; p < n; ++p) {
      checkTensor(inputs[p], "alltoall");
      checkTensor(outputs[p], "alltoall");
      if (inputs[p].scalar_type() != inputs[0].scalar_type() ||
          outputs[p].scalar_type() != inputs[0].scalar_type())
        fail("alltoall: all tensors must have the same dtype");
      ins.push_back(contig(inputs[p]));
      obufs.push_back(contig(outputs[p]));
    }
    if (ins[me].numel() != obufs[me].numel())
      fail("alltoall: the tensor this rank sends itself and the one it receives differ in size");
    auto eng = engine_.get();
    std::vector<at::Tensor> outs = outputs;
    Task task{"alltoall",
              [=](ncclComm_t c) {
                if (nbytes(ins[me])) std::memcpy(ptr(obufs[me]), ptr(ins[me]), nbytes(ins[me]));
                if (n == 1) return;
                eng->check(ncclGroupStart(), c, "ncclGroupStart");
                ncclResult_t first = ncclSuccess;
                for (int p = 0; p < n; ++p) {
                  if (p == me) continue;
                  ncclResult_t rc = ncclSend(ptr(ins[p]), nbytes(ins[p]), ncclUint8, p, c, nullptr);
                  if (first == ncclSuccess) first = rc;
                  rc = ncclRecv(ptr(obufs[p]), nbytes(obufs[p]), ncclUint8, p, c, nullptr);
                  if (first == ncclSuccess) first = rc;
                }
                ncclResult_t rc = ncclGroupEnd();
                eng->check(first != ncclSuccess ? first : rc, c, "alltoall (grouped send/recv)");
              },
              [=]() mutable {
                for (int p = 0; p < n; ++p)
                  if (!obufs[p].is_same(outs[p])) outs[p].copy_(obufs[p]);
              },
              false, opts.timeout};
    return submit(c10d::OpType::ALLTOALL, outputs, {task});
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override {
    checkOne(inputs, "gather");
    checkRoot(opts.rootRank, "gather");
    int root = static_cast<int>(opts.rootRank);
    bool isRoot = root == getRank();
    at::Tensor in = contig(inputs[0]);
    std::vector<at::Tensor> outs;
    if (isRoot) {
      if (outputs.size() != 1) fail("gather: the root expects one output list");
      checkListSize(outputs[0], "gather", "output list on the root");
      for (auto& o : outputs[0]) checkSame(o, in, "gather", "an output tensor");
      outs = outputs[0];
    } else if (!outputs.empty() && !outputs[0].empty()) {
      fail("gather: only the root (rank " + std::to_string(root) + ") may pass output tensors");
    }
    at::Tensor flat = isRoot ? at::empty({getSize() * in.numel()}, in.options()) : at::Tensor();
    auto eng = engine_.get();
    Task task{"gather",
              [=](ncclComm_t c) {
                eng->check(ncclGather(ptr(in), isRoot ? ptr(flat) : nullptr, nbytes(in), ncclUint8, root,
                                      c, nullptr),
                           c, "ncclGather");
              },
              [=]() mutable {
                int64_t n = in.numel();
                for (size_t i = 0; i < outs.size(); ++i)
                  outs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[i].sizes()));
              },
              false, opts.timeout};
    return submit(c10d::OpType::GATHER, outs, {task});
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override {
    checkOne(outputs, "scatter");
    checkRoot(opts.rootRank, "scatter");
    int root = static_cast<int>(opts.rootRank);
    bool isRoot = root == getRank();
    at::Tensor out = outputs[0], obuf = contig(out);
    at::Tensor flat;
    if (isRoot) {
      if (inputs.size() != 1) fail("scatter: the root expects one input list");
      checkListSize(inputs[0], "scatter", "input list on the root");
      std::vector<at::Tensor> parts;
      for (auto& i : inputs[0]) {
        checkSame(i, out, "scatter", "an input tensor");
        parts.push_back(i.reshape({-1}));
      }
      flat = at::cat(parts);
    } else if (!inputs.empty() && !inputs[0].empty()) {
      fail("scatter: only the root (rank " + std::to_string(root) + ") may pass input tensors");
    }
    bool copyBack = !obuf.is_same(out);
    auto eng = engine_.get();
    Task task{"scatter",
              [=](ncclComm_t c) {
                eng->check(ncclScatter(isRoot ? ptr(flat) : nullptr, ptr(obuf), nbytes(obuf), ncclUint8,
                                       root, c, nullptr),
                           c, "ncclScatter");
              },
              [=]() mutable {
                if (copyBack) out.copy_(obuf);
              },
              false, opts.timeout};
    return submit(c10d::OpType::SCATTER, outputs, {task});
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int /*tag*/) override {
    checkOne(tensors, "send");
    checkPeer(dst, "send");
    at::Tensor buf = contig(tensors[0]);
    auto eng = engine_.get();
    Task task{"send",
              [=](ncclComm_t c) {
                eng->check(ncclSend(ptr(buf), nbytes(buf), ncclUint8, dst, c, nullptr), c, "ncclSend");
              },
              nullptr, true, ms(0)};
    return submit(c10d::OpType::SEND, tensors, {task});
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int /*tag*/) override {
    checkOne(tensors, "recv");
    checkPeer(src, "recv");
    at::Tensor t = tensors[0], buf = contig(t);
    bool copyBack = !buf.is_same(t);
    auto eng = engine_.get();
    Task task{"recv",
              [=](ncclComm_t c) {
                eng->check(ncclRecv(ptr(buf), nbytes(buf), ncclUint8, src, c, nullptr), c, "ncclRecv");
              },
              [=]() mutable {
                if (copyBack) t.copy_(buf);
              },
              true, ms(0)};
    return submit(c10d::OpType::RECV, tensors, {task});
  }

  // Gloo's recv without a source rank: tuttiRecvAny takes the first rank
  // whose message to this one comes, as Gloo's recv from any of the group's
  // ranks does; the work's sourceRank() names it. (Tags are not matched,
  // as for recv: tutti matches each pair's messages in order.)
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int /*tag*/) override {
    checkOne(tensors, "recv");
    if (getSize() == 1)
      fail("recv from any source: a group of one rank has no rank to receive from");
    at::Tensor t = tensors[0], buf = contig(t);
    bool copyBack = !buf.is_same(t);
    auto eng = engine_.get();
    auto source = std::make_shared<int>(-1);
    Task task{"recvAnySource",
              [=](ncclComm_t c) {
                eng->check(tuttiRecvAny(ptr(buf), nbytes(buf), ncclUint8, source.get(), c, nullptr),
                           c, "tuttiRecvAny");
              },
              [=]() mutable {
                if (copyBack) t.copy_(buf);
              },
              true, ms(0)};
    auto work = submit(c10d::OpType::RECVANYSOURCE, tensors, {task});
    static_cast<TuttiWork*>(work.get())->setSource(source);
    return work;
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override {
    at::Tensor one = at::zeros({1}, at::kByte);
    auto eng = engine_.get();
    Task task{"barrier",
              [=](ncclComm_t c) {
                eng->check(ncclAllReduce(ptr(one), ptr(one), 1, ncclUint8, ncclSum, c, nullptr), c,
                           "barrier (ncclAllReduce)");
              },
              nullptr, false, opts.timeout};
    return submit(c10d::OpType::BARRIER, {}, {task});
  }

  // Gloo's monitored barrier, through the group's store instead of the
  // communicator (a rank that never comes must not leave the communicator
  // waiting). Every rank but 0 checks in (its k-th arrival) and waits for
  // rank 0's verdict on it; rank 0 waits for each rank's next arrival in
  // rank order (for all of them with waitAllRanks) until the timeout, then
  // gives each rank that came "ok" or its error, which names the ranks that
  // did not arrive in Gloo's words. As with Gloo's messages, a rank's k-th
  // arrival meets rank 0's k-th wait for it: a rank that skipped one call
  // meets the next. PyTorch 1.13's dist.monitored_barrier refuses every
  // backend but Gloo: tutti_torch.monitored_barrier calls this.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    const ms timeout = opts.timeout.count() > 0 ? opts.timeout : engine_->timeout();
    const auto deadline = Clock::now() + timeout;
    const std::string base = "tutti_torch/monitored_barrier/";
    auto forget = [&](const std::string& key) {
      try {
        store_->deleteKey(key);  // read once; a store without deletion keeps it
      } catch (const std::exception&) {
      }
    };
    // Polled with check(), never wait(): a TCPStore wait that timed out stays
    // registered on the server, whose answer, once the key is set after all
    // (a late rank's next arrival), is then read as the answer to a later
    // request of this process (seen: a later new_group's barrier read 512).
    auto arrives = [&](const std::string& key, Clock::time_point until) {
      for (;;) {
        if (store_->check({key})) return true;
        if (Clock::now() >= until) return false;
        std::this_thread::sleep_for(ms(5));
      }
    };
    const std::string me = std::to_string(getRank());
    if (getRank() != 0) {
      const std::string k = me + "/" + std::to_string(++monitoredArrivals_);
      store_->set(base + "arrive/" + k, std::vector<uint8_t>{1});
      // Rank 0 gives its verdict at the latest when its own timeout ends,
      // which began when it called: a little longer here, so that a rank
      // that came is told what rank 0 found instead of timing out with it.
      const ms patience = timeout + std::min(timeout, ms(1000));
      if (!arrives(base + "verdict/" + k, Clock::now() + patience)) {
        fail("Rank " + me + " successfully reached monitoredBarrier, but Timed out after " +
             std::to_string(patience.count()) +
             " ms waiting for rank 0 to release it (rank 0's error names the ranks that did not "
             "arrive)");
      }
      std::vector<uint8_t> v = store_->get(base + "verdict/" + k);
      forget(base + "verdict/" + k);
      const std::string said(v.begin(), v.end());
      if (said != "ok") fail("Rank " + me + " reached monitoredBarrier; rank 0 says: " + said);
      return;
    }
    if (monitoredReceived_.empty()) monitoredReceived_.assign(getSize(), 0);
    std::vector<int> missing, arrived;
    for (int r = 1; r < getSize(); ++r) {
      const std::string key = base + "arrive/" + std::to_string(r) + "/" +
                              std::to_string(monitoredReceived_[r] + 1);
      // Once the time is up, or a rank is missing already, only a look.
      const bool waitHere = missing.empty() || waitAllRanks;
      const bool in = arrives(key, waitHere ? deadline : Clock::now());
      if (in) {
        ++monitoredReceived_[r];
        arrived.push_back(r);
        forget(key);
      } else if (missing.empty() || waitAllRanks) {
        missing.push_back(r);
      }
    }
    std::string said = "ok";
    if (!missing.empty()) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      said = std::string(missing.size() == 1 ? "Rank " : "Ranks ") + list +
             " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) + " ms";
    }
    for (int r : arrived)
      store_->set(base + "verdict/" + std::to_string(r) + "/" + std::to_string(monitoredReceived_[r]),
                  std::vector<uint8_t>(said.begin(), said.end()));
    if (!missing.empty()) fail(said);
  }

#if !TUTTI_TORCH_V2
  // batch_isend_irecv: everything between start and end runs as one group.
  void startCoalescing() override {
    std::lock_guard<std::mutex> lk(coalesceMu_);
    if (coalescing_) fail("startCoalescing: already coalescing");
    coalescing_ = true;
  }
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& /*reqs*/) override {
    std::vector<Task> tasks;
    std::vector<c10::intrusive_ptr<TuttiWork>> works;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lk(coalesceMu_);
      if (!coalescing_) fail("endCoalescing without startCoalescing");
      coalescing_ = false;
      tasks.swap(coalTasks_);
      works.swap(coalWorks_);
      bytes = coalBytes_;
      coalBytes_ = 0;
    }
    if (!tasks.empty()) engine_->enqueue(std::move(tasks), std::move(works), bytes);
  }
#endif

  // ---- tutti extensions (used by tutti_torch.hooks) ----
  // Compressed all-reduce of a float32 contiguous tensor, in place.
  c10::intrusive_ptr<c10d::Work> allreduceCompressed(at::Tensor t, int cfgId, int kind, int rankR,
                                                              int errorFeedback, uint64_t seed, uint64_t key,
                                                              int64_t rows, int64_t cols, bool average) {
    checkTensor(t, "allreduce_compressed");
    if (t.scalar_type() != at::kFloat || !t.is_contiguous())
      fail("allreduce_compressed: needs a contiguous float32 tensor");
    tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
    cfg.kind = static_cast<tuttiCompression_t>(kind);
    cfg.powerSgdRank = rankR;
    cfg.errorFeedback = errorFeedback;
    cfg.seed = seed;
    auto eng = engine_.get();
    size_t n = static_cast<size_t>(t.numel());
    Task task{"allreduce_compressed",
              [=](ncclComm_t c) {
                tuttiCompressor_t comp = eng->compressor(c, cfgId, cfg);
                eng->check(tuttiAllReduceCompressed(ptr(t), ptr(t), n, ncclFloat32, average ? ncclAvg : ncclSum,
                                                    comp, key, static_cast<size_t>(rows),
                                                    static_cast<size_t>(cols), nullptr),
                           c, "tuttiAllReduceCompressed");
              },
              nullptr, false, ms(0)};
    return submit(c10d::OpType::ALLREDUCE, {t}, {task});
  }

  std::map<std::string, uint64_t> compressionStats(int cfgId) {
    tuttiCompressionStats_t s = engine_->stats(cfgId);
    return {{"calls", s.calls},
            {"payload_bytes", s.payloadBytes},
            {"wire_bytes_sent", s.wireBytesSent},
            {"exact_calls", s.exactCalls}};
  }

  void shutdown() { engine_->shutdown(); }

 private:
  Task allreduceTask(const at::Tensor& t, const c10d::ReduceOp& rop, ms timeout) {
    at::Tensor buf = contig(t);
    RedSpec s = redSpec(t, rop, "allreduce");
    bool copyBack = !buf.is_same(t);
    auto eng = engine_.get();
    at::Tensor user = t;
    return Task{"allreduce",
                [=](ncclComm_t c) {
                  withOp(s, c, *eng, [&](ncclRedOp_t op) {
                    return ncclAllReduce(ptr(buf), ptr(buf), s.count, s.dt, op, c, nullptr);
                  }, "ncclAllReduce");
                },
                [=]() mutable {
                  if (copyBack) user.copy_(buf);
                },
                false, timeout};
  }

  // All-reduce of a sparse COO tensor, as Gloo does it: every rank gathers
  // every rank's coalesced indices and values and sums them in rank order
  // (sparse additions, then coalesce), so every rank holds the same tensor,
  // written into the caller's. SUM only. Three all-gathers on the worker:
  // the shapes and counts (checked alike on every rank, so a mismatch fails
  // everywhere), then indices and values padded to the largest count.
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts) {
    const char* op = "allreduce (sparse)";
    at::Tensor t = tensors[0];
    if (!t.device().is_cpu()) fail(std::string(op) + ": only CPU tensors are supported");
    if (opts.reduceOp != c10d::ReduceOp::SUM)
      fail(std::string(op) + ": only SUM reduces sparse tensors (as with Gloo)");
    if (t.is_complex() || t.scalar_type() == at::kBool || t.is_quantized())
      fail(std::string(op) + ": sparse tensors of " + dtypeName(t.scalar_type()) +
           " are not supported");
    constexpr int64_t kMaxDims = 16;
    if (t.dim() > kMaxDims) fail(std::string(op) + ": more than 16 dimensions");
    {
      std::lock_guard<std::mutex> lk(coalesceMu_);
      if (coalescing_) fail(std::string(op) + ": not inside a coalesced group");
    }
    const int n = getSize();
    const int me = getRank();
    auto eng = engine_.get();
    Task task{"allreduce_sparse",
              [=](ncclComm_t c) mutable {
                at::Tensor in = t.coalesce();
                const int64_t nnz = in._nnz(), sparseDim = in.sparse_dim();
                at::Tensor idx = in._indices().contiguous();
                at::Tensor val = in._values().contiguous();
                // What every rank must agree on: dims, sizes, dtype; then nnz.
                std::vector<int64_t> meta(4 + kMaxDims, -1);
                meta[0] = nnz;
                meta[1] = sparseDim;
                meta[2] = in.dim();
                meta[3] = static_cast<int64_t>(in.scalar_type());
                for (int64_t d = 0; d < in.dim(); ++d) meta[4 + d] = in.size(d);
                at::Tensor all = at::empty({n, static_cast<int64_t>(meta.size())}, at::kLong);
                eng->check(ncclAllGather(meta.data(), all.data_ptr(), meta.size(), ncclInt64, c,
                                         nullptr),
                           c, "ncclAllGather (sparse shapes)");
                int64_t maxNnz = 0;
                for (int r = 0; r < n; ++r) {
                  const int64_t* m = all[r].data_ptr<int64_t>();
                  for (size_t k = 1; k < meta.size(); ++k)
                    if (m[k] != meta[k])
                      fail(std::string(op) + ": rank " + std::to_string(r) +
                           "'s tensor has other sizes, sparse dimensions or dtype than rank " +
                           std::to_string(me) + "'s");
                  maxNnz = std::max(maxNnz, m[0]);
                }
                // Indices [sparseDim, maxNnz] and values [maxNnz, ...], zero-padded.
                std::vector<int64_t> valShape = val.sizes().vec();
                valShape[0] = maxNnz;
                at::Tensor idxPad = at::zeros({sparseDim, maxNnz}, at::kLong);
                at::Tensor valPad = at::zeros(valShape, val.options());
                if (nnz) {
                  idxPad.narrow(1, 0, nnz).copy_(idx);
                  valPad.narrow(0, 0, nnz).copy_(val);
                }
                std::vector<int64_t> allValShape = valShape;
                allValShape.insert(allValShape.begin(), n);
                at::Tensor idxAll = at::empty({n, sparseDim, maxNnz}, at::kLong);
                at::Tensor valAll = at::empty(allValShape, val.options());
                eng->check(ncclAllGather(ptr(idxPad), ptr(idxAll), nbytes(idxPad), ncclUint8, c,
                                         nullptr),
                           c, "ncclAllGather (sparse indices)");
                eng->check(ncclAllGather(ptr(valPad), ptr(valAll), nbytes(valPad), ncclUint8, c,
                                         nullptr),
                           c, "ncclAllGather (sparse values)");
                at::Tensor sum;
                for (int r = 0; r < n; ++r) {
                  const int64_t k = all[r][0].item<int64_t>();
                  at::Tensor part = at::sparse_coo_tensor(idxAll[r].narrow(1, 0, k),
                                                          valAll[r].narrow(0, 0, k), in.sizes(),
                                                          val.options().layout(at::kSparse));
                  sum = r == 0 ? part : sum + part;
                }
                t.copy_(sum.coalesce());
              },
              nullptr, false, opts.timeout};
    return submit(c10d::OpType::ALLREDUCE, tensors, {task});
  }

  Task reduceScatterTask(const at::Tensor& out, const at::Tensor& in, const c10d::ReduceOp& rop, ms timeout,
                         const char* name) {
    at::Tensor obuf = contig(out), user = out;
    RedSpec s = redSpec(obuf, rop, name);
    bool copyBack = !obuf.is_same(out);
    auto eng = engine_.get();
    return Task{name,
                [=](ncclComm_t c) {
                  withOp(s, c, *eng, [&](ncclRedOp_t op) {
                    return ncclReduceScatter(ptr(in), ptr(obuf), s.count, s.dt, op, c, nullptr);
                  }, "ncclReduceScatter");
                },
                [=]() mutable {
                  if (copyBack) user.copy_(obuf);
                },
                false, timeout};
  }

  void splitBytes(const at::Tensor& t, const std::vector<int64_t>& splits, const char* what,
                  std::vector<size_t>& off, std::vector<size_t>& len) {
    int n = getSize();
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    size_t rowBytes = rows ? nbytes(t) / rows : 0;
    std::vector<int64_t> sp = splits;
    if (sp.empty()) {
      if (rows % n) fail(std::string("alltoall_base: ") + what + " dim 0 (" + std::to_string(rows) +
                         ") is not divisible by the world size; pass split sizes");
      sp.assign(n, rows / n);
    }
    if (static_cast<int>(sp.size()) != n)
      fail(std::string("alltoall_base: ") + what + " split sizes have " + std::to_string(sp.size()) +
           " entries, expected the world size " + std::to_string(n));
    int64_t sum = 0;
    for (auto v : sp) {
      if (v < 0) fail("alltoall_base: negative split size");
      sum += v;
    }
    if (sum != rows)
      fail(std::string("alltoall_base: ") + what + " split sizes sum to " + std::to_string(sum) +
           " but dim 0 has " + std::to_string(rows));
    size_t o = 0;
    for (auto v : sp) {
      off.push_back(o);
      len.push_back(static_cast<size_t>(v) * rowBytes);
      o += static_cast<size_t>(v) * rowBytes;
    }
  }

  void checkRoot(int64_t root, const char* op) {
    if (root < 0 || root >= getSize())
      fail(std::string(op) + ": root rank " + std::to_string(root) + " is outside [0, " +
           std::to_string(getSize()) + ")");
  }
  void checkPeer(int peer, const char* op) {
    if (peer < 0 || peer >= getSize() || peer == getRank())
      fail(std::string(op) + ": peer rank " + std::to_string(peer) + " is invalid for rank " +
           std::to_string(getRank()) + " of " + std::to_string(getSize()));
  }
  void checkListSize(const std::vector<at::Tensor>& v, const char* op, const char* what) {
    if (static_cast<int>(v.size()) != getSize())
      fail(std::string(op) + ": the " + what + " has " + std::to_string(v.size()) +
           " tensors, expected the world size " + std::to_string(getSize()));
  }

  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, std::vector<at::Tensor> outputs,
                                        std::vector<Task> tasks) {
    size_t bytes = 0;
    for (auto& t : outputs) bytes += nbytes(t);
    auto work = c10::make_intrusive<TuttiWork>(getRank(), type, std::move(outputs), engine_,
                                               tasks.empty() ? "" : tasks.front().name);
#if !TUTTI_TORCH_V2
    {
      std::lock_guard<std::mutex> lk(coalesceMu_);
      if (coalescing_) {
        for (auto& t : tasks) coalTasks_.push_back(std::move(t));
        coalWorks_.push_back(work);
        coalBytes_ += bytes;
        return work;
      }
    }
#endif
    engine_->enqueue(std::move(tasks), {work}, bytes);
    return work;
  }

  std::shared_ptr<Engine> engine_;
  c10::intrusive_ptr<c10d::Store> store_;  // the group's own (a prefix store per group)
  uint64_t monitoredArrivals_ = 0;             // a rank's monitored-barrier arrivals so far
  std::vector<uint64_t> monitoredReceived_;    // rank 0: the arrivals met, per rank
  std::mutex coalesceMu_;
  bool coalescing_ = false;
  std::vector<Task> coalTasks_;
  std::vector<c10::intrusive_ptr<TuttiWork>> coalWorks_;
  size_t coalBytes_ = 0;
};

c10::intrusive_ptr<ProcessGroupTutti> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             ms timeout) {
  return c10::make_intrusive<ProcessGroupTutti>(store, rank, size, timeout);
}

}  // namespace tutti_torch

namespace {
// TUTTI_TORCH_TERMINATE_TRACE=1 (the tests' launcher sets it): std::terminate
// prints the calling thread's stack before the abort, so a teardown abort
// ("terminate called without an active exception", issue 30) says where it
// came from.
std::terminate_handler previousTerminate = nullptr;
void traceTerminate() {
  static const char msg[] = "tutti_torch: std::terminate; the calling thread's stack:\n";
  (void)!::write(2, msg, sizeof msg - 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  if (previousTerminate) previousTerminate();
  std::abort();
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  namespace py = pybind11;
  using tutti_torch::ProcessGroupTutti;
  const char* trace = std::getenv("TUTTI_TORCH_TERMINATE_TRACE");
  if (trace && *trace && *trace != '0') previousTerminate = std::set_terminate(traceTerminate);
  m.doc() = "tutti as a torch.distributed backend (C++ part; use the tutti_torch package)";
  py::module::import("torch.distributed");  // registers the base classes with pybind
  py::class_<ProcessGroupTutti, tutti_torch::PGBase, c10::intrusive_ptr<ProcessGroupTutti>>(m, "ProcessGroupTutti")
      .def(py::init(&tutti_torch::create), py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def("_allreduce_compressed", &ProcessGroupTutti::allreduceCompressed, py::arg("tensor"),
           py::arg("config_id"), py::arg("kind"), py::arg("rank"), py::arg("error_feedback"),
           py::arg("seed"), py::arg("key"), py::arg("rows"), py::arg("cols"), py::arg("average"),
           py::call_guard<py::gil_scoped_release>())
      .def("_compression_stats", &ProcessGroupTutti::compressionStats, py::arg("config_id"),
           py::call_guard<py::gil_scoped_release>())
      .def("_shutdown", &ProcessGroupTutti::shutdown, py::call_guard<py::gil_scoped_release>());
  m.def("create_process_group", &tutti_torch::create, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "The creator function registered with torch.distributed.Backend.register_backend.");
  m.def("tutti_version", []() { return std::string(tuttiGetVersionString()); });
  m.def("library_path", []() { return std::string(tuttiLibraryPath()); });
  m.attr("TORCH_VERSION_BUILT") = py::str(TORCH_VERSION);
}
