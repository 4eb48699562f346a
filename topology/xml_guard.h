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
// - a set attribute hwloc would not have written, such as ",0x1" (an
//   assertion fails in hwloc_bitmap_sscanf: count > 0) or "" (it reads
//   past the string's end).
// - sets that leave the root without a PU (an object's cpuset or nodeset
//   not within its complete one; the root's allowed_cpuset disjoint from
//   its cpuset): when no child object was read either, hwloc removes the
//   root and then dereferences it ("Topology became empty");
// - in a file hwloc reads as its 1.x format (<topology> without
//   version="2.x"), an object other than I/O and Misc without its sets: a
//   NUMA node's complete_cpuset is compared with its parent's
//   (hwloc_bitmap_isequal on NULL);
// - a NUMANode or PU object without an os_index below 65536: hwloc sizes a
//   bitmap by the index (by 2^32 - 1 when it is missing: 512 MiB);
// - in a 2.x file, a NUMANode object inside a NUMANode object (through
//   ignored Misc, MemCache or type-less objects too), or a NUMANode or
//   MemCache object at the root: hwloc gives the inner node no level,
//   hwloc_topology_dup puts it in the root's place, and a memory root
//   without memory children is removed as empty, then dereferenced
//   ("Topology became empty" again).
// Pure (no I/O); files hwloc wrote never match. They are the first filter
// (cheap, and their reason is precise); the reader apart below catches what
// they miss.
//
// hwlocCrashesApart(path, readHere), for crashes of kinds no pattern knows
// yet: another process reads the file with hwloc first, as loadXml would,
// and this says why when hwloc crashed or hung there; nothing when it read or
// refused the file (the caller then reads it itself and says why it refused).
// - In a process with one thread (`tutti-topo --load`, a program's first
//   init, the fuzzer): a forked child runs `readHere` (the whole of loadXml,
//   reading back and freeing included), then exits kReadApartLoaded or
//   kReadApartRefused.
// - In a process with threads, where a forked child could hang on a lock
//   another thread held (seen under ASan: a communicator's init with ranks
//   as threads): readerProgram() run as `PROGRAM --read-apart` with the file
//   as its standard input (tutti-topo does that: topo::loadXmlHere).
// - No process to read it (fork or posix_spawn failed, no reader program):
//   nothing, and the patterns are all that guards it. `*how` says which ran.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace tutti::topo {

std::optional<std::string> hwlocCrashReason(const std::string& text);

enum class ReadApart { kNone, kChild, kProgram };
std::optional<std::string> hwlocCrashesApart(const std::string& path,
                                             const std::function<bool()>& readHere,
                                             ReadApart* how = nullptr);

// The reading process's exit status: the file loaded, or hwloc (or tutti's
// checks) refused it.
constexpr int kReadApartLoaded = 0;
constexpr int kReadApartRefused = 3;
constexpr const char* kReadApartFlag = "--read-apart";

// The program that reads files apart in a process with threads: the
// TUTTI_TOPO_READER variable (a path; empty when that is not executable),
// else the tutti-topo this library was built with, else the one installed
// with it; empty when none is there.
std::string readerProgram();

// `text` without its <memattr> elements (memory attributes, which tutti does
// not use), or nothing when it has none. hwloc 2.9 takes a memory attribute
// whose target object is missing and then frees it twice when the topology
// is duplicated or destroyed (found by fuzzing): loadXml hands hwloc the text
// without them. Elements inside comments are left alone.
std::optional<std::string> withoutMemattrs(const std::string& text);

}  // namespace tutti::topo
