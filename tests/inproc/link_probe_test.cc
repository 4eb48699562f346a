// The cost model's inter-node figures at init (core/link_probe.h, Comm::
// agreeOnSelection): every ring link between two nodes is measured from its
// sending rank when the communicator spans nodes (TUTTI_TEST_NODES pretends
// it does), rank 0 takes the medians, and every rank agrees on them; TUTTI_LINK_PROBE=0 keeps the
// defaults; figures in a TUTTI_TOPO_FILE win over measured ones, field by field. Each test also
// runs an all-reduce afterwards: the probe must leave the connection it used
// clean for the executor.
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <mutex>

#include "base/log.h"
#include "capi/handle.h"
#include "harness.h"
#include "topology/topology.h"

namespace tutti::test {
namespace {

const algo::CostModel kDefaults{};

// Every rank's cost model after init, and an all-reduce checked on each.
std::vector<algo::CostModel> costModels(int n) {
  std::vector<algo::CostModel> models(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    models[r] = comm->impl()->costModel();
    std::vector<int32_t> in(100003), out(in.size(), 0);
    for (size_t i = 0; i < in.size(); ++i) in[i] = r + static_cast<int32_t>(i % 11);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), in.size(), ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(out[i], n * (n - 1) / 2 + n * static_cast<int32_t>(i % 11)) << "index " << i;
  });
  return models;
}

void expectSameEverywhere(const std::vector<algo::CostModel>& m) {
  for (size_t r = 1; r < m.size(); ++r) {
    EXPECT_EQ(m[r].inter.latencyUs, m[0].inter.latencyUs) << "rank " << r;
    EXPECT_EQ(m[r].inter.bandwidthGBs, m[0].inter.bandwidthGBs) << "rank " << r;
    EXPECT_EQ(m[r].intra.latencyUs, m[0].intra.latencyUs) << "rank " << r;
    EXPECT_EQ(m[r].intra.bandwidthGBs, m[0].intra.bandwidthGBs) << "rank " << r;
  }
}

void expectMeasured(const algo::LinkModel& l) {
  EXPECT_TRUE(std::isfinite(l.latencyUs)) << l.latencyUs;
  EXPECT_GT(l.latencyUs, 0);
  EXPECT_LT(l.latencyUs, 1e6);  // below a second, even on a busy machine
  EXPECT_TRUE(std::isfinite(l.bandwidthGBs)) << l.bandwidthGBs;
  EXPECT_GT(l.bandwidthGBs, 1e-4);
  // Exactly the defaults would mean nothing was measured.
  EXPECT_FALSE(l.latencyUs == kDefaults.inter.latencyUs &&
               l.bandwidthGBs == kDefaults.inter.bandwidthGBs);
}

struct Layout {
  const char* nodes;
  int n;
  bool tcp;
};

class LinkProbe : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    setenv("TUTTI_TEST_NODES", GetParam().nodes, 1);
    setenv("NCCL_SHM_DISABLE", GetParam().tcp ? "1" : "0", 1);
  }
  void TearDown() override {
    for (const char* v : {"TUTTI_TEST_NODES", "NCCL_SHM_DISABLE", "TUTTI_LINK_PROBE"}) unsetenv(v);
  }
};

// Across (pretend) nodes the inter-node figures are measured, finite and
// positive, and every rank holds rank 0's; the intra-node ones stay defaults.
TEST_P(LinkProbe, MultiNodeMeasuresAndAgrees) {
  auto m = costModels(GetParam().n);
  ASSERT_EQ(m.size(), static_cast<size_t>(GetParam().n));
  expectMeasured(m[0].inter);
  EXPECT_EQ(m[0].intra.latencyUs, kDefaults.intra.latencyUs);
  EXPECT_EQ(m[0].intra.bandwidthGBs, kDefaults.intra.bandwidthGBs);
  expectSameEverywhere(m);
}

TEST_P(LinkProbe, OffKeepsDefaults) {
  setenv("TUTTI_LINK_PROBE", "0", 1);
  auto m = costModels(GetParam().n);
  for (const auto& c : m) {
    EXPECT_EQ(c.inter.latencyUs, kDefaults.inter.latencyUs);
    EXPECT_EQ(c.inter.bandwidthGBs, kDefaults.inter.bandwidthGBs);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, LinkProbe,
                         ::testing::Values(Layout{"1,1", 2, false}, Layout{"2,2", 4, false},
                                           Layout{"1,2,3", 6, false}, Layout{"2,2", 4, true},
                                           Layout{"2,1", 3, true}),
                         [](const ::testing::TestParamInfo<Layout>& i) {
                           std::string s = i.param.tcp ? "Tcp" : "Shm";
                           for (const char* p = i.param.nodes; *p; ++p) s += *p == ',' ? '_' : *p;
                           return s;
                         });

// On one node nothing is measured: the defaults stay.
TEST(LinkProbeOneNode, KeepsDefaults) {
  auto m = costModels(3);
  for (const auto& c : m) {
    EXPECT_EQ(c.inter.latencyUs, kDefaults.inter.latencyUs);
    EXPECT_EQ(c.inter.bandwidthGBs, kDefaults.inter.bandwidthGBs);
  }
}

// A topology file naming this machine's figures (tutti-topo --dump plus the
// Tutti* attributes).
std::string topoFileWith(std::optional<double> interLat, std::optional<double> interBw) {
  auto t = topo::forThisProcess();
  EXPECT_TRUE(t.isOk()) << t.status().message();
  if (!t.isOk()) return "";
  t->interLatencyUs = interLat;
  t->interBandwidthGBs = interBw;
  t->intraLatencyUs = 0.75;
  std::string path =
      ::testing::TempDir() + "tutti_link_probe_topo." + std::to_string(getpid()) + ".xml";
  Status st = topo::dumpXml(*t, path);
  EXPECT_TRUE(st.isOk()) << st.message();
  return path;
}

// Both inter-node figures in the topology file: no probe, the file's figures.
TEST(LinkProbeTopology, FileFiguresTakePrecedence) {
  const std::string path = topoFileWith(7.5, 3.25);
  ASSERT_FALSE(path.empty());
  setenv("TUTTI_TOPO_FILE", path.c_str(), 1);
  setenv("TUTTI_TEST_NODES", "2,2", 1);
  auto m = costModels(4);
  unsetenv("TUTTI_TOPO_FILE");
  unsetenv("TUTTI_TEST_NODES");
  std::remove(path.c_str());
  for (const auto& c : m) {
    EXPECT_EQ(c.inter.latencyUs, 7.5);
    EXPECT_EQ(c.inter.bandwidthGBs, 3.25);
    EXPECT_EQ(c.intra.latencyUs, 0.75);
    EXPECT_EQ(c.intra.bandwidthGBs, kDefaults.intra.bandwidthGBs);
  }
}

// Only the bandwidth in the file: it stays, the latency is measured.
TEST(LinkProbeTopology, MissingFigureIsMeasured) {
  const std::string path = topoFileWith(std::nullopt, 3.25);
  ASSERT_FALSE(path.empty());
  setenv("TUTTI_TOPO_FILE", path.c_str(), 1);
  setenv("TUTTI_TEST_NODES", "1,2", 1);
  auto m = costModels(3);
  unsetenv("TUTTI_TOPO_FILE");
  unsetenv("TUTTI_TEST_NODES");
  std::remove(path.c_str());
  expectSameEverywhere(m);
  EXPECT_EQ(m[0].inter.bandwidthGBs, 3.25);
  EXPECT_TRUE(std::isfinite(m[0].inter.latencyUs));
  EXPECT_GT(m[0].inter.latencyUs, 0);
  EXPECT_NE(m[0].inter.latencyUs, kDefaults.inter.latencyUs);
}

// Each sending rank logs the link it measured, rank 0 what the cost model
// uses (INFO, TUNING).
TEST(LinkProbeLog, InfoLinesSayWhatWasMeasured) {
  std::string path = ::testing::TempDir() + "tutti_link_probe_log.%p.txt";
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  setenv("NCCL_DEBUG_FILE", path.c_str(), 1);
  setenv("TUTTI_TEST_NODES", "2,2", 1);
  log::reset();
  auto m = costModels(4);
  for (const char* v : {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "TUTTI_TEST_NODES"})
    unsetenv(v);
  log::reset();
  std::string file =
      ::testing::TempDir() + "tutti_link_probe_log." + std::to_string(getpid()) + ".txt";
  std::ifstream in(file);
  ASSERT_TRUE(in.good()) << file;
  int probeLines = 0, modelLines = 0;
  std::string l;
  while (std::getline(in, l)) {
    for (const char* link : {"[1] NCCL INFO link probe: rank 1 (node 0) -> rank 2 (node 1) over "
                             "shm: latency",
                             "[3] NCCL INFO link probe: rank 3 (node 1) -> rank 0 (node 0) over "
                             "shm: latency"})
      if (l.find(link) != std::string::npos) probeLines++;
    if (l.find("cost model: intra-node 1 us 5 GB/s (defaults), inter-node") != std::string::npos &&
        l.find("(measured at init)") != std::string::npos)
      modelLines++;
  }
  std::remove(file.c_str());
  EXPECT_EQ(probeLines, 2);
  EXPECT_EQ(modelLines, 1);
}

}  // namespace
}  // namespace tutti::test
