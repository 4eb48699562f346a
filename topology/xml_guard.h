// Files that hwloc 2.9.0 (Debian 12) crashes on instead of refusing them.
//
// Contract: hwlocCrashReason(text) says why `text` would crash that hwloc's
// XML loader, or nothing. topo::loadXml refuses such a file with the reason
// before hwloc sees it. The patterns are those of bugs fixed upstream
// (github.com/open-mpi/hwloc), found by fuzzing loadXml
// (tests/fuzz/topology_xml_fuzz.cc):
// - an object with some but not all of cpuset, complete_cpuset, nodeset and
//   complete_nodeset: hwloc_topology_load dereferences the missing set
//   (hwloc_bitmap_compare_first; pull request 783);
// - a DOCTYPE without a SYSTEM id, with the libxml2 reader: strcmp(NULL) in
//   hwloc_libxml_look_init (pull request 786);
// - a set attribute hwloc would not have written, such as ",0x1": an
//   assertion fails in hwloc_bitmap_sscanf (count > 0).
// Pure (no I/O); files hwloc wrote never match.
#pragma once

#include <optional>
#include <string>

namespace tutti::topo {

std::optional<std::string> hwlocCrashReason(const std::string& text);

}  // namespace tutti::topo
