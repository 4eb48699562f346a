#include "core/flight_recorder.h"

#include <fmt/format.h>
#include <time.h>

#include "algo/schedule.h"
#include "base/json.h"
#include "base/types.h"

namespace tutti::core {
namespace {

int64_t coarseMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

bool isP2p(algo::Collective c) {
  return c == algo::Collective::kSend || c == algo::Collective::kRecv;
}

const char* stateName(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::kDone:
      return "done";
    case FlightRecorder::State::kFailed:
      return "failed";
    default:
      return "pending";
  }
}

std::string opText(int op) {
  // Built-in operators by name; a PreMulSum operator by its number.
  if (op >= 0 && op < 5) return redOpName(static_cast<RedOp>(op));
  return fmt::format("user op {}", op);
}

// "AllReduce of 1048576 x float sum (collective call 7)".
std::string describe(const FlightRecorder::Entry& e) {
  const char* type = dataTypeName(static_cast<DataType>(e.dt));
  if (isP2p(e.coll) && e.root < 0)
    return fmt::format("{} of {} x {} from any rank", algo::collectiveName(e.coll), e.count, type);
  if (isP2p(e.coll))
    return fmt::format("{} of {} x {} {} rank {}", algo::collectiveName(e.coll), e.count, type,
                       e.coll == algo::Collective::kSend ? "to" : "from", e.root);
  std::string s = fmt::format("{} of {} x {}", algo::collectiveName(e.coll), e.count, type);
  if (isReducing(e.coll)) s += " " + opText(e.op);
  if (algo::isRooted(e.coll)) s += fmt::format(" root {}", e.root);
  return s + fmt::format(" (collective call {})", e.call);
}

}  // namespace

FlightRecorder::FlightRecorder() : startMs_(coarseMs()) {}

double FlightRecorder::now() const { return static_cast<double>(coarseMs() - startMs_) / 1000.0; }

uint64_t FlightRecorder::record(const Op& op) {
  // The communicator's calls are made one at a time (NCCL's rule): no
  // read-modify-write needed (it was most of the cost).
  const uint64_t rec = next_.load(std::memory_order_relaxed);
  next_.store(rec + 1, std::memory_order_relaxed);
  Slot& s = slots_[rec % kCapacity];
  s.tag.store(0, std::memory_order_relaxed);  // being rewritten
  std::atomic_thread_fence(std::memory_order_release);
  s.call.store(op.call, std::memory_order_relaxed);
  s.shape.store(static_cast<uint64_t>(op.coll) | static_cast<uint64_t>(op.dt & 0xff) << 8 |
                    static_cast<uint64_t>(op.op & 0xffff) << 16 |
                    static_cast<uint64_t>(static_cast<uint32_t>(op.root)) << 32,
                std::memory_order_relaxed);
  s.count.store(op.count, std::memory_order_relaxed);
  s.calledMs.store(coarseMs() - startMs_, std::memory_order_relaxed);
  s.state.store(static_cast<uint8_t>(State::kPending), std::memory_order_relaxed);
  s.tag.store(rec + 1, std::memory_order_release);
  return rec;
}

void FlightRecorder::ended(uint64_t rec, bool ok) {
  if (rec == Op::kNotRecorded) return;
  Slot& s = slots_[rec % kCapacity];
  if (s.tag.load(std::memory_order_relaxed) != rec + 1) return;  // overwritten since
  s.state.store(static_cast<uint8_t>(ok ? State::kDone : State::kFailed),
                std::memory_order_relaxed);
}

std::vector<FlightRecorder::Entry> FlightRecorder::entries() const {
  const uint64_t next = next_.load(std::memory_order_acquire);
  const uint64_t first = next > kCapacity ? next - kCapacity : 0;
  std::vector<Entry> out;
  out.reserve(static_cast<size_t>(next - first));
  for (uint64_t rec = first; rec < next; ++rec) {
    const Slot& s = slots_[rec % kCapacity];
    if (s.tag.load(std::memory_order_acquire) != rec + 1) continue;
    Entry e;
    e.rec = rec;
    e.call = s.call.load(std::memory_order_relaxed);
    const uint64_t shape = s.shape.load(std::memory_order_relaxed);
    e.coll = static_cast<algo::Collective>(shape & 0xff);
    e.dt = static_cast<int>((shape >> 8) & 0xff);
    e.op = static_cast<int>((shape >> 16) & 0xffff);
    e.root = static_cast<int>(static_cast<uint32_t>(shape >> 32));
    e.count = s.count.load(std::memory_order_relaxed);
    e.calledAt = static_cast<double>(s.calledMs.load(std::memory_order_relaxed)) / 1000.0;
    e.state = static_cast<State>(s.state.load(std::memory_order_relaxed));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.tag.load(std::memory_order_relaxed) != rec + 1) continue;  // rewritten meanwhile
    out.push_back(e);
  }
  return out;
}

std::vector<std::string> dumpLines(const FlightDump& d) {
  std::vector<std::string> lines;
  const FlightRecorder::Entry* pending = nullptr;
  for (const auto& e : d.entries)
    if (e.state == FlightRecorder::State::kPending) {
      pending = &e;
      break;
    }
  std::string waits;
  for (int r : d.waitingOn) waits += (waits.empty() ? "" : ", ") + std::to_string(r);
  std::string head = fmt::format("flight recorder: rank {} of {} (comm {:#x}, {}): {}", d.rank,
                                 d.nranks, d.commHash, d.reason.empty() ? "dump" : "failed",
                                 d.reason.empty() ? "no error" : d.reason);
  lines.push_back(head);
  if (pending)
    lines.push_back(
        fmt::format("flight recorder: rank {} waits in operation {} ({}), pending for {:.1f} s{}",
                    d.rank, pending->rec, describe(*pending), d.at - pending->calledAt,
                    waits.empty() ? "" : ", on rank(s) " + waits));
  else
    lines.push_back(fmt::format("flight recorder: rank {} has no operation pending", d.rank));
  for (const auto& e : d.entries)
    lines.push_back(fmt::format("  op {} {} at {:.3f} s: {}", e.rec, stateName(e.state), e.calledAt,
                                describe(e)));
  return lines;
}

std::string dumpJson(const FlightDump& d) {
  std::string s = fmt::format(
      "{{\"tutti_flight_recorder\":1,\"comm\":\"{:#x}\",\"rank\":{},\"nranks\":{},\"host\":{},"
      "\"pid\":{},\"reason\":{},\"at_s\":{:.3f},\"recorded\":{},\"waiting_on\":",
      d.commHash, d.rank, d.nranks, base::jsonString(d.host), d.pid, base::jsonString(d.reason),
      d.at, d.recorded);
  s += base::jsonArray(d.waitingOn, [](int r) { return std::to_string(r); });
  s += ",\"ops\":";
  s += base::jsonArray(d.entries, [](const FlightRecorder::Entry& e) {
    std::string o = fmt::format(
        "{{\"op\":{},\"coll\":\"{}\",\"count\":{},\"datatype\":\"{}\",\"called_s\":{:.3f},"
        "\"state\":\"{}\"",
        e.rec, algo::collectiveName(e.coll), e.count, dataTypeName(static_cast<DataType>(e.dt)),
        e.calledAt, stateName(e.state));
    if (isP2p(e.coll)) return o + fmt::format(",\"peer\":{}}}", e.root);
    o += fmt::format(",\"call\":{}", e.call);
    if (isReducing(e.coll)) o += ",\"redop\":" + base::jsonString(opText(e.op));
    if (algo::isRooted(e.coll)) o += fmt::format(",\"root\":{}", e.root);
    return o + "}";
  });
  return s + "}";
}

std::string dumpPath(const std::string& pattern, const FlightDump& d) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      const char c = pattern[i + 1];
      if (c == 'h' || c == 'p' || c == 'r' || c == '%') {
        out += c == 'h'   ? d.host
               : c == 'p' ? std::to_string(d.pid)
               : c == 'r' ? std::to_string(d.rank)
                          : std::string("%");
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

}  // namespace tutti::core
