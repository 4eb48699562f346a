// NodeMap: which node each rank is on (see schedule.h).
#include <algorithm>
#include <unordered_map>

#include "algo/schedule.h"

namespace tutti::algo {

NodeMap NodeMap::fromHostIds(const std::vector<uint64_t>& hostIds) {
  NodeMap m;
  const int n = static_cast<int>(hostIds.size());
  m.nodeOf.assign(n, -1);
  m.localOf.assign(n, 0);
  std::unordered_map<uint64_t, int> nodeOfHost;  // nodes numbered by their lowest rank
  for (int r = 0; r < n; ++r) {
    auto [it, added] = nodeOfHost.emplace(hostIds[r], m.nNodes());
    if (added) m.nodes.emplace_back();
    std::vector<int>& ranks = m.nodes[it->second];
    m.nodeOf[r] = it->second;
    m.localOf[r] = static_cast<int>(ranks.size());
    ranks.push_back(r);
  }
  return m;
}

NodeMap NodeMap::singleNode(int nranks) { return fromHostIds(std::vector<uint64_t>(nranks, 0)); }

int NodeMap::maxPerNode() const {
  size_t most = 0;
  for (const auto& n : nodes) most = std::max(most, n.size());
  return static_cast<int>(most);
}

bool NodeMap::uniform() const {
  for (const auto& n : nodes)
    if (n.size() != nodes.front().size()) return false;
  return true;
}

std::vector<int> NodeMap::ringOrder() const {
  std::vector<int> order;
  for (const auto& n : nodes) order.insert(order.end(), n.begin(), n.end());
  return order;
}

}  // namespace tutti::algo
