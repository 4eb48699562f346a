// A flat description of an nccl.h: (name, value) pairs for every enumerator,
// macro, struct size/offset/alignment, initializer field and the mangled type
// of every function. Filled once from NVIDIA's header and once from tutti's
// (layout_fill.inc included after each); layout_main.cc compares the two.
#pragma once

#include <string>
#include <vector>

struct LayoutEntry {
  std::string name;
  long long value;
  std::string text;  // string-valued facts (NCCL_SUFFIX, function types)
};
using LayoutTable = std::vector<LayoutEntry>;

LayoutTable nvidiaLayout();  // layout_nvidia.cc
LayoutTable tuttiLayout();   // layout_tutti.cc
