// Group plans (core/group.cc): a communicator keeps the plans it built and a
// call with the same shape reuses one with its own buffers; a changed shape
// builds anew; small reduce-scatters, all-gathers and broadcasts of a group
// fuse like all-reduces. Values are exact integers, checked element by
// element, ranks as threads through the public C API.
#include <algorithm>
#include <memory>

#include "capi/handle.h"
#include "core/group.h"
#include "harness.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// The communicator behind a handle (handle.h spells it either way).
template <class H>
auto implOf(H* h, int) -> decltype(h->impl()) {
  return h->impl();
}
template <class H>
auto implOf(H* h, long) -> decltype(h->impl.get()) {
  return h->impl.get();
}
core::Comm* commOf(ncclComm_t c) { return implOf(c, 0); }

uint64_t built(ncclComm_t c) { return core::plansBuilt(*commOf(c)); }

uint64_t messages(ncclComm_t c) {
  uint64_t n = 0;
  for (uint64_t m : commOf(c)->channelMessages()) n += m;
  return n;
}

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv };

// One operation of a group. root: the root of a broadcast; for send (recv)
// the peer is rank + root (rank - root), modulo the rank count.
struct Call {
  Kind kind;
  size_t count;
  ncclDataType_t dt = ncclInt32;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  bool inPlace = false;
  bool nullSend = false;  // a broadcast's non-roots pass NULL as sendbuff
};

// Rank q's input element i of operation k: small integers, exact in every
// datatype used here (and their sums over 5 ranks).
double value(ncclDataType_t dt, int q, size_t k, size_t i, int seed) {
  if (dt == ncclUint8) return static_cast<double>((q * 3 + k * 5 + i + seed) % 40);
  return static_cast<double>(q * 1000 + k * 37 + i % 211 + seed);
}

// Which data operation k sends: its own, but the n-th send's and the n-th
// receive's (in call order) match, so that a receive expects what its send sent.
size_t dataOf(const std::vector<Call>& calls, size_t k) {
  if (calls[k].kind != Kind::kSend && calls[k].kind != Kind::kRecv) return k;
  size_t nth = 0;
  for (size_t j = 0; j < k; ++j) nth += calls[j].kind == calls[k].kind;
  return 1000 + nth;
}

// The buffers of one call on one rank: `send` and `recv` point into `mem`,
// `pad` elements past its start (so that each round has other addresses).
struct Bufs {
  std::unique_ptr<uint8_t[]> mem;
  uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
};

// Runs `calls` as one group on rank r of n (fresh data from `seed`, buffers
// `pad` elements into fresh allocations) and checks every element of every
// result. Returns false (with failures added) when a value is wrong.
bool runAndCheck(int r, int n, ncclComm_t comm, const std::vector<Call>& calls, int seed,
                 size_t pad) {
  std::vector<Bufs> bufs(calls.size());
  const int garbage = 0xA5;
  for (size_t k = 0; k < calls.size(); ++k) {
    const Call& c = calls[k];
    const size_t es = typeSize(c.dt), blk = c.count * es;
    size_t sendBytes = blk, recvBytes = blk;
    if (c.kind == Kind::kReduceScatter) sendBytes = n * blk;
    if (c.kind == Kind::kAllGather) recvBytes = n * blk;
    if (c.kind == Kind::kSend) recvBytes = 0;
    if (c.kind == Kind::kRecv) sendBytes = 0;
    const size_t off = pad * es;
    Bufs& b = bufs[k];
    if (c.inPlace) {
      const size_t bytes = std::max(sendBytes, recvBytes);
      b.mem.reset(new uint8_t[off + bytes + 1]);
      std::memset(b.mem.get(), garbage, off + bytes + 1);
      b.send = b.recv = b.mem.get() + off;
      if (c.kind == Kind::kAllGather) b.send = b.recv + r * blk;
      if (c.kind == Kind::kReduceScatter) b.recv = b.send + r * blk;
    } else {
      b.mem.reset(new uint8_t[2 * off + sendBytes + recvBytes + 2]);
      std::memset(b.mem.get(), garbage, 2 * off + sendBytes + recvBytes + 2);
      b.send = b.mem.get() + off;
      b.recv = b.send + sendBytes + off + 1;
    }
    // The input (a broadcast's only on its root: the others' send buffers
    // keep garbage, which must not be read).
    if (c.kind == Kind::kBroadcast && r != c.root) {
      if (c.nullSend) b.send = nullptr;
      continue;
    }
    if (c.kind == Kind::kRecv) continue;
    for (size_t i = 0; i < sendBytes / es; ++i)
      storeValue(b.send + i * es, c.dt, value(c.dt, r, dataOf(calls, k), i, seed));
  }
  if (ncclGroupStart() != ncclSuccess) return false;
  for (size_t k = 0; k < calls.size(); ++k) {
    const Call& c = calls[k];
    Bufs& b = bufs[k];
    ncclResult_t rc = ncclSuccess;
    switch (c.kind) {
      case Kind::kAllReduce:
        rc = ncclAllReduce(b.send, b.recv, c.count, c.dt, c.op, comm, nullptr);
        break;
      case Kind::kReduceScatter:
        rc = ncclReduceScatter(b.send, b.recv, c.count, c.dt, c.op, comm, nullptr);
        break;
      case Kind::kAllGather:
        rc = ncclAllGather(b.send, b.recv, c.count, c.dt, comm, nullptr);
        break;
      case Kind::kBroadcast:
        rc = ncclBroadcast(b.send, b.recv, c.count, c.dt, c.root, comm, nullptr);
        break;
      case Kind::kSend:
        rc = ncclSend(b.send, c.count, c.dt, (r + c.root) % n, comm, nullptr);
        break;
      case Kind::kRecv:
        rc = ncclRecv(b.recv, c.count, c.dt, (r + n - c.root % n) % n, comm, nullptr);
        break;
    }
    EXPECT_EQ(rc, ncclSuccess) << ncclGetLastError(comm);
  }
  const ncclResult_t end = ncclGroupEnd();
  EXPECT_EQ(end, ncclSuccess) << ncclGetLastError(comm);
  if (end != ncclSuccess) return false;
  auto combine = [&](const Call& c, size_t k, size_t j) {
    double v = value(c.dt, 0, k, j, seed);
    for (int q = 1; q < n; ++q) {
      const double x = value(c.dt, q, k, j, seed);
      v = c.op == ncclMax ? std::max(v, x) : v + x;
    }
    return v;
  };
  for (size_t k = 0; k < calls.size(); ++k) {
    const Call& c = calls[k];
    if (c.kind == Kind::kSend) continue;
    const size_t es = typeSize(c.dt);
    const size_t elems = c.kind == Kind::kAllGather ? n * c.count : c.count;
    for (size_t i = 0; i < elems; ++i) {
      double want = 0;
      switch (c.kind) {
        case Kind::kAllReduce:
          want = combine(c, k, i);
          break;
        case Kind::kReduceScatter:
          want = combine(c, k, r * c.count + i);
          break;
        case Kind::kAllGather:
          want = value(c.dt, static_cast<int>(i / c.count), k, i % c.count, seed);
          break;
        case Kind::kBroadcast:
          want = value(c.dt, c.root, k, i, seed);
          break;
        case Kind::kRecv:
          want = value(c.dt, (r + n - c.root % n) % n, dataOf(calls, k), i, seed);
          break;
        default:
          break;
      }
      const double got = loadValue(bufs[k].recv + i * es, c.dt);
      if (got != want) {
        ADD_FAILURE() << "rank " << r << " of " << n << ", operation " << k << " (kind "
                      << static_cast<int>(c.kind) << ", count " << c.count << "), element " << i
                      << ": " << got << ", want " << want;
        return false;
      }
    }
  }
  return true;
}

// Every kind that fuses, several fused sets per kind (datatypes, operators,
// roots), in place and out of place, beside operations that do not fuse
// (large ones, point-to-point).
std::vector<Call> mixedGroup(int n) {
  using K = Kind;
  return {
      {K::kAllGather, 100},
      {K::kReduceScatter, 100},
      {K::kBroadcast, 100, ncclInt32, ncclSum, 0},
      {K::kAllGather, 257, ncclInt32, ncclSum, 0, true},
      {K::kSend, 300, ncclInt32, ncclSum, 1},
      {K::kReduceScatter, 33, ncclInt32, ncclSum, 0, true},
      {K::kAllGather, 1},
      {K::kAllGather, 300, ncclUint8},
      {K::kBroadcast, 333, ncclUint8, ncclSum, n - 1},
      {K::kReduceScatter, 77, ncclFloat32},
      {K::kReduceScatter, 1},
      {K::kAllReduce, 256},
      {K::kAllGather, 64, ncclInt64},
      {K::kRecv, 300, ncclInt32, ncclSum, 1},
      {K::kBroadcast, 50, ncclFloat32, ncclSum, 0, true},
      {K::kReduceScatter, 128, ncclFloat32, ncclSum, 0, true},
      {K::kReduceScatter, 50, ncclInt32, ncclMax},
      {K::kAllReduce, 100, ncclInt32, ncclSum, 0, true},
      {K::kBroadcast, 20, ncclInt64, ncclSum, n - 1, true},
      {K::kAllGather, 20000},  // 80 KB: not fused
      {K::kReduceScatter, 40, ncclInt32, ncclMax, 0, true},
      {K::kBroadcast, 30000, ncclInt32, ncclSum, n - 1},  // not fused
      {K::kBroadcast, 70, ncclInt32, ncclSum, n - 1},
      {K::kBroadcast, 90, ncclInt32, ncclSum, n - 1, false, true},
      {K::kAllReduce, 7, ncclInt32, ncclMax},
  };
}

void mixedGroupAt(int n) {
  runRanks(n, [&](int r, ncclComm_t comm) {
    const auto calls = mixedGroup(n);
    const uint64_t before = built(comm);
    for (int round = 0; round < 3; ++round)
      ASSERT_TRUE(runAndCheck(r, n, comm, calls, round * 11, 3 + round * 5))
          << n << " ranks, round " << round;
    // Built once, then reused with the later rounds' buffers.
    EXPECT_EQ(built(comm) - before, 1u) << "rank " << r << " of " << n;
  });
}

TEST(Groups, SmallCollectivesOfEachKindFuse) {
  for (int n = 1; n <= 5; ++n) mixedGroupAt(n);
}

TEST(Groups, SmallCollectivesOfEachKindFuseOverTcp) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  for (int n : {2, 3, 5}) mixedGroupAt(n);
}

// 64 of each kind of 1 KiB in one group put no more messages on the wire
// than one of 64 KiB (over TCP: every byte goes through messages).
TEST(Groups, SmallCollectivesOfEachKindTravelAsOne) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  const int n = 3;
  runRanks(n, [&](int r, ncclComm_t comm) {
    // Warm up the connections (their handshakes are not messages of a group).
    ASSERT_TRUE(runAndCheck(r, n, comm, {{Kind::kAllReduce, 1}}, 0, 0));
    for (Kind kind : {Kind::kReduceScatter, Kind::kAllGather, Kind::kBroadcast}) {
      std::vector<Call> many(64, Call{kind, 256});  // 1 KiB of int32
      for (auto& c : many) c.root = n - 1;
      const uint64_t before = messages(comm);
      ASSERT_TRUE(runAndCheck(r, n, comm, many, 1, 0));
      const uint64_t fused = messages(comm) - before;
      ASSERT_TRUE(runAndCheck(r, n, comm, {Call{kind, 64 * 256, ncclInt32, ncclSum, n - 1}}, 2, 0));
      const uint64_t one = messages(comm) - before - fused;
      // (The end of a broadcast's chain sends nothing.)
      if (kind != Kind::kBroadcast || r != n - 2) {
        EXPECT_GT(fused, 0u) << "rank " << r;
      }
      EXPECT_LE(fused, one) << "kind " << static_cast<int>(kind) << ", rank " << r << ": 64 x 1 KiB took "
                            << fused << " messages, one of 64 KiB " << one;
    }
  });
}

// Over shared memory, fused sets larger than the one-shot arena takes (and
// mixed sizes, one above the arena's limit on its own): values exact, the
// plan reused.
TEST(Groups, FusedSetsLargerThanTheArena) {
  for (int n : {2, 3}) {
    runRanks(n, [&](int r, ncclComm_t comm) {
      std::vector<Call> calls;
      for (Kind kind : {Kind::kAllReduce, Kind::kReduceScatter, Kind::kAllGather, Kind::kBroadcast})
        for (int k = 0; k < 40; ++k)
          calls.push_back({kind, k == 7 ? 16384u : 256u + 37 * (k % 5), ncclInt32, ncclSum, n - 1,
                           k % 3 == 0});
      const uint64_t before = built(comm);
      for (int round = 0; round < 2; ++round)
        ASSERT_TRUE(runAndCheck(r, n, comm, calls, round, round * 3)) << n << " ranks";
      EXPECT_EQ(built(comm) - before, 1u);
    });
  }
}

// Each change of shape builds a new plan (values exact); the shape before
// it, run again, and the changed one, run again, reuse theirs.
void changedShapes(int n) {
    runRanks(n, [&](int r, ncclComm_t comm) {
      using K = Kind;
      const std::vector<Call> base = {
          {K::kAllReduce, 256},  {K::kAllReduce, 256},
          {K::kAllGather, 100},  {K::kBroadcast, 200, ncclInt32, ncclSum, 0},
          {K::kSend, 64, ncclInt32, ncclSum, 1}, {K::kRecv, 64, ncclInt32, ncclSum, 1},
          {K::kReduceScatter, 50}, {K::kAllGather, 20000},
      };
      std::vector<std::pair<const char*, std::vector<Call>>> variants;
      auto vary = [&](const char* what, auto&& change) {
        std::vector<Call> v = base;
        change(v);
        variants.emplace_back(what, v);
      };
      vary("count", [](auto& v) { v[1].count = 300; });
      vary("datatype", [](auto& v) { v[1].dt = ncclFloat32; });
      vary("reduction", [](auto& v) { v[0].op = ncclMax; });
      vary("root", [&](auto& v) { v[3].root = n - 1; });
      vary("in place (fused)", [](auto& v) { v[2].inPlace = true; });
      vary("in place", [](auto& v) { v[7].inPlace = true; });
      vary("peer", [](auto& v) { v[4].root = v[5].root = 2; });
      vary("order", [](auto& v) { std::swap(v[2], v[3]); });
      vary("one fewer", [](auto& v) { v.pop_back(); });
      vary("kind", [](auto& v) { v[6].kind = K::kAllReduce; });
      int seed = 0;
      // In place first: the plan of the same group out of place is another.
      std::vector<Call> inPlace = base;
      inPlace[7].inPlace = true;
      ASSERT_TRUE(runAndCheck(r, n, comm, inPlace, 100, 2));
      ASSERT_TRUE(runAndCheck(r, n, comm, base, seed, 1));
      for (auto& [what, calls] : variants) {
        uint64_t b = built(comm);
        seed += 3;
        ASSERT_TRUE(runAndCheck(r, n, comm, calls, seed, seed % 7)) << what;
        EXPECT_EQ(built(comm) - b, 1u) << what << ": a new shape builds a plan";
        b = built(comm);
        ASSERT_TRUE(runAndCheck(r, n, comm, base, seed + 1, seed % 5)) << what << ", then the base";
        ASSERT_TRUE(runAndCheck(r, n, comm, calls, seed + 2, seed % 3)) << what << ", again";
        EXPECT_EQ(built(comm) - b, 0u) << what << ": both shapes are kept";
      }
    });
}

TEST(Groups, ChangedShapeRebuildsThePlan) {
  for (int n : {3, 4}) changedShapes(n);
}

// Over TCP no operation takes the one-shot path (which reads its operation
// at each call): every operation runs a schedule.
TEST(Groups, ChangedShapeRebuildsThePlanOverTcp) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  changedShapes(3);
}

// A PreMulSum operator whose scalar is read at each use (ncclScalarDevice):
// the same group with another scalar value is another shape (over TCP, where
// the fused all-reduce is a schedule, which holds the scalar).
TEST(Groups, PreMulSumScalarReadAtEachCall) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  const int n = 3;
  runRanks(n, [&](int r, ncclComm_t comm) {
    void* scalar = nullptr;
    ASSERT_EQ(ncclMemAlloc(&scalar, sizeof(float)), ncclSuccess);
    const float first = 2.0f;
    ASSERT_EQ(tuttiMemcpy(scalar, &first, sizeof first), ncclSuccess);
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, scalar, ncclFloat32, ncclScalarDevice, comm),
              ncclSuccess)
        << ncclGetLastError(comm);
    const uint64_t before = built(comm);
    constexpr size_t kCount = 300;
    for (float value : {2.0f, 3.0f, 3.0f, 0.5f, 2.0f}) {
      ASSERT_EQ(tuttiMemcpy(scalar, &value, sizeof value), ncclSuccess);
      std::vector<std::vector<float>> in(4, std::vector<float>(kCount)),
          out(4, std::vector<float>(kCount, -1));
      for (int k = 0; k < 4; ++k)
        for (size_t i = 0; i < kCount; ++i) in[k][i] = static_cast<float>(r + k + i % 7);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int k = 0; k < 4; ++k)
        ASSERT_EQ(ncclAllReduce(in[k].data(), out[k].data(), kCount, ncclFloat32, op, comm, nullptr),
                  ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
      for (int k = 0; k < 4; ++k)
        for (size_t i = 0; i < kCount; ++i)
          ASSERT_EQ(out[k][i], value * static_cast<float>(n * (k + i % 7) + (0 + 1 + 2)))
              << "scalar " << value << ", operation " << k << ", element " << i;
    }
    // 2, 3 and 0.5 built; the second 3 and the last 2 reused a kept plan.
    EXPECT_EQ(built(comm) - before, 3u);
    EXPECT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
    EXPECT_EQ(ncclMemFree(scalar), ncclSuccess);
  });
}

// Lone collectives share the mechanism: alternating shapes keep their plans;
// each changed aspect rebuilds.
TEST(Groups, LoneCollectivesKeepTheirPlans) {
  const int n = 3;
  runRanks(n, [&](int r, ncclComm_t comm) {
    const std::vector<Call> a = {{Kind::kAllReduce, 20000}}, b = {{Kind::kAllGather, 20000}},
                            c = {{Kind::kBroadcast, 20000, ncclInt32, ncclSum, 2}},
                            d = {{Kind::kBroadcast, 20000, ncclInt32, ncclSum, 1}};
    // (runAndCheck groups them; a group of one collective takes the lone
    // path's plan, and so does the call outside a group below.)
    ASSERT_TRUE(runAndCheck(r, n, comm, a, 0, 0));
    ASSERT_TRUE(runAndCheck(r, n, comm, b, 1, 0));
    ASSERT_TRUE(runAndCheck(r, n, comm, c, 2, 0));
    const uint64_t before = built(comm);
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(runAndCheck(r, n, comm, a, 3 + round, round));
      ASSERT_TRUE(runAndCheck(r, n, comm, b, 4 + round, round + 1));
      ASSERT_TRUE(runAndCheck(r, n, comm, c, 5 + round, round + 2));
    }
    EXPECT_EQ(built(comm), before);
    ASSERT_TRUE(runAndCheck(r, n, comm, d, 9, 0));
    EXPECT_EQ(built(comm), before + 1);
    // Outside a group, with other buffers each time.
    for (int round = 0; round < 3; ++round) {
      std::vector<int32_t> in(20000 + round), out(20000 + round, -1);
      for (size_t i = 0; i < 20000; ++i) in[round + i] = static_cast<int32_t>(r * 100 + i + round);
      ASSERT_EQ(ncclAllReduce(in.data() + round, out.data() + round, 20000, ncclInt32, ncclSum,
                              comm, nullptr),
                ncclSuccess);
      for (size_t i = 0; i < 20000; ++i)
        ASSERT_EQ(out[round + i], static_cast<int32_t>(300 + 3 * (i + round))) << i;
    }
    EXPECT_EQ(built(comm), before + 1);
  });
}

// A fused set reads every input before it writes any result (docs/api.md,
// ncclGroupEnd): every part in place on one buffer (as tutti-perf -m runs
// them) reduces the original input, and so does each part of a chain that
// reads the previous part's result. Over shared memory and TCP, 2 and 3 ranks.
void fusedInputsFirst(int n) {
  constexpr int kOps = 64;
  constexpr size_t kCount = 256;  // 1 KiB of int32
  runRanks(n, [&](int r, ncclComm_t comm) {
    auto input = [&](int q, int k, size_t i) {
      return static_cast<int32_t>(q * 7 + k * 1000 + static_cast<int>(i % 97));
    };
    auto sum = [&](int k, size_t i) {
      int32_t s = 0;
      for (int q = 0; q < n; ++q) s += input(q, k, i);
      return s;
    };
    std::vector<int32_t> one(kCount);
    for (size_t i = 0; i < kCount; ++i) one[i] = input(r, 5, i);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int k = 0; k < kOps; ++k)
      ASSERT_EQ(ncclAllReduce(one.data(), one.data(), kCount, ncclInt32, ncclSum, comm, nullptr),
                ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
    for (size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(one[i], sum(5, i)) << n << " ranks, one buffer, element " << i;
    // A chain: part k reads buffer k and writes buffer k + 1.
    std::vector<std::vector<int32_t>> chain(kOps + 1, std::vector<int32_t>(kCount));
    for (int k = 0; k <= kOps; ++k)
      for (size_t i = 0; i < kCount; ++i) chain[k][i] = input(r, k, i);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int k = 0; k < kOps; ++k)
      ASSERT_EQ(ncclAllReduce(chain[k].data(), chain[k + 1].data(), kCount, ncclInt32, ncclSum,
                              comm, nullptr),
                ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(comm);
    for (int k = 0; k < kOps; ++k)
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(chain[k + 1][i], sum(k, i))
            << n << " ranks, chain, operation " << k << ", element " << i;
  });
}

TEST(Groups, AFusedSetReadsEveryInputBeforeItWritesAResult) {
  for (int n : {2, 3}) fusedInputsFirst(n);
}

TEST(Groups, AFusedSetReadsEveryInputBeforeItWritesAResultOverTcp) {
  Env env({std::make_pair("NCCL_SHM_DISABLE", "1")});
  for (int n : {2, 3}) fusedInputsFirst(n);
}

}  // namespace
}  // namespace tutti::test
