// abi_layout: tutti's nccl.h against NVIDIA's, fact by fact.
//
// Exit 0 when every fact (enumerator, macro, size, offset, initializer value,
// function type) matches and both tables list the same facts; 1 otherwise,
// printing each difference. Built only when NVIDIA's header is present (the
// CMake file registers a skipping test otherwise).
#include <cstdio>
#include <map>

#include "layout_table.h"

int main() {
  const LayoutTable nv = nvidiaLayout();
  const LayoutTable tu = tuttiLayout();
  std::map<std::string, const LayoutEntry*> byName;
  for (const auto& e : tu) byName[e.name] = &e;

  int bad = 0;
  if (nv.size() != tu.size()) {
    std::printf("MISMATCH table sizes: nvidia %zu, tutti %zu\n", nv.size(), tu.size());
    ++bad;
  }
  for (const auto& e : nv) {
    auto it = byName.find(e.name);
    if (it == byName.end()) {
      std::printf("MISSING in tutti: %s\n", e.name.c_str());
      ++bad;
      continue;
    }
    const LayoutEntry& t = *it->second;
    if (t.value != e.value || t.text != e.text) {
      std::printf("MISMATCH %s: nvidia %lld '%s', tutti %lld '%s'\n", e.name.c_str(), e.value,
                  e.text.c_str(), t.value, t.text.c_str());
      ++bad;
    }
  }
  std::printf("%zu facts compared, %d differences\n", nv.size(), bad);
  return bad == 0 ? 0 : 1;
}
