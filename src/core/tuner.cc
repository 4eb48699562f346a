#include "core/tuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

#include "algo/cost_model.h"

namespace tutti::core {

namespace {

constexpr double kNone = std::numeric_limits<double>::infinity();

int floorLog2(size_t v) {
  int k = 0;
  while (v >>= 1) ++k;
  return k;
}

std::string sizeName(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0)
    return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0)
    return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

}  // namespace

bool Tuner::parseKnobs(const std::string& value, unsigned* knobs) {
  std::string v;
  for (char ch : value)
    if (!std::isspace(static_cast<unsigned char>(ch)))
      v += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (v.empty() || v == "1" || v == "all" || v == "on") return *knobs = kAll, true;
  if (v == "0" || v == "off" || v == "none") return *knobs = 0, true;
  unsigned out = 0;
  std::stringstream in(v);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item == "algo")
      out |= kAlgo;
    else if (item == "channels")
      out |= kChannels;
    else if (item == "chunk")
      out |= kChunk;
    else
      return false;
  }
  *knobs = out;
  return true;
}

std::string Tuner::knobNames(unsigned knobs) {
  std::string s;
  for (auto [k, name] : {std::pair{kAlgo, "algo"}, {kChannels, "channels"}, {kChunk, "chunk"}})
    if (knobs & k) s += (s.empty() ? "" : ",") + std::string(name);
  return s.empty() ? "none" : s;
}

size_t Tuner::vectorBytes(algo::Collective coll, size_t count, size_t elemSize, int nranks) {
  const size_t bytes = count * elemSize;
  if (coll == algo::Collective::kAllGather || coll == algo::Collective::kReduceScatter)
    return bytes * static_cast<size_t>(nranks);
  return bytes;
}

bool Tuner::tunes(algo::Collective coll, size_t bytes) const {
  if (!opt_.knobs || opt_.nranks < 2 || bytes < std::max<size_t>(opt_.minBytes, 1)) return false;
  return coll == algo::Collective::kAllReduce || coll == algo::Collective::kAllGather ||
         coll == algo::Collective::kReduceScatter;
}

std::vector<Tuning> Tuner::candidates(const Class& c, unsigned knob) const {
  std::vector<Tuning> out;
  auto add = [&](Tuning t) {
    for (const Tuning& o : out)
      if (o.sameRun(t)) return;
    out.push_back(t);
  };
  switch (knob) {
    case kAlgo:
      for (algo::CollArgs::Algo a : c.algos) {
        Tuning t = c.best;
        t.algo = static_cast<int8_t>(a);
        add(t);
      }
      break;
    case kChannels: {
      Tuning t = c.best;
      add(t);
      for (int ch = opt_.channels; ch >= 1 && out.size() < 4; ch /= 2) {
        t.channels = static_cast<uint8_t>(ch);
        add(t);
      }
      break;
    }
    case kChunk: {
      // Sizes that slice this class's segments alike (a chunk above a rank's
      // share of the vector slices nothing more) count once.
      const size_t share = std::max(opt_.minChunkBytes, classBytes(c) / opt_.nranks);
      const size_t cur = c.best.chunkBytes;
      std::vector<size_t> seen;
      for (size_t v : {cur, cur / 4, cur * 4}) {
        v = std::clamp(v, opt_.minChunkBytes, std::max(opt_.minChunkBytes, opt_.maxChunkBytes));
        const size_t eff = std::min(v, share);
        if (std::find(seen.begin(), seen.end(), eff) != seen.end()) continue;
        seen.push_back(eff);
        Tuning t = c.best;
        t.chunkBytes = static_cast<uint32_t>(v);
        add(t);
      }
      break;
    }
    default:
      break;
  }
  return out;
}

void Tuner::advance(Class& c, unsigned from) const {
  for (unsigned knob : {kAlgo, kChannels, kChunk}) {
    if (knob <= from || !(opt_.knobs & knob)) continue;
    std::vector<Tuning> cands = candidates(c, knob);
    if (cands.size() < 2) continue;
    c.stage = knob;
    c.cands = std::move(cands);
    c.mine.assign(c.cands.size(), kNone);
    c.calls = 0;
    return;
  }
  c.stage = 0;
  c.cands.clear();
  c.mine.clear();
}

Tuning Tuner::next(algo::Collective coll, size_t bytes,
                   const std::function<std::vector<algo::CollArgs::Algo>()>& algorithms) {
  const int log2 = floorLog2(bytes);
  auto [it, fresh] =
      index_.try_emplace({static_cast<int>(coll), log2}, static_cast<int32_t>(classes_.size()));
  if (fresh) {
    Class c;
    c.coll = coll;
    c.log2 = log2;
    classes_.push_back(std::move(c));
  }
  const int32_t id = it->second;
  Class& c = classes_[id];
  if (fresh || c.stage == ~0u) {  // first seen, or restarted
    c.best = Tuning();
    c.algos.clear();
    if (opt_.knobs & kAlgo) {
      c.algos = algorithms();
      // One algorithm: the cost model keeps choosing (as the plans move).
      if (c.algos.size() > 1) c.best.algo = static_cast<int8_t>(c.algos[0]);
    }
    if (opt_.knobs & kChannels) c.best.channels = static_cast<uint8_t>(opt_.channels);
    if (opt_.knobs & kChunk) c.best.chunkBytes = static_cast<uint32_t>(opt_.chunkBytes);
    advance(c, 0);
  }
  Tuning t = c.best;
  t.cls = id;
  if (c.stage != 0) {
    const int n = static_cast<int>(c.cands.size());
    const int k = c.calls % n;
    t = c.cands[k];
    t.cls = id;
    t.trial = static_cast<int16_t>(k);
    t.last = ++c.calls == kTrials * n;
    ++c.explored;
  }
  return t;
}

void Tuner::record(const Tuning& t, double us) {
  if (t.cls < 0 || t.trial < 0 || t.cls >= static_cast<int32_t>(classes_.size())) return;
  Class& c = classes_[t.cls];
  if (c.stage == 0 || c.stage == ~0u || t.trial >= static_cast<int>(c.mine.size())) return;
  c.mine[t.trial] = std::min(c.mine[t.trial], us);
}

std::vector<double> Tuner::figures(const Tuning& t) const {
  if (t.cls < 0 || t.cls >= static_cast<int32_t>(classes_.size())) return {};
  return classes_[t.cls].mine;
}

std::string Tuner::decide(const Tuning& t, const std::vector<double>& sums) {
  if (t.cls < 0 || t.cls >= static_cast<int32_t>(classes_.size())) return {};
  Class& c = classes_[t.cls];
  if (c.stage == 0 || c.stage == ~0u || sums.size() != c.cands.size()) return {};
  size_t win = 0;
  for (size_t i = 1; i < sums.size(); ++i)
    if (sums[i] < sums[win]) win = i;
  // The incumbent keeps its place unless beaten clearly (or never measured).
  if (std::isfinite(sums[0]) && !(sums[win] < kKeep * sums[0])) win = 0;
  const char* knob = c.stage == kAlgo ? "algorithm" : c.stage == kChannels ? "channels" : "chunk";
  std::string text = fmt::format("tuning: {}: {}", describeClass(c.coll, classBytes(c)), knob);
  for (size_t i = 0; i < sums.size(); ++i) {
    const Tuning& o = c.cands[i];
    std::string name = c.stage == kAlgo ? algo::algoName(static_cast<algo::CollArgs::Algo>(o.algo))
                       : c.stage == kChannels ? std::to_string(o.channels)
                                              : sizeName(o.chunkBytes);
    if (std::isfinite(sums[i]))
      text += fmt::format(" {} {:.3g} ms{}", name, sums[i] / opt_.nranks / 1e3,
                          i + 1 < sums.size() ? "," : "");
    else
      text += fmt::format(" {} unmeasured{}", name, i + 1 < sums.size() ? "," : "");
  }
  c.best = c.cands[win];
  c.best.cls = -1;
  c.best.trial = -1;
  c.best.last = false;
  const unsigned stage = c.stage;
  advance(c, stage);
  text +=
      fmt::format(" (mean over ranks of each rank's fastest of {}): {}", kTrials, describe(c.best));
  if (c.stage == 0) text += fmt::format(", settled after {} calls", c.explored);
  return text;
}

void Tuner::restart() {
  for (Class& c : classes_) {
    c.stage = ~0u;
    c.explored = 0;
  }
}

std::optional<Tuning> Tuner::settled(algo::Collective coll, size_t bytes) const {
  auto it = index_.find({static_cast<int>(coll), floorLog2(bytes)});
  if (it == index_.end()) return std::nullopt;
  const Class& c = classes_[it->second];
  if (c.stage != 0) return std::nullopt;
  return c.best;
}

std::string Tuner::describeClass(algo::Collective coll, size_t bytes) {
  const size_t lo = size_t{1} << floorLog2(std::max<size_t>(bytes, 1));
  return fmt::format("{} of {}-{}", algo::collectiveName(coll), sizeName(lo), sizeName(lo * 2));
}

std::string Tuner::describe(const Tuning& t) const {
  std::string algoName =
      t.algo < 0 ? "the cost model's algorithm"
                 : std::string(algo::algoName(static_cast<algo::CollArgs::Algo>(t.algo)));
  const int ch = t.channels ? t.channels : opt_.channels;
  const size_t chunk = t.chunkBytes ? t.chunkBytes : opt_.chunkBytes;
  return fmt::format("{}, {} channel{}, chunk {}", algoName, ch, ch == 1 ? "" : "s",
                     sizeName(chunk));
}

}  // namespace tutti::core
