// tutti-topo: shows the topology tutti sees, and writes or reads it as hwloc XML.
//
//   tutti-topo                 describe the topology tutti would use here
//                              (TUTTI_TOPO_FILE if set, else this machine)
//   tutti-topo --load FILE     describe an XML file instead
//   tutti-topo --dump FILE     also write it as XML ("-": stdout, no description)
//   tutti-topo --json          JSON instead of the description
// Exit status: 0 done, 1 the topology could not be read or written, 2 bad usage.
//
// `tutti-topo --read-apart` (not for people) is the reader loadXml runs in
// a process with threads (topology/xml_guard.h): it loads the XML on its
// standard input and exits kReadApartLoaded or kReadApartRefused, silently;
// a crash of hwloc ends it instead.
#include <cstdio>
#include <cstring>
#include <string>

#include "topology/topology.h"
#include "topology/xml_guard.h"

namespace {

constexpr const char* kUsage =
    "usage: tutti-topo [--load FILE] [--dump FILE] [--json] [-h]\n"
    "Describes the topology tutti uses on this machine (TUTTI_TOPO_FILE if set, else\n"
    "hwloc discovery).\n"
    "  --load FILE  describe this hwloc XML file instead (lstopo --of xml or --dump output)\n"
    "  --dump FILE  write the topology as hwloc XML with tutti's Tutti* attributes\n"
    "               (\"-\": to stdout, and nothing else is printed); use it as TUTTI_TOPO_FILE\n"
    "  --json       print JSON instead of the text description\n"
    "  -h, --help   this help\n";

int usageError(const std::string& msg) {
  fprintf(stderr, "tutti-topo: %s (tutti-topo -h for usage)\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], tutti::topo::kReadApartFlag) == 0)
    return tutti::topo::loadXmlHere("/proc/self/fd/0").isOk() ? tutti::topo::kReadApartLoaded
                                                              : tutti::topo::kReadApartRefused;
  std::string load, dump;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    if (a == "-h" || a == "--help") {
      fputs(kUsage, stdout);
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--load") {
      if (!value(&load)) return usageError("--load needs a file");
    } else if (a.rfind("--load=", 0) == 0) {
      load = a.substr(7);
    } else if (a == "--dump") {
      if (!value(&dump)) return usageError("--dump needs a file");
    } else if (a.rfind("--dump=", 0) == 0) {
      dump = a.substr(7);
    } else {
      return usageError("unknown argument '" + a + "'");
    }
  }

  auto topo = load.empty() ? tutti::topo::forThisProcess() : tutti::topo::loadXml(load);
  if (!topo.isOk()) {
    fprintf(stderr, "tutti-topo: %s\n", topo.status().message().c_str());
    return 1;
  }
  if (!dump.empty()) {
    tutti::Status s = tutti::topo::dumpXml(topo.value(), dump);
    if (!s.isOk()) {
      fprintf(stderr, "tutti-topo: %s\n", s.message().c_str());
      return 1;
    }
    if (dump == "-") return 0;
  }
  if (json)
    printf("%s\n", tutti::topo::toJson(topo.value()).c_str());
  else
    fputs(tutti::topo::describe(topo.value()).c_str(), stdout);
  if (!dump.empty()) fprintf(stderr, "tutti-topo: written to %s\n", dump.c_str());
  return 0;
}
