// NodeMap: which node each rank is on (see schedule.h).
#include <algorithm>

#include "algo/schedule.h"

namespace tutti::algo {

NodeMap NodeMap::fromHostIds(const std::vector<uint64_t>& hostIds) {
  NodeMap m;
  const int n = static_cast<int>(hostIds.size());
  m.nodeOf.assign(n, -1);
  m.localOf.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    if (m.nodeOf[r] >= 0) continue;
    const int node = m.nNodes();
    m.nodes.emplace_back();
    for (int q = r; q < n; ++q)
      if (hostIds[q] == hostIds[r]) {
        m.nodeOf[q] = node;
        m.localOf[q] = static_cast<int>(m.nodes[node].size());
        m.nodes[node].push_back(q);
      }
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
