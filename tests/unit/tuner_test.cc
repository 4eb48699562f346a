// Run-time tuning's policy (core/tuner.h), without a communicator: which
// setting each call of a class runs, how a stage's figures become the next
// incumbent, and what TUTTI_TUNE means. Every rank runs this same logic on
// the same sums, so agreement between ranks follows from determinism, which
// the last test checks.
#include "core/tuner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace tutti::core {
namespace {

using Algo = algo::CollArgs::Algo;
using algo::Collective;
constexpr double kInf = std::numeric_limits<double>::infinity();

Tuner::Options options(unsigned knobs) {
  Tuner::Options o;
  o.knobs = knobs;
  o.minBytes = 1 << 20;
  o.nranks = 4;
  o.channels = 2;
  o.chunkBytes = 512 << 10;
  o.maxChunkBytes = 2 << 20;
  return o;
}

std::vector<Algo> ringThenRab() { return {Algo::kRing, Algo::kRabenseifner}; }

// One stage of `t`'s class on `ranks` ranks, every rank's time per candidate
// given by `time`: the calls, their records, the agreement. Returns the
// settings the calls ran.
std::vector<Tuning> runStage(Tuner& t, size_t bytes, int ranks,
                             const std::function<double(const Tuning&)>& time) {
  std::vector<Tuning> ran;
  for (;;) {
    Tuning x = t.next(Collective::kAllReduce, bytes, ringThenRab);
    ran.push_back(x);
    if (x.trial < 0) return ran;  // settled: nothing was tried
    t.record(x, time(x));
    if (x.last) {
      std::vector<double> sums = t.figures(x);
      for (double& s : sums) s *= ranks;  // every rank measured the same
      EXPECT_FALSE(t.decide(x, sums).empty());
      return ran;
    }
  }
}

TEST(Tuner, SmallAndUntunedCollectivesAreLeftAlone) {
  Tuner t(options(Tuner::kAll));
  EXPECT_FALSE(t.tunes(Collective::kAllReduce, (1 << 20) - 1));
  EXPECT_TRUE(t.tunes(Collective::kAllReduce, 1 << 20));
  EXPECT_TRUE(t.tunes(Collective::kAllGather, 1 << 20));
  EXPECT_TRUE(t.tunes(Collective::kReduceScatter, 1 << 20));
  EXPECT_FALSE(t.tunes(Collective::kBroadcast, 64 << 20));
  EXPECT_FALSE(t.tunes(Collective::kSend, 64 << 20));
  EXPECT_FALSE(Tuner(options(0)).tunes(Collective::kAllReduce, 64 << 20));
  Tuner::Options one = options(Tuner::kAll);
  one.nranks = 1;
  EXPECT_FALSE(Tuner(one).tunes(Collective::kAllReduce, 64 << 20));
  // The whole vector: an all-gather of 256 KiB per rank on 4 ranks is 1 MiB.
  EXPECT_EQ(Tuner::vectorBytes(Collective::kAllGather, 65536, 4, 4), size_t{1} << 20);
  EXPECT_EQ(Tuner::vectorBytes(Collective::kAllReduce, 65536, 4, 4), size_t{256} << 10);
}

// Stage by stage: the algorithm (ring, Rabenseifner), the channels (2, 1),
// the chunk (512 KiB, 128 KiB, 2 MiB), each candidate kTrials times in turn;
// the fastest wins each stage and the class then runs its setting for good.
TEST(Tuner, EachStageTriesItsCandidatesInTurnAndKeepsTheFastest) {
  Tuner t(options(Tuner::kAll));
  const size_t bytes = 8 << 20;
  // Rabenseifner's is faster; then 1 channel; then 2 MiB chunks.
  auto time = [](const Tuning& x) {
    double us = x.algo == static_cast<int8_t>(Algo::kRabenseifner) ? 1000 : 2000;
    if (x.channels == 1) us *= 0.5;
    if (x.chunkBytes == (2u << 20)) us *= 0.5;
    return us;
  };
  auto a = runStage(t, bytes, 4, time);
  ASSERT_EQ(a.size(), size_t{2 * Tuner::kTrials});
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].trial, static_cast<int>(k % 2));
    EXPECT_EQ(a[k].algo, static_cast<int8_t>(k % 2 ? Algo::kRabenseifner : Algo::kRing));
    EXPECT_EQ(a[k].channels, 2);
    EXPECT_EQ(a[k].chunkBytes, 512u << 10);
    EXPECT_EQ(a[k].last, k + 1 == a.size());
  }
  EXPECT_FALSE(t.settled(Collective::kAllReduce, bytes));
  auto c = runStage(t, bytes, 4, time);
  ASSERT_EQ(c.size(), size_t{2 * Tuner::kTrials});
  EXPECT_EQ(c[0].algo, static_cast<int8_t>(Algo::kRabenseifner)) << "the winner carries on";
  EXPECT_EQ(c[0].channels, 2);
  EXPECT_EQ(c[1].channels, 1);
  auto k = runStage(t, bytes, 4, time);
  ASSERT_EQ(k.size(), size_t{3 * Tuner::kTrials});
  EXPECT_EQ(k[0].chunkBytes, 512u << 10);
  EXPECT_EQ(k[1].chunkBytes, 128u << 10);
  EXPECT_EQ(k[2].chunkBytes, 2u << 20);
  for (const Tuning& x : k) EXPECT_EQ(x.channels, 1);
  auto s = t.settled(Collective::kAllReduce, bytes);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->algo, static_cast<int8_t>(Algo::kRabenseifner));
  EXPECT_EQ(s->channels, 1);
  EXPECT_EQ(s->chunkBytes, 2u << 20);
  // From now on: that setting, no trial, no agreement.
  for (int i = 0; i < 5; ++i) {
    Tuning x = t.next(Collective::kAllReduce, bytes + i, ringThenRab);
    EXPECT_TRUE(x.sameRun(*s));
    EXPECT_EQ(x.trial, -1);
    EXPECT_FALSE(x.last);
  }
  // Another size class starts on its own, from the cost model's choice.
  Tuning other = t.next(Collective::kAllReduce, 16 << 20, ringThenRab);
  EXPECT_EQ(other.algo, static_cast<int8_t>(Algo::kRing));
  EXPECT_EQ(other.trial, 0);
  EXPECT_NE(other.cls, t.next(Collective::kAllReduce, bytes, ringThenRab).cls);
}

// A challenger within kKeep of the incumbent does not replace it (noise
// must not move a setting); an incumbent never measured (every trial ran
// in a group) loses to one that was; nothing measured keeps the incumbent.
TEST(Tuner, TheIncumbentHoldsUnlessClearlyBeaten) {
  for (double ratio : {0.99, 0.975, 0.96, 0.5}) {
    Tuner t(options(Tuner::kAlgo));
    runStage(t, 4 << 20, 3, [&](const Tuning& x) {
      return x.algo == static_cast<int8_t>(Algo::kRing) ? 1000.0 : 1000.0 * ratio;
    });
    auto s = t.settled(Collective::kAllReduce, 4 << 20);
    ASSERT_TRUE(s);
    const bool switched = s->algo == static_cast<int8_t>(Algo::kRabenseifner);
    EXPECT_EQ(switched, ratio < Tuner::kKeep) << ratio;
  }
  for (bool incumbentMeasured : {false, true}) {
    Tuner t(options(Tuner::kAlgo));
    Tuning x;
    do {
      x = t.next(Collective::kAllReduce, 4 << 20, ringThenRab);
    } while (!x.last);
    std::vector<double> sums{incumbentMeasured ? 10.0 : kInf, 12.0};
    t.decide(x, sums);
    auto s = t.settled(Collective::kAllReduce, 4 << 20);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->algo, static_cast<int8_t>(incumbentMeasured ? Algo::kRing : Algo::kRabenseifner));
  }
  Tuner t(options(Tuner::kAlgo));
  Tuning x;
  do {
    x = t.next(Collective::kAllReduce, 4 << 20, ringThenRab);
  } while (!x.last);
  t.decide(x, {kInf, kInf});
  EXPECT_EQ(t.settled(Collective::kAllReduce, 4 << 20)->algo, static_cast<int8_t>(Algo::kRing));
}

// Knobs: only those asked for tune; one algorithm leaves the choice to the
// cost model (algo -1); with nothing to choose a class settles at once.
TEST(Tuner, OnlyTheKnobsAskedForTune) {
  Tuner t(options(Tuner::kChannels));
  Tuning x = t.next(Collective::kAllReduce, 4 << 20, ringThenRab);
  EXPECT_EQ(x.algo, -1) << "the algorithm is the cost model's";
  EXPECT_EQ(x.chunkBytes, 0u) << "the chunk is the communicator's";
  EXPECT_EQ(x.channels, 2);
  EXPECT_EQ(x.trial, 0);

  Tuner one(options(Tuner::kAlgo));
  bool asked = false;
  Tuning y = one.next(Collective::kAllReduce, 4 << 20, [&] {
    asked = true;
    return std::vector<Algo>{Algo::kRing};
  });
  EXPECT_TRUE(asked);
  EXPECT_EQ(y.trial, -1) << "one candidate: settled at once";
  EXPECT_EQ(y.algo, -1);
  ASSERT_TRUE(one.settled(Collective::kAllReduce, 4 << 20));

  Tuner::Options single = options(Tuner::kChannels);
  single.channels = 1;
  Tuner s(single);
  EXPECT_EQ(s.next(Collective::kAllReduce, 4 << 20, ringThenRab).trial, -1);

  // Channels 8: 8, 4, 2, 1.
  Tuner::Options eight = options(Tuner::kChannels);
  eight.channels = 8;
  Tuner e(eight);
  std::vector<int> tried;
  for (int i = 0; i < 4; ++i)
    tried.push_back(e.next(Collective::kAllReduce, 4 << 20, ringThenRab).channels);
  EXPECT_EQ(tried, (std::vector<int>{8, 4, 2, 1}));
}

// Chunk sizes that slice a class alike are tried once: a 1 MiB all-reduce on
// 4 ranks has 256 KiB segments, so 512 KiB and 2 MiB slice nothing more.
TEST(Tuner, ChunksThatSliceAlikeAreTriedOnce) {
  Tuner t(options(Tuner::kChunk));
  std::vector<uint32_t> tried;
  for (int i = 0; i < 2; ++i)
    tried.push_back(t.next(Collective::kAllReduce, 1 << 20, ringThenRab).chunkBytes);
  EXPECT_EQ(tried, (std::vector<uint32_t>{512u << 10, 128u << 10}));
  EXPECT_EQ(t.next(Collective::kAllReduce, 1 << 20, ringThenRab).chunkBytes, 512u << 10)
      << "two candidates: the third call is the first one's second trial";
  // The largest chunk is bounded by the buffers (maxChunkBytes).
  Tuner::Options o = options(Tuner::kChunk);
  o.chunkBytes = 1 << 20;
  Tuner big(o);
  tried.clear();
  for (int i = 0; i < 3; ++i)
    tried.push_back(big.next(Collective::kAllReduce, 64 << 20, ringThenRab).chunkBytes);
  EXPECT_EQ(tried, (std::vector<uint32_t>{1u << 20, 256u << 10, 2u << 20}));
}

// After restart() (the balance re-planned) every class tunes again from
// the cost model's choice, which is asked again.
TEST(Tuner, RestartTunesAgain) {
  Tuner t(options(Tuner::kAlgo));
  runStage(t, 4 << 20, 2, [](const Tuning& x) {
    return x.algo == static_cast<int8_t>(Algo::kRabenseifner) ? 1.0 : 2.0;
  });
  ASSERT_TRUE(t.settled(Collective::kAllReduce, 4 << 20));
  t.restart();
  EXPECT_FALSE(t.settled(Collective::kAllReduce, 4 << 20));
  int asked = 0;
  Tuning x = t.next(Collective::kAllReduce, 4 << 20, [&] {
    ++asked;
    return std::vector<Algo>{Algo::kHierarchical, Algo::kRing};
  });
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(x.algo, static_cast<int8_t>(Algo::kHierarchical));
  EXPECT_EQ(x.trial, 0);
}

// Two tuners fed the same sums in the same call order (two ranks) run the
// same setting on every call, however noisy their own times.
TEST(Tuner, RanksThatAgreeOnTheSumsRunAlike) {
  Tuner a(options(Tuner::kAll)), b(options(Tuner::kAll));
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(500, 1500);
  const size_t sizes[] = {1 << 20, 3 << 20, 8 << 20, 3 << 20};
  for (int call = 0; call < 200; ++call) {
    const size_t bytes = sizes[call % 4];
    Tuning x = a.next(Collective::kAllReduce, bytes, ringThenRab);
    Tuning y = b.next(Collective::kAllReduce, bytes, ringThenRab);
    ASSERT_TRUE(x.sameRun(y)) << "call " << call;
    ASSERT_EQ(x.last, y.last);
    a.record(x, noise(rng));
    b.record(y, noise(rng));
    if (x.last) {
      std::vector<double> fa = a.figures(x), fb = b.figures(y), sum(fa.size());
      ASSERT_EQ(fa.size(), fb.size());
      for (size_t i = 0; i < fa.size(); ++i) sum[i] = fa[i] + fb[i];
      EXPECT_EQ(a.decide(x, sum), b.decide(y, sum));
    }
    if (call == 120) a.restart(), b.restart();
  }
}

TEST(Tuner, ParsesTuttiTune) {
  unsigned k = 99;
  EXPECT_TRUE(Tuner::parseKnobs("", &k));
  EXPECT_EQ(k, unsigned{Tuner::kAll});
  EXPECT_TRUE(Tuner::parseKnobs("0", &k));
  EXPECT_EQ(k, 0u);
  EXPECT_TRUE(Tuner::parseKnobs("OFF", &k));
  EXPECT_EQ(k, 0u);
  EXPECT_TRUE(Tuner::parseKnobs("1", &k));
  EXPECT_EQ(k, unsigned{Tuner::kAll});
  EXPECT_TRUE(Tuner::parseKnobs("algo, chunk", &k));
  EXPECT_EQ(k, unsigned{Tuner::kAlgo | Tuner::kChunk});
  EXPECT_EQ(Tuner::knobNames(k), "algo,chunk");
  EXPECT_FALSE(Tuner::parseKnobs("algo,speed", &k));
  EXPECT_EQ(Tuner::knobNames(0), "none");
  EXPECT_EQ(Tuner::describeClass(Collective::kAllReduce, 3 << 20), "AllReduce of 2 MiB-4 MiB");
}

}  // namespace
}  // namespace tutti::core
