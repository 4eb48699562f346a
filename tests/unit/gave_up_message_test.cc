// core::gaveUpMessage (bootstrap.h): how a rank reports a peer's failure
// notice. A failure passed on from rank to rank keeps its root cause and
// says how many ranks it passed through, instead of growing by one
// "gave up" per rank (a 7-rank soak once cut the chain off before the
// dead rank's name).
#include <gtest/gtest.h>

#include <string>

#include "core/bootstrap.h"

namespace tutti::core {
namespace {

TEST(GaveUpMessage, FirstHopQuotesTheCause) {
  EXPECT_EQ(gaveUpMessage("rank 1 (host a, pid 7)", "rank 0 (host a, pid 6) is gone"),
            "rank 1 (host a, pid 7) gave up after an error of its own: rank 0 (host a, pid 6) "
            "is gone");
}

TEST(GaveUpMessage, ChainsAreCutToTheRootCause) {
  std::string m = "collective mismatch: rank 3 called Broadcast root 1";
  // Passed on from rank 0 to rank 1 to ... to rank 5, each quoting the last.
  for (int r = 0; r < 6; ++r)
    m = gaveUpMessage("rank " + std::to_string(r) + " (host a, pid " + std::to_string(100 + r) +
                          ")",
                      m);
  EXPECT_EQ(m,
            "rank 5 (host a, pid 105) gave up after an error of its own (passed on by 5 more "
            "ranks): collective mismatch: rank 3 called Broadcast root 1");
  // One hop: singular.
  EXPECT_EQ(gaveUpMessage("rank 2 (b)", "rank 1 (b) gave up after an error of its own: x"),
            "rank 2 (b) gave up after an error of its own (passed on by 1 more rank): x");
}

TEST(GaveUpMessage, OnlyALeadingReportIsCut) {
  // "gave up" inside the cause (after a ": ") is the cause's own text.
  const std::string cause = "timeout: rank 2 (b) gave up after an error of its own: y";
  EXPECT_EQ(gaveUpMessage("rank 4 (b)", cause),
            "rank 4 (b) gave up after an error of its own: " + cause);
}

}  // namespace
}  // namespace tutti::core
