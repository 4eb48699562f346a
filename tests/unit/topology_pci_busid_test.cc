// PCI bus ids as device backends give them (devicePciBusId) matched against
// the topology: topo::parsePciBusId, findPciDevice, numaNodeNear; a network
// interface's NIC: findNetDevice
// (topology/topology.h), on the fixture the engine placement test uses
// (tests/device/data/topo_2numa_2cpu_xpu.xml).
#include <gtest/gtest.h>

#include <string>

#include "topology/topology.h"

namespace tutti::topo {
namespace {

TEST(PciBusId, ParsesHwlocCudaAndShortForms) {
  const uint64_t want = 0x17ull << 16;  // 0000:17:00.0
  EXPECT_EQ(parsePciBusId("0000:17:00.0"), want);
  EXPECT_EQ(parsePciBusId("00000000:17:00.0"), want);  // CUDA's 8-digit domain
  EXPECT_EQ(parsePciBusId("17:00.0"), want);           // domain left out: 0
  EXPECT_EQ(parsePciBusId("0000:AB:1f.7"), parsePciBusId("0000:ab:1F.7"));
  EXPECT_EQ(parsePciBusId("0001:ab:1f.7"), 1ull << 32 | 0xabull << 16 | 0x1full << 8 | 7);
  EXPECT_NE(parsePciBusId("0001:17:00.0"), want);
  EXPECT_NE(parsePciBusId("0000:17:00.1"), want);
}

TEST(PciBusId, RejectsWhatIsNotOne) {
  for (const char* bad :
       {"", "0000:17:00", "17.0", "0000:17:00.", "0000:17:00.8", "0000:17:20.0", "0000:117:00.0",
        "000000000:17:00.0", "0:0:17:00.0", "0000:xx:00.0", "0000:17:00.0 ", "card1"})
    EXPECT_FALSE(parsePciBusId(bad).has_value()) << "'" << bad << "'";
}

std::string fixture() {
  std::string f = __FILE__;
  return f.substr(0, f.find_last_of('/')) + "/../device/data/topo_2numa_2cpu_xpu.xml";
}

TEST(PciBusId, FindsTheDeviceAndItsNode) {
  if (!hwlocReadsAnyXml())
    GTEST_SKIP() << "hwloc cannot read the hand-written fixture here: its libxml2 reader (Debian "
                    "package libhwloc-plugins) is not installed or HWLOC_LIBXML=0";
  auto t = loadXml(fixture());
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_EQ(t.value().numaNodes.size(), 2u);
  EXPECT_EQ(t.value().numaNodes[0].cpus, std::vector<int>{0});
  EXPECT_EQ(t.value().numaNodes[1].cpus, std::vector<int>{1});
  for (const char* id : {"0000:65:00.0", "65:00.0", "00000000:65:00.0", "0000:65:00.0"}) {
    const PciDevice* d = findPciDevice(t.value(), id);
    ASSERT_NE(d, nullptr) << id;
    EXPECT_EQ(d->busId, "0000:65:00.0");
    EXPECT_EQ(d->kind, PciKind::kAccelerator);
    EXPECT_EQ(numaNodeNear(*d), 1) << id;
  }
  const PciDevice* d0 = findPciDevice(t.value(), "0000:17:00.0");
  ASSERT_NE(d0, nullptr);
  EXPECT_EQ(numaNodeNear(*d0), 0);
  EXPECT_EQ(findPciDevice(t.value(), "0000:66:00.0"), nullptr);
  EXPECT_EQ(findPciDevice(t.value(), ""), nullptr);
  EXPECT_EQ(findPciDevice(t.value(), "not a bus id"), nullptr);
}

TEST(PciBusId, NearestNodeWhenNotUnderOne) {
  PciDevice d;
  EXPECT_EQ(numaNodeNear(d), -1);
  d.nearestNuma = 3;
  EXPECT_EQ(numaNodeNear(d), 3);
  d.numaNode = 2;
  EXPECT_EQ(numaNodeNear(d), 2);
}

// A network interface's NIC (findNetDevice): the fixture names its NIC under
// NUMA 1 "lo".
TEST(PciBusId, FindsTheNicOfAnInterface) {
  if (!hwlocReadsAnyXml()) GTEST_SKIP() << "hwloc cannot read the fixture here (libhwloc-plugins)";
  auto t = loadXml(fixture());
  ASSERT_TRUE(t.isOk()) << t.status().message();
  const PciDevice* nic = findNetDevice(t.value(), "lo");
  ASSERT_NE(nic, nullptr);
  EXPECT_EQ(nic->busId, "0000:67:00.0");
  EXPECT_EQ(nic->kind, PciKind::kNic);
  EXPECT_EQ(numaNodeNear(*nic), 1);
  EXPECT_EQ(findNetDevice(t.value(), "eth9"), nullptr);
  EXPECT_EQ(findNetDevice(t.value(), "l"), nullptr);  // whole names only
  EXPECT_EQ(findNetDevice(t.value(), ""), nullptr);
}

}  // namespace
}  // namespace tutti::topo
