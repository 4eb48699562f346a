// Who may join (docs/security.md), with ranks as threads of this process:
// the key with NCCL_COMM_ID comes from the operator and never from the
// address; a rank with another key is refused at once and the job goes on;
// no listener of tutti is on the wildcard address, and once every rank is
// known to be on this host nothing listens beyond loopback; idle and
// half-open connections to the root and to the ranks' listeners do not delay
// init or split.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap.h"
#include "harness.h"

namespace tutti::test {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

core::UniqueIdData idData(const ncclUniqueId& id) {
  core::UniqueIdData d{};
  memcpy(&d, id.internal, sizeof(d));
  return d;
}

// A port nobody listens on now (bound and released).
uint16_t freePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct Listener {
  std::string addr;  // hex as /proc/net/tcp writes it
  bool v6;
  uint16_t port;
  bool wildcard() const { return addr.find_first_not_of('0') == std::string::npos; }
  bool loopback() const {
    return v6 ? addr == "00000000000000000000000001000000" : addr.substr(6, 2) == "7F";
  }
};

// The TCP sockets this process listens on (/proc/net/tcp{,6} matched with
// the socket inodes among /proc/self/fd).
std::vector<Listener> myListeners() {
  std::set<std::string> inodes;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char link[256] = {};
      std::string p = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = readlink(p.c_str(), link, sizeof(link) - 1);
      if (n > 9 && strncmp(link, "socket:[", 8) == 0)
        inodes.insert(std::string(link + 8, static_cast<size_t>(n) - 9));
    }
    closedir(d);
  }
  std::vector<Listener> out;
  for (bool v6 : {false, true}) {
    std::ifstream in(v6 ? "/proc/net/tcp6" : "/proc/net/tcp");
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      char local[64] = {}, remote[64] = {};
      unsigned state = 0;
      char inode[32] = {};
      if (sscanf(line.c_str(), " %*d: %63s %63s %x %*s %*s %*s %*s %*s %31s", local, remote, &state,
                 inode) != 4)
        continue;
      if (state != 0x0A || !inodes.count(inode)) continue;  // 0x0A: LISTEN
      const char* colon = strchr(local, ':');
      if (!colon) continue;
      out.push_back({std::string(local, static_cast<size_t>(colon - local)), v6,
                     static_cast<uint16_t>(strtoul(colon + 1, nullptr, 16))});
    }
  }
  return out;
}

std::string describe(const std::vector<Listener>& ls) {
  std::string s;
  for (auto& l : ls)
    s += (l.v6 ? "[" : "") + l.addr + (l.v6 ? "]" : "") + ":" + std::to_string(l.port) + " ";
  return s;
}

// `n` connections to each port: idle ones, and ones that sent the first
// byte of a hello and stopped (the attacks of issue 29).
std::vector<int> strangers(const std::vector<uint16_t>& ports, int n) {
  std::vector<int> fds;
  for (uint16_t port : ports)
    for (int i = 0; i < n; ++i) {
      int fd = connectLoopback(port);
      if (fd < 0) continue;
      if (i % 2) {
        uint8_t b = 0x54;
        (void)!send(fd, &b, 1, MSG_NOSIGNAL);
      }
      fds.push_back(fd);
    }
  return fds;
}

// Runs an all-reduce of exact integers on every rank's communicator.
void checkAllReduce(const std::vector<ncclComm_t>& comms) {
  const int n = static_cast<int>(comms.size());
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      std::vector<int32_t> buf(1000);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<int32_t>(r * 1000 + i);
      ASSERT_EQ(
          ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclInt32, ncclSum, comms[r], nullptr),
          ncclSuccess)
          << ncclGetLastError(comms[r]);
      for (size_t i = 0; i < buf.size(); ++i)
        ASSERT_EQ(buf[i], static_cast<int32_t>(1000 * n * (n - 1) / 2 + n * i)) << i;
    });
  for (auto& t : ts) t.join();
}

// Inits `ids.size()` ranks (rank r from ids[r]) on threads; returns their
// results, communicators and errors.
struct Inits {
  std::vector<ncclResult_t> rc;
  std::vector<ncclComm_t> comm;
  std::vector<std::string> err;
};
Inits initRanks(int nranks, const std::vector<std::pair<int, ncclUniqueId>>& who) {
  Inits out;
  out.rc.assign(who.size(), ncclSuccess);
  out.comm.assign(who.size(), nullptr);
  out.err.assign(who.size(), "");
  std::vector<std::thread> ts;
  for (size_t k = 0; k < who.size(); ++k)
    ts.emplace_back([&, k] {
      out.rc[k] = ncclCommInitRank(&out.comm[k], nranks, who[k].second, who[k].first);
      out.err[k] = ncclGetLastError(nullptr);
    });
  for (auto& t : ts) t.join();
  return out;
}

TEST(BootstrapKey, WithNcclCommIdTheKeyComesFromTheSecretNeverFromTheAddress) {
  ncclUniqueId a1, a2, b, none1, none2;
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40001"}, {"TUTTI_BOOTSTRAP_SECRET", "alpha"}});
    ASSERT_EQ(ncclGetUniqueId(&a1), ncclSuccess) << ncclGetLastError(nullptr);
  }
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40002"}, {"TUTTI_BOOTSTRAP_SECRET", "alpha"}});
    ASSERT_EQ(ncclGetUniqueId(&a2), ncclSuccess) << ncclGetLastError(nullptr);
  }
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40001"}, {"TUTTI_BOOTSTRAP_SECRET", "beta"}});
    ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess) << ncclGetLastError(nullptr);
  }
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40001"}, {"TUTTI_BOOTSTRAP_SECRET", ""}});
    ASSERT_EQ(ncclGetUniqueId(&none1), ncclSuccess) << ncclGetLastError(nullptr);
  }
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40002"}, {"TUTTI_BOOTSTRAP_SECRET", ""}});
    ASSERT_EQ(ncclGetUniqueId(&none2), ncclSuccess) << ncclGetLastError(nullptr);
  }
  auto key = [](const ncclUniqueId& id) {
    auto d = idData(id);
    return std::vector<uint8_t>(d.secret, d.secret + sizeof(d.secret));
  };
  const auto expected = auth::deriveKey("alpha").bytes;
  EXPECT_EQ(key(a1), std::vector<uint8_t>(expected.begin(), expected.end()));
  EXPECT_EQ(key(a1), key(a2));  // the address changes nothing
  EXPECT_NE(key(a1), key(b));
  // No secret: no key (all zeros, flagged), whatever the address.
  EXPECT_EQ(key(none1), std::vector<uint8_t>(core::kSecretBytes, 0));
  EXPECT_EQ(key(none2), key(none1));
  EXPECT_TRUE(idData(none1).flags & core::kIdNoKey);
  EXPECT_FALSE(idData(a1).flags & core::kIdNoKey);
}

TEST(BootstrapKey, AKeyFileGivesTheKeyOfItsTextAndBothSettingsAreAnError) {
  char path[] = "/tmp/tutti-key-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "alpha\n", 6), 6);
  close(fd);
  ncclUniqueId fromFile, fromText;
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40003"}, {"TUTTI_BOOTSTRAP_SECRET_FILE", path}});
    ASSERT_EQ(ncclGetUniqueId(&fromFile), ncclSuccess) << ncclGetLastError(nullptr);
  }
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40003"}, {"TUTTI_BOOTSTRAP_SECRET", "alpha"}});
    ASSERT_EQ(ncclGetUniqueId(&fromText), ncclSuccess) << ncclGetLastError(nullptr);
  }
  EXPECT_EQ(memcmp(idData(fromFile).secret, idData(fromText).secret, core::kSecretBytes), 0);
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40003"},
             {"TUTTI_BOOTSTRAP_SECRET_FILE", path},
             {"TUTTI_BOOTSTRAP_SECRET", "alpha"}});
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("set one"), std::string::npos)
        << ncclGetLastError(nullptr);
  }
  {
    Env env({{"NCCL_COMM_ID", "127.0.0.1:40003"},
             {"TUTTI_BOOTSTRAP_SECRET_FILE", "/nonexistent/tutti.key"}});
    ncclUniqueId id;
    EXPECT_NE(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("/nonexistent/tutti.key"),
              std::string::npos)
        << ncclGetLastError(nullptr);
  }
  unlink(path);
}

// An intruder who knows NCCL_COMM_ID but holds another key claims rank 1
// before the real rank 1 starts: it is refused at once with a clear error,
// and the job is created and computes exact results.
TEST(BootstrapKey, AnIntruderWithAnotherKeyIsRefusedAndTheJobRuns) {
  const std::string addr = "127.0.0.1:" + std::to_string(freePort());
  ncclUniqueId good, bad;
  {
    Env env({{"NCCL_COMM_ID", addr.c_str()}, {"TUTTI_BOOTSTRAP_SECRET", "alpha"}});
    ASSERT_EQ(ncclGetUniqueId(&good), ncclSuccess);
  }
  {
    Env env({{"NCCL_COMM_ID", addr.c_str()}, {"TUTTI_BOOTSTRAP_SECRET", "guess"}});
    ASSERT_EQ(ncclGetUniqueId(&bad), ncclSuccess);
  }
  Env env({{"NCCL_SOCKET_IFNAME", "lo"}, {"TUTTI_INIT_TIMEOUT", "30"}, {"NCCL_SHM_DISABLE", "1"}});
  ncclResult_t intruderRc = ncclSuccess;
  std::string intruderErr;
  double intruderTook = 0;
  std::vector<ncclResult_t> rc(2, ncclInternalError);
  std::vector<ncclComm_t> comms(2, nullptr);
  std::vector<std::string> errs(2);
  std::thread rank0([&] {
    rc[0] = ncclCommInitRank(&comms[0], 2, good, 0);
    errs[0] = ncclGetLastError(nullptr);
  });
  std::thread intruder([&] {
    ncclComm_t c = nullptr;
    auto t0 = Clock::now();
    intruderRc = ncclCommInitRank(&c, 2, bad, 1);
    intruderTook = secondsSince(t0);
    intruderErr = ncclGetLastError(nullptr);
    if (c) ncclCommDestroy(c);
  });
  intruder.join();
  std::thread rank1([&] {
    rc[1] = ncclCommInitRank(&comms[1], 2, good, 1);
    errs[1] = ncclGetLastError(nullptr);
  });
  rank0.join();
  rank1.join();
  EXPECT_EQ(intruderRc, ncclInvalidUsage) << intruderErr;
  EXPECT_NE(intruderErr.find("another key"), std::string::npos) << intruderErr;
  EXPECT_LT(intruderTook, 10.0) << intruderErr;
  ASSERT_EQ(rc[0], ncclSuccess) << errs[0];
  ASSERT_EQ(rc[1], ncclSuccess) << errs[1];
  checkAllReduce(comms);
  for (auto* c : comms) ncclCommDestroy(c);
}

// Without NCCL_SOCKET_IFNAME (the interface tutti picks itself) and over
// TCP: while the root runs, and while a communicator lives, no listener of
// this process is on the wildcard address; once the ranks know they share
// this host, every listener left is on loopback.
TEST(BootstrapListeners, NeverOnTheWildcardAndOnlyLoopbackOnceTheRanksShareAHost) {
  Env env({{"NCCL_SHM_DISABLE", "1"}, {"TUTTI_INIT_TIMEOUT", "60"}});
  unsetenv("NCCL_SOCKET_IFNAME");
  auto before = myListeners();
  ASSERT_TRUE(before.empty()) << describe(before);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  auto rootOnly = myListeners();
  EXPECT_FALSE(rootOnly.empty());
  for (auto& l : rootOnly) EXPECT_FALSE(l.wildcard()) << describe(rootOnly);
  std::vector<std::pair<int, ncclUniqueId>> who = {{0, id}, {1, id}, {2, id}};
  Inits in = initRanks(3, who);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(in.rc[r], ncclSuccess) << in.err[r];
  checkAllReduce(in.comm);
  // Give the root a moment to close after the table (it ends on its thread).
  std::vector<Listener> after;
  for (int i = 0; i < 100; ++i) {
    after = myListeners();
    bool allLoopback = true;
    for (auto& l : after) allLoopback &= l.loopback();
    if (allLoopback) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(after.empty());  // the ranks' bootstrap listeners
  for (auto& l : after) {
    EXPECT_FALSE(l.wildcard()) << describe(after);
    EXPECT_TRUE(l.loopback()) << describe(after);
  }
  for (auto* c : in.comm) ncclCommDestroy(c);
}

// Idle and half-open connections to the root (placed before any rank
// arrives) do not delay init; the same against every rank's listeners do
// not delay a split. The bound is the handshake time (2 s): the listeners
// serve the honest ranks beside the strangers, so the real delay is far
// below it.
TEST(BootstrapListeners, StrangersDelayNeitherInitNorSplit) {
  Env env({{"NCCL_SOCKET_IFNAME", "lo"}, {"TUTTI_INIT_TIMEOUT", "60"}});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  auto fds = strangers({idData(id).port}, 40);
  EXPECT_GE(fds.size(), 30u);
  auto t0 = Clock::now();
  Inits in = initRanks(3, {{0, id}, {1, id}, {2, id}});
  const double initTook = secondsSince(t0);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(in.rc[r], ncclSuccess) << in.err[r];
  EXPECT_LT(initTook, 2.0);

  std::vector<uint16_t> ports;
  for (auto& l : myListeners()) ports.push_back(l.port);
  auto more = strangers(ports, 10);
  EXPECT_GE(more.size(), ports.size() * 5);
  std::vector<ncclComm_t> kids(3, nullptr);
  std::vector<ncclResult_t> rc(3, ncclInternalError);
  t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] { rc[r] = ncclCommSplit(in.comm[r], 0, 2 - r, &kids[r], nullptr); });
  for (auto& t : ts) t.join();
  const double splitTook = secondsSince(t0);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(rc[r], ncclSuccess) << ncclGetLastError(in.comm[r]);
  EXPECT_LT(splitTook, 2.0);
  // The child's ranks are reversed: rank r of the child is 2 - r of the parent.
  std::vector<ncclComm_t> byChildRank = {kids[2], kids[1], kids[0]};
  checkAllReduce(byChildRank);
  for (int fd : fds) close(fd);
  for (int fd : more) close(fd);
  for (auto* c : kids) ncclCommDestroy(c);
  for (auto* c : in.comm) ncclCommDestroy(c);
}

}  // namespace
}  // namespace tutti::test
