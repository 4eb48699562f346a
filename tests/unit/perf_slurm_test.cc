// tutti-perf under srun without PMI (bench/tutti_perf/slurm.h): the first
// host of a Slurm host list and the root port of a job step.
#include "slurm.h"

#include <gtest/gtest.h>

#include <set>

namespace tutti::perf {
namespace {

TEST(SlurmHostList, FirstHostOfEachForm) {
  EXPECT_EQ(firstSlurmHost("node001"), "node001");
  EXPECT_EQ(firstSlurmHost("a,b,c"), "a");
  EXPECT_EQ(firstSlurmHost("node[007-010,012],gpu01"), "node007");
  EXPECT_EQ(firstSlurmHost("node[12,3-4]"), "node12");  // as written, not sorted
  EXPECT_EQ(firstSlurmHost("rack[1-2]-n[03-04]"), "rack1-n03");
  EXPECT_EQ(firstSlurmHost("n[0099]x"), "n0099x");  // zero padding kept
  EXPECT_EQ(firstSlurmHost("localhost"), "localhost");
}

TEST(SlurmHostList, MalformedListsGiveNothing) {
  EXPECT_EQ(firstSlurmHost(""), "");
  EXPECT_EQ(firstSlurmHost(",a"), "");
  EXPECT_EQ(firstSlurmHost("node[1-4"), "");
  EXPECT_EQ(firstSlurmHost("node[]"), "");
  EXPECT_EQ(firstSlurmHost("node[-3]"), "");
  EXPECT_EQ(firstSlurmHost("node]1["), "");
}

TEST(SlurmRootPort, DistinctPerStepAndBelowTheEphemeralRange) {
  EXPECT_EQ(slurmRootPort("0", "0"), 20000);
  EXPECT_EQ(slurmRootPort("1", "2"), 20066);
  std::set<int> ports;
  for (int job = 1000; job < 1010; ++job)
    for (int step = 0; step < 5; ++step) {
      int p = slurmRootPort(std::to_string(job), std::to_string(step));
      EXPECT_GE(p, 20000);
      EXPECT_LT(p, 32000);
      ports.insert(p);
    }
  EXPECT_EQ(ports.size(), 50u);
  EXPECT_LT(slurmRootPort("4294967294", "4294967294"), 32000);  // the batch step's id
  EXPECT_EQ(slurmRootPort("", "0"), -1);
  EXPECT_EQ(slurmRootPort("12a", "0"), -1);
  EXPECT_EQ(slurmRootPort("12", "-1"), -1);
}

}  // namespace
}  // namespace tutti::perf
