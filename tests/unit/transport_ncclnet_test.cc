// NCCL net plugins as a tutti transport (transports/ncclnet): the loader's
// rules and errors, the adapter's handshake, registration and retries, and
// byte streams over it (transports/net_stream.h). The plugins are the test
// ones of tests/netplugin (TCP on 127.0.0.1), built against the ABI facts in
// transports/ncclnet/net_abi.h: "TestSock" exports ncclNetPlugin_v8 only,
// "TestSock10" ncclNetPlugin_v10 only. ctest runs each test in its own
// process, so a plugin's one-per-process init is fresh in each, and the
// plugins' knobs (TSOCK_*) are read on every call.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport_test_util.h"
#include "transports/ncclnet/nccl_net.h"
#include "transports/net.h"
#include "transports/net_stream.h"

namespace tutti::transport {
namespace {

using namespace std::chrono_literals;
using testing::connectBoth;
using testing::Pair;
using testing::pump;

const std::string kDir = TUTTI_TEST_NET_PLUGIN_DIR;
const std::string kV8 = kDir + "/libnccl-net-tsock.so";
const std::string kV10 = kDir + "/libnccl-net-tsock10.so";
const std::string kNoSym = kDir + "/libnccl-net-nosym.so";

NetTransport* load(const std::string& setting) {
  auto r = ncclnet::loadPlugin(setting);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? *r : nullptr;
}

using CommResult = Result<std::unique_ptr<NetComm>>;
std::pair<CommResult, CommResult> connectComms(NetTransport& t, Pair& p) {
  CommResult r1 = Status(Code::kInternalError, "not run");
  std::thread th([&] { r1 = t.connect(p.ctx(1)); });
  CommResult r0 = t.connect(p.ctx(0));
  th.join();
  return {std::move(r0), std::move(r1)};
}

TEST(NcclNet, LoadsTheV8TableByPathAndTheSameObjectTwice) {
  NetTransport* t = load(kV8);
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name(), "TestSock");
  EXPECT_FALSE(t->supportsDeviceMemory());  // the plugin says NCCL_PTR_HOST only
  EXPECT_EQ(load(kV8), t);
}

TEST(NcclNet, LoadsTheV10Table) {
  NetTransport* t = load(kV10);
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name(), "TestSock10");
}

// As NCCL: a name X is libnccl-net-X.so through the loader's search path.
// The dynamic loader reads LD_LIBRARY_PATH at start: ctest runs this test
// once more as unit.ncclnet_name_on_library_path with the plugins' folder
// on it (tests/CMakeLists.txt); without it, it skips.
TEST(NcclNet, ANameIsLibncclNetNameOnTheLibraryPath) {
  const char* path = std::getenv("LD_LIBRARY_PATH");
  if (!path || std::string(path).find(kDir) == std::string::npos)
    GTEST_SKIP() << "needs " << kDir << " on LD_LIBRARY_PATH (unit.ncclnet_name_on_library_path)";
  NetTransport* t = load("tsock10");
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->name(), "TestSock10");
}

TEST(NcclNet, UnsetWithoutLibncclNetAndNoneMeanNoPlugin) {
  auto unset = ncclnet::loadPlugin("");
  ASSERT_TRUE(unset.isOk()) << unset.status().message();
  EXPECT_EQ(*unset, nullptr);
  auto none = ncclnet::loadPlugin("none");
  ASSERT_TRUE(none.isOk()) << none.status().message();
  EXPECT_EQ(*none, nullptr);
}

TEST(NcclNet, AMissingPluginSaysWhatWasTried) {
  auto r = ncclnet::loadPlugin("no-such-net");
  ASSERT_FALSE(r.isOk());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("NCCL_NET_PLUGIN=no-such-net"), std::string::npos) << m;
  EXPECT_NE(m.find("libnccl-net-no-such-net.so"), std::string::npos) << m;
  // The same answer again, without a second attempt.
  auto again = ncclnet::loadPlugin("no-such-net");
  ASSERT_FALSE(again.isOk());
  EXPECT_EQ(again.status().message(), m);
}

TEST(NcclNet, ALibraryWithoutATableIsRefusedByName) {
  auto r = ncclnet::loadPlugin(kNoSym);
  ASSERT_FALSE(r.isOk());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("exports none of ncclNetPlugin_v10, _v9, _v8"), std::string::npos) << m;
  EXPECT_NE(m.find(kNoSym), std::string::npos) << m;
}

TEST(NcclNet, AFailedInitIsAnErrorNamingThePlugin) {
  setenv("TSOCK_INIT_FAIL", "1", 1);
  auto r = ncclnet::loadPlugin(kV10);
  unsetenv("TSOCK_INIT_FAIL");
  ASSERT_FALSE(r.isOk());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("TestSock10"), std::string::npos) << m;
  EXPECT_NE(m.find("init returned ncclInternalError"), std::string::npos) << m;
}

TEST(NcclNet, RegisteringARangeTwiceOrInsideOneIsTheSameRegion) {
  NetTransport* t = load(kV8);
  ASSERT_NE(t, nullptr);
  Pair p;
  auto [c0, c1] = connectComms(*t, p);
  ASSERT_TRUE(c0.isOk()) << c0.status().message();
  ASSERT_TRUE(c1.isOk()) << c1.status().message();
  std::vector<uint8_t> a(1 << 20), b(4096);
  auto r1 = (*c0)->registerMemory(a.data(), a.size(), MemKind::kHost);
  auto r2 = (*c0)->registerMemory(a.data(), a.size(), MemKind::kHost);
  auto r3 = (*c0)->registerMemory(a.data() + 4096, 8192, MemKind::kHost);
  auto r4 = (*c0)->registerMemory(b.data(), b.size(), MemKind::kHost);
  ASSERT_TRUE(r1.isOk() && r2.isOk() && r3.isOk() && r4.isOk());
  EXPECT_EQ(*r1, *r2);
  EXPECT_EQ(*r1, *r3);
  EXPECT_NE(*r1, *r4);
  // A host-only plugin refuses device memory, saying so.
  auto dev = (*c0)->registerMemory(b.data(), b.size(), MemKind::kDevice);
  ASSERT_FALSE(dev.isOk());
  EXPECT_NE(dev.status().message().find("cannot take device memory"), std::string::npos)
      << dev.status().message();
}

// What a plugin refuses comes back as its result, named: here a buffer
// outside the region it was registered in (the plugin checks).
TEST(NcclNet, APluginErrorIsReturnedWithTheCallAndThePeer) {
  NetTransport* t = load(kV8);
  ASSERT_NE(t, nullptr);
  Pair p;
  auto [c0, c1] = connectComms(*t, p);
  ASSERT_TRUE(c0.isOk() && c1.isOk());
  std::vector<uint8_t> a(4096), b(4096);
  auto mr = (*c0)->registerMemory(a.data(), a.size(), MemKind::kHost);
  ASSERT_TRUE(mr.isOk());
  auto r = (*c0)->isend(b.data(), b.size(), *mr);
  ASSERT_FALSE(r.isOk());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("isend returned ncclInvalidUsage"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
}

// Bytes both ways at once, in random pieces, through slots of 128 KiB:
// messages of every size from 1 byte to a full slot, values checked.
void streamBothWays(const std::string& plugin, size_t bufferBytes) {
  NetTransport* net = load(plugin);
  ASSERT_NE(net, nullptr);
  auto t = makeStreamTransport(net);
  Pair p;
  auto [c0, c1] = connectBoth(*t, *t, p.ctx(0, 0, 10s, bufferBytes), p.ctx(1, 0, 10s, bufferBytes));
  ASSERT_TRUE(c0.isOk()) << c0.status().message();
  ASSERT_TRUE(c1.isOk()) << c1.status().message();
  EXPECT_STREQ((*c0)->name(), net->name());
  const uint64_t total = 6u << 20;
  Status s1;
  std::thread th([&] { s1 = pump(**c1, total + 3, 11, total, 10, 300000, 2); });
  Status s0 = pump(**c0, total, 10, total + 3, 11, 300000, 1);
  th.join();
  EXPECT_TRUE(s0.isOk()) << s0.message();
  EXPECT_TRUE(s1.isOk()) << s1.message();
  // Every message has left before the connections go.
  for (auto* c : {c0->get(), c1->get()}) {
    auto idle = c->progress();
    for (int i = 0; i < 100000 && idle.isOk() && !*idle; ++i) idle = c->progress();
    ASSERT_TRUE(idle.isOk()) << idle.status().message();
    EXPECT_TRUE(*idle);
  }
}

TEST(NcclNetStream, MovesBytesBothWaysOverV8) { streamBothWays(kV8, 1 << 20); }
TEST(NcclNetStream, MovesBytesBothWaysOverV10) { streamBothWays(kV10, 1 << 20); }

// The plugin hands out no comm for the first calls of connect and accept,
// and no request on every other isend and irecv: tutti calls again.
TEST(NcclNetStream, RetriesNullCommsAndNullRequests) {
  setenv("TSOCK_NULL_COMMS", "5", 1);
  setenv("TSOCK_NULL_REQUESTS", "1", 1);
  streamBothWays(kV8, 64 << 10);
  unsetenv("TSOCK_NULL_COMMS");
  unsetenv("TSOCK_NULL_REQUESTS");
}

TEST(NcclNetStream, PeekReadsAMessageInPlace) {
  NetTransport* net = load(kV10);
  ASSERT_NE(net, nullptr);
  auto t = makeStreamTransport(net);
  Pair p;
  auto [c0, c1] = connectBoth(*t, *t, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(c0.isOk() && c1.isOk());
  EXPECT_TRUE((*c1)->supportsPeek());
  const char hdr[] = "head", body[] = "and its payload";
  auto n = (*c0)->trySend2(hdr, 4, body, sizeof body);
  ASSERT_TRUE(n.isOk()) << n.status().message();
  ASSERT_EQ(*n, 4 + sizeof body);
  std::string got;
  auto end = Clock::now() + 10s;
  while (got.size() < 4 + sizeof body && Clock::now() < end) {
    ASSERT_TRUE((*c0)->progress().isOk());
    size_t avail = 0;
    const void* q = (*c1)->peek(&avail);
    if (!q) continue;
    got.append(static_cast<const char*>(q), avail);
    (*c1)->consume(avail);
  }
  EXPECT_EQ(got, std::string("head") + std::string(body, sizeof body));
}

TEST(NcclNet, ConnectEndsAtTheDeadlineWhenThePeerNeverComes) {
  NetTransport* t = load(kV8);
  ASSERT_NE(t, nullptr);
  Pair p;
  auto start = Clock::now();
  auto r = t->connect(p.ctx(0, 0, 300ms));
  auto took = Clock::now() - start;
  ASSERT_FALSE(r.isOk());
  EXPECT_LT(took, 3s);
  EXPECT_NE(r.status().message().find("rank 1"), std::string::npos) << r.status().message();
}

// The peer published its handle and gave up (its listen closed): this side's
// connect fails at once, naming the peer and the plugin's answer, instead
// of waiting for the deadline.
TEST(NcclNet, ConnectFailsAtOnceWhenThePeerGaveUp) {
  NetTransport* t = load(kV8);
  ASSERT_NE(t, nullptr);
  Pair p;
  std::thread th([&] { (void)t->connect(p.ctx(1, 0, 1ms)); });
  th.join();
  auto start = Clock::now();
  auto r = t->connect(p.ctx(0, 0, 20s));
  auto took = Clock::now() - start;
  ASSERT_FALSE(r.isOk());
  EXPECT_LT(took, 5s);
  const std::string m = r.status().message();
  EXPECT_NE(m.find("connecting to rank 1"), std::string::npos) << m;
  EXPECT_NE(m.find("connect returned ncclRemoteError"), std::string::npos) << m;
}

TEST(NcclNet, ConnectEndsOnAbort) {
  NetTransport* t = load(kV8);
  ASSERT_NE(t, nullptr);
  Pair p;
  std::thread aborter([&] {
    std::this_thread::sleep_for(100ms);
    p.abort = true;
  });
  auto start = Clock::now();
  auto r = t->connect(p.ctx(0, 0, 30s));
  auto took = Clock::now() - start;
  aborter.join();
  ASSERT_FALSE(r.isOk());
  EXPECT_LT(took, 2s);
}

TEST(NcclNetStream, APeerThatLeftIsAnErrorNotAHang) {
  NetTransport* net = load(kV8);
  ASSERT_NE(net, nullptr);
  auto t = makeStreamTransport(net);
  Pair p;
  auto [c0, c1] = connectBoth(*t, *t, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(c0.isOk() && c1.isOk());
  c1->reset();  // rank 1 closes its comms
  uint8_t b[16];
  Status st;
  auto end = Clock::now() + 5s;
  while (Clock::now() < end) {
    auto r = (*c0)->tryRecv(b, sizeof b);
    if (!r.isOk()) {
      st = r.status();
      break;
    }
    ASSERT_EQ(*r, 0u);
  }
  ASSERT_FALSE(st.isOk()) << "no error 5 s after the peer closed";
  EXPECT_NE(st.message().find("TestSock"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
}

TEST(NcclNetStream, AbortMakesEveryCallFail) {
  NetTransport* net = load(kV8);
  ASSERT_NE(net, nullptr);
  auto t = makeStreamTransport(net);
  Pair p;
  auto [c0, c1] = connectBoth(*t, *t, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(c0.isOk() && c1.isOk());
  (*c0)->abort();
  uint8_t b[16] = {};
  EXPECT_FALSE((*c0)->trySend(b, sizeof b).isOk());
  EXPECT_FALSE((*c0)->tryRecv(b, sizeof b).isOk());
}

}  // namespace
}  // namespace tutti::transport
