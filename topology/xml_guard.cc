#include "topology/xml_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <hwloc.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "base/params.h"
#include "base/thread.h"

namespace tutti::topo {
namespace {

struct Attribute {
  std::string name;
  std::string value;  // as written, entities not decoded
};

// The attributes of the start tag that begins at `tag` ("<object ...>").
std::vector<Attribute> attributesOf(const std::string& text, size_t tag) {
  std::vector<Attribute> attrs;
  size_t i = tag + 1;
  while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])) && text[i] != '>')
    ++i;  // the element's name
  while (i < text.size() && text[i] != '>') {
    if (text[i] == '"' || text[i] == '\'') {  // a value: skip to its end
      const size_t close = text.find(text[i], i + 1);
      if (close == std::string::npos) break;
      if (!attrs.empty()) attrs.back().value = text.substr(i + 1, close - i - 1);
      i = close + 1;
      continue;
    }
    if (text[i] == '=' || std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && text[end] != '=' && text[end] != '>' &&
           !std::isspace(static_cast<unsigned char>(text[end])))
      ++end;
    attrs.push_back({text.substr(i, end - i), ""});
    i = end == i ? i + 1 : end;
  }
  return attrs;
}

// A set as hwloc writes it (hwloc_bitmap_snprintf): words of 32 bits, most
// significant first, separated by commas, each "0x" and hex digits (8, or
// "0x0" for a last word of zero) or nothing for a zero word
// ("0x000000ff,,,,,,0x000000ff"), after "0xf...f" for an infinite set.
// Hand-written words may be shorter ("0x3"). Refused: a leading comma
// (hwloc_bitmap_sscanf does not count it and asserts), a trailing one, and
// anything but hex digits, and "" (hwloc 2.9's reader reads past an empty
// set string: an ASan heap-buffer-overflow in hwloc_bitmap_sscanf, found by
// fuzzing; hwloc writes "0x0" for an empty set).
bool plainSet(const std::string& v) {
  size_t i = 0;
  bool wordRequired = true;  // no leading comma
  if (v.compare(0, 7, "0xf...f") == 0) {
    i = 7;
    if (i == v.size()) return true;
    if (v[i++] != ',') return false;
    wordRequired = false;  // "0xf...f,,0x1": a zero word may follow
  }
  if (i == v.size()) return false;  // ""
  for (;;) {
    size_t digits = 0;
    if (v.compare(i, 2, "0x") == 0) {
      i += 2;
      while (i < v.size() && std::isxdigit(static_cast<unsigned char>(v[i]))) ++i, ++digits;
      if (digits == 0 || digits > 16) return false;
    } else if (wordRequired) {
      return false;
    }
    if (i == v.size()) return digits > 0;  // no trailing comma
    if (v[i++] != ',') return false;
    wordRequired = false;
  }
}

// A set hwloc would write (plainSet), as a bitmap; freed on scope exit.
struct Set {
  hwloc_bitmap_t bits = nullptr;
  explicit Set(const std::string& v) : bits(hwloc_bitmap_alloc()) {
    // hwloc 2.9 reads a byte past an empty string: "" is the empty set.
    if (bits && !v.empty() && hwloc_bitmap_sscanf(bits, v.c_str()) != 0) hwloc_bitmap_zero(bits);
  }
  ~Set() { hwloc_bitmap_free(bits); }
  Set(const Set&) = delete;
  Set& operator=(const Set&) = delete;
};

const std::string* valueOf(const std::vector<Attribute>& attrs, const char* name) {
  for (const auto& a : attrs)
    if (a.name == name) return &a.value;
  return nullptr;
}

// Where the next tag at or after `from` starts ('<'), comments skipped: no
// tag inside a comment counts. npos when there is none.
size_t nextTag(const std::string& text, size_t from) {
  for (;;) {
    const size_t at = text.find('<', from);
    if (at == std::string::npos || text.compare(at, 4, "<!--") != 0) return at;
    const size_t end = text.find("-->", at + 4);
    if (end == std::string::npos) return std::string::npos;
    from = end + 1;
  }
}

// Whether the start tag that begins at `tag` ends with "/>" (an element
// without content): its '>' found past quoted values.
bool selfClosing(const std::string& text, size_t tag) {
  for (size_t i = tag + 1; i < text.size(); ++i) {
    if (text[i] == '"' || text[i] == '\'') {
      i = text.find(text[i], i + 1);
      if (i == std::string::npos) return false;
    } else if (text[i] == '>') {
      return text[i - 1] == '/';
    }
  }
  return false;
}

// The type hwloc's XML reader makes of an object's `type` attribute
// (hwloc_type_sscanf, which also reads "Node" or "NUMA" as NUMANode);
// HWLOC_OBJ_TYPE_MAX for none (hwloc ignores an object without a type).
hwloc_obj_type_t typeOf(const std::string* type) {
  hwloc_obj_type_t t;
  if (!type || hwloc_type_sscanf(type->c_str(), &t, nullptr, 0) != 0) return HWLOC_OBJ_TYPE_MAX;
  return t;
}

bool endsWith(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

}  // namespace

std::optional<std::string> hwlocCrashReason(const std::string& text) {
  for (size_t at = text.find("<!DOCTYPE"); at != std::string::npos;
       at = text.find("<!DOCTYPE", at + 1)) {
    const size_t end = text.find('>', at);
    if (text.substr(at, end == std::string::npos ? std::string::npos : end - at).find("SYSTEM") ==
        std::string::npos)
      return std::string("a DOCTYPE without a SYSTEM id");
  }
  static const char* const kSets[] = {"cpuset", "complete_cpuset", "nodeset", "complete_nodeset"};
  bool sawRoot = false;  // the first object is the root (the machine)
  // hwloc reads a file as its 1.x format unless <topology> says version="2.x".
  bool v1 = true;
  // The <object> elements open at `at`, innermost last: whether each is a
  // NUMA node; and how many of them are.
  std::vector<bool> open;
  size_t openNumaNodes = 0;
  for (size_t at = nextTag(text, 0); at != std::string::npos; at = nextTag(text, at + 1)) {
    if (text.compare(at, 8, "</object") == 0) {
      if (!open.empty()) {
        openNumaNodes -= open.back();
        open.pop_back();
      }
      continue;
    }
    const auto attrs = attributesOf(text, at);
    int sets = 0;
    for (const char* set : kSets)
      sets += std::count_if(attrs.begin(), attrs.end(),
                            [&](const Attribute& a) { return a.name == set; }) > 0;
    // Only objects carry the four sets (a cpukind, say, has a cpuset alone).
    const bool object = text.compare(at, 7, "<object") == 0 && at + 7 < text.size() &&
                        std::isspace(static_cast<unsigned char>(text[at + 7]));
    if (object && sets != 0 && sets != 4)
      return "an object (at byte " + std::to_string(at) +
             ") with some but not all of cpuset, complete_cpuset, nodeset and complete_nodeset";
    for (const auto& a : attrs)
      if ((endsWith(a.name, "cpuset") || endsWith(a.name, "nodeset")) && !plainSet(a.value))
        return a.name + "=\"" + a.value.substr(0, 40) + "\" (at byte " + std::to_string(at) +
               ") is not a set as hwloc writes it (words of 0x and hex digits, separated by "
               "commas)";
    if (text.compare(at, 9, "<topology") == 0 && at + 9 < text.size() &&
        (std::isspace(static_cast<unsigned char>(text[at + 9])) || text[at + 9] == '>')) {
      const std::string* version = valueOf(attrs, "version");
      unsigned major = 0, minor = 0;
      v1 = !(version && std::sscanf(version->c_str(), "%u.%u", &major, &minor) == 2 && major >= 2);
    }
    // A 1.x file's NUMA node is compared with its parent by complete_cpuset,
    // which hwloc dereferences even when either has none: every object that
    // is not I/O or Misc carries its cpusets there (hwloc 1.x wrote them all).
    if (object && v1 && sets == 0) {
      const std::string* type = valueOf(attrs, "type");
      static const char* const kSetless[] = {"Bridge", "PCIDev", "OSDev", "Misc"};
      if (!type || std::none_of(std::begin(kSetless), std::end(kSetless),
                                [&](const char* t) { return *type == t; }))
        return "an object (at byte " + std::to_string(at) + ", type " +
               (type ? "\"" + type->substr(0, 20) + "\"" : std::string("missing")) +
               ") without cpu and node sets, in a file hwloc reads as its 1.x format (no "
               "version=\"2.x\" on <topology>)";
    }
    // A NUMA node or PU without an index (hwloc's "unknown", 2^32 - 1), or
    // with one beyond what Linux numbers: hwloc sizes a bitmap by it (512 MiB
    // for the unknown index, seconds of work; found by fuzzing). hwloc writes
    // every NUMA node's and PU's os_index.
    if (object) {
      const std::string* type = valueOf(attrs, "type");
      if (type && (*type == "NUMANode" || *type == "PU")) {
        const std::string* index = valueOf(attrs, "os_index");
        const bool valid = index && !index->empty() && index->size() <= 5 &&
                           std::all_of(index->begin(), index->end(),
                                       [](char ch) { return ch >= '0' && ch <= '9'; }) &&
                           std::stoul(*index) < 65536;
        if (!valid)
          return "a " + *type + " object (at byte " + std::to_string(at) +
                 ") without an os_index below 65536";
      }
    }
    const bool root = object && !sawRoot;
    sawRoot = sawRoot || object;
    // In a file hwloc reads as its 2.x format, a NUMA node inside a NUMA
    // node (directly, or through Misc, MemCache or type-less objects, which
    // hwloc ignores with tutti's filters and whose children it gives to
    // their parent), or a NUMA node or memory-side cache at the root. hwloc
    // 2.9 takes the first (in a 1.x file a NUMA node's children go to its
    // parent) as the outer node's memory child but lists it in no level: it
    // keeps depth 0, and when its nodeset is within the machine's,
    // hwloc_topology_dup (exportXml) puts it in the root's place, so that
    // hwloc writes a file whose root is that node. A memory root gets its
    // nodeset from its memory children only: without, hwloc removes it as
    // empty and then frees the NULL root ("Topology became empty";
    // unlink_and_free_object_and_children, from hwloc_topology_clear, reads
    // NULL->first_child; found by fuzzing). hwloc writes nothing but Misc
    // objects inside a NUMA node, and a Machine at the root.
    if (object) {
      const std::string* type = valueOf(attrs, "type");
      const hwloc_obj_type_t t = typeOf(type);
      if (!v1 && t == HWLOC_OBJ_NUMANODE && openNumaNodes > 0)
        return "a NUMANode object (at byte " + std::to_string(at) +
               ") inside a NUMANode object, in a file hwloc reads as its 2.x format";
      if (!v1 && root && (t == HWLOC_OBJ_NUMANODE || t == HWLOC_OBJ_MEMCACHE))
        return "a " + std::string(hwloc_obj_type_string(t)) + " object (at byte " +
               std::to_string(at) + ") at the root, in a file hwloc reads as its 2.x format";
      if (!selfClosing(text, at)) {
        open.push_back(t == HWLOC_OBJ_NUMANODE);
        openNumaNodes += open.back();
      }
    }
    if (!object || sets != 4) continue;
    // Sets that leave the machine without a PU. hwloc keeps of the root's
    // cpuset what complete_cpuset and allowed_cpuset also hold; when that
    // is nothing and no child object was read (a stray text line inside the
    // root ends the libxml2 reader's list of its children, say), hwloc
    // removes the root itself and then dereferences it ("Topology became
    // empty", found by fuzzing). hwloc writes every object's cpuset and
    // nodeset within its complete ones, and the root's allowed sets within
    // its sets.
    for (const char* kind : {"cpuset", "nodeset"}) {
      const std::string complete = std::string("complete_") + kind;
      Set set(*valueOf(attrs, kind)), whole(*valueOf(attrs, complete.c_str()));
      if (!set.bits || !whole.bits) continue;  // out of memory: nothing to say
      if (!hwloc_bitmap_isincluded(set.bits, whole.bits))
        return "an object (at byte " + std::to_string(at) + ") whose " + kind +
               " is not within its " + complete;
    }
    const std::string* allowed = root ? valueOf(attrs, "allowed_cpuset") : nullptr;
    if (!allowed) continue;
    Set set(*valueOf(attrs, "cpuset")), permitted(*allowed);
    if (set.bits && permitted.bits && !hwloc_bitmap_iszero(set.bits) &&
        !hwloc_bitmap_intersects(set.bits, permitted.bits))
      return "the root object (at byte " + std::to_string(at) +
             ") allows none of the PUs of its cpuset (allowed_cpuset)";
  }
  return std::nullopt;
}

std::optional<std::string> withoutMemattrs(const std::string& text) {
  std::string out;
  size_t copied = 0;  // text[0, copied) is in out
  bool any = false;
  for (size_t at = nextTag(text, 0); at != std::string::npos; at = nextTag(text, at + 1)) {
    const size_t name = at + 8;  // past "<memattr"
    if (text.compare(at, 8, "<memattr") != 0 || name >= text.size() ||
        !(std::isspace(static_cast<unsigned char>(text[name])) || text[name] == '>' ||
          text[name] == '/'))
      continue;
    const size_t tagEnd = text.find('>', name);
    if (tagEnd == std::string::npos) break;  // unterminated: hwloc refuses the file anyway
    size_t end = tagEnd + 1;
    if (text[tagEnd - 1] != '/') {  // <memattr ...> values </memattr>
      const size_t close = text.find("</memattr>", end);
      if (close == std::string::npos) break;
      end = close + 10;
    }
    out.append(text, copied, at - copied);
    copied = end;
    at = end - 1;
    any = true;
  }
  if (!any) return std::nullopt;
  out.append(text, copied, std::string::npos);
  return out;
}

namespace {

// How long the reader apart may take before its silence is the file's error.
constexpr auto kReaderLimit = std::chrono::seconds(30);

// What the reading process's end says of the file.
std::optional<std::string> verdictOf(int status, const std::string& reader) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == kReadApartLoaded) return std::nullopt;
  if (WIFEXITED(status) && WEXITSTATUS(status) == kReadApartRefused)
    return std::nullopt;  // refused: the caller reads it and says why
  if (!WIFSIGNALED(status))
    return fmt::format(
        "malformed: hwloc failed reading it (exit status {} of the reading process, {}; a "
        "sanitizer's report of a crash ends so)",
        WIFEXITED(status) ? WEXITSTATUS(status) : -1, reader);
  return fmt::format(
      "malformed: hwloc crashed reading it ({} in the reading process, {}; a bug of this hwloc, "
      "which later releases refuse such files)",
      strsignal(WTERMSIG(status)), reader);
}

// Waits for `pid` at most kReaderLimit; its verdict, or nothing when it is
// not ours to wait for (SIGCHLD ignored).
std::optional<std::string> awaitReader(pid_t pid, const std::string& reader, bool* waited) {
  const auto until = std::chrono::steady_clock::now() + kReaderLimit;
  int status = 0;
  *waited = false;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (std::chrono::steady_clock::now() >= until) {
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      *waited = true;
      return fmt::format("hwloc did not finish reading it in {} s ({})", kReaderLimit.count(),
                         reader);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *waited = true;
  return verdictOf(status, reader);
}

// In a process with one thread: a fork whose child runs `readHere`.
std::optional<std::string> readInFork(const std::function<bool()>& readHere, bool* read) {
  const int devNull = open("/dev/null", O_RDWR | O_CLOEXEC);
  fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    if (devNull >= 0) close(devNull);
    return std::nullopt;
  }
  if (pid == 0) {
    // Silent: what hwloc says of a file it refuses, the caller's own read
    // says again; of one it crashes on, the verdict says.
    if (devNull >= 0) {
      dup2(devNull, STDOUT_FILENO);
      dup2(devNull, STDERR_FILENO);
    }
    // Die of the signal, whatever handlers the process installed (a
    // sanitizer's or a fuzzer's would turn the crash into an exit status,
    // or a report of their own): the kernel's sigaction, not libc's, which
    // sanitizers intercept.
    struct {
      void (*handler)(int);
      unsigned long flags;
      void (*restorer)();
      uint64_t mask;
    } dfl{SIG_DFL, 0, nullptr, 0};
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL})
      syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof(dfl.mask));
    _exit(readHere() ? kReadApartLoaded : kReadApartRefused);  // no atexit: nothing to tidy
  }
  if (devNull >= 0) close(devNull);
  return awaitReader(pid, "a child of this process", read);
}

// In a process with threads: the reader program, with the file as its
// standard input. Nothing (and *read false) when there is none to run.
std::optional<std::string> readInProgram(const std::string& path, bool* read) {
  *read = false;
  const std::string program = readerProgram();
  if (program.empty()) return std::nullopt;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;  // the caller's own open says why
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDIN_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  // Nothing else of this process's (its sockets stay its own: a peer sees
  // them close when this process closes them, not when the reader ends).
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  // No signal blocked or ignored in it (the caller's thread may block
  // some): a crash there ends it by its signal.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  // The environment but LD_PRELOAD (the program links tutti itself; a
  // preloaded libnccl.so.2 would interpose on it).
  std::vector<char*> env;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.push_back(*e);
  env.push_back(nullptr);
  std::string arg0 = program, arg1 = kReadApartFlag;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = -1;
  const int err = posix_spawn(&pid, program.c_str(), &actions, &attr, argv, env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fd);
  if (err != 0) return std::nullopt;
  return awaitReader(pid, program, read);
}

}  // namespace

std::string readerProgram() {
  auto runnable = [](const std::string& p) { return !p.empty() && access(p.c_str(), X_OK) == 0; };
  if (auto env = params::get("TUTTI_TOPO_READER"); env && !env->empty())
    return runnable(*env) ? *env : std::string();
#ifdef TUTTI_TOPO_READER_BUILT
  if (runnable(TUTTI_TOPO_READER_BUILT)) return TUTTI_TOPO_READER_BUILT;
#endif
#ifdef TUTTI_TOPO_READER_INSTALLED
  if (runnable(TUTTI_TOPO_READER_INSTALLED)) return TUTTI_TOPO_READER_INSTALLED;
#endif
  return {};
}

std::optional<std::string> hwlocCrashesApart(const std::string& path,
                                             const std::function<bool()>& readHere,
                                             ReadApart* how) {
  bool read = false;
  std::optional<std::string> verdict;
  ReadApart way = ReadApart::kNone;
  if (base::threadCount() == 1) {
    verdict = readInFork(readHere, &read);
    if (read) way = ReadApart::kChild;
  }
  if (!read) {
    verdict = readInProgram(path, &read);
    way = read ? ReadApart::kProgram : ReadApart::kNone;
  }
  if (how) *how = way;
  return read ? verdict : std::nullopt;
}

}  // namespace tutti::topo
