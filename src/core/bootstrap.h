// Bootstrap: how the ranks of a communicator find each other.
//
// Contract
// - createUniqueId() fills the 128-byte ncclUniqueId with the address of a
//   root listener (started on a detached thread of the calling process), a
//   fresh 32-byte random key and a random nonce. With NCCL_COMM_ID="host:port"
//   the id names that address instead, rank 0 starts the root inside init,
//   and the key comes from the operator: TUTTI_BOOTSTRAP_SECRET (text) or
//   TUTTI_BOOTSTRAP_SECRET_FILE (a file's bytes), hashed (auth::deriveKey).
//   With neither, the key is all zeros: the job runs unauthenticated and
//   says so once in a WARN. A key is never derived from an address.
// - Every connection, to the root or to a peer's listener, starts with the
//   mutual challenge-response of base/auth.h: the key never travels, and a
//   listener reads nothing else from a connection that has not proven it
//   (net::Gate: 2 s to do so, at most 64 such connections held, served
//   without blocking beside the honest ones).
// - Listeners bind the address they advertise (NCCL_SOCKET_IFNAME's, else
//   the interface net::selectInterface picks); unless the interface is
//   pinned and when that address is not loopback, a second listener on
//   loopback serves the processes of the same host; once the peer table
//   shows every rank on this host, the outward listener is closed. Never the
//   wildcard. A rank's interface, unless pinned, is the one that reaches the
//   root's advertised address (loopback for a root on loopback).
// - A root serves one communicator and then ends (thread gone, listener
//   closed): once every rank has registered and been sent the peer table;
//   when a registered rank hangs up before that (its init failed or was
//   aborted, its process died; the others are told); or at its deadline,
//   TUTTI_INIT_TIMEOUT seconds after it started while no rank has registered
//   (an id nobody uses), restarted at the first registration. Nothing talks to
//   the root after the table. A rank that arrives later is refused and fails
//   within a few seconds with an error saying the id expired or was used
//   (with NCCL_COMM_ID, refusals are retried until its deadline: rank 0 may
//   not have started the root yet).
// - Bootstrap::init() registers this rank with the root, receives every
//   rank's PeerInfo and the communicator's nonce, and opens this rank's own
//   listeners for point-to-point control messages, served by a thread.
// - Every blocking call has a deadline (TUTTI_INIT_TIMEOUT for init, default
//   120 s) and notices the abort flag; a rank that never joins is named in the
//   error of every rank that did.
// - send/recv are point-to-point control messages keyed by (peer, tag),
//   delivered in order per (peer, tag), at most kMaxControlMessageBytes each
//   (bootstrap_wire.h); allGather/barrier are built on them and must be
//   called by every rank in the same order. When the service thread has
//   failed, recv reports why instead of waiting for its deadline.
// - Threads: the root and service threads are started by base::startThread
//   (base/thread.h), so nothing thrown on one reaches std::terminate.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/auth.h"
#include "base/socket.h"
#include "base/status.h"
#include "core/bootstrap_wire.h"
#include "transports/transport.h"

namespace tutti::core {

constexpr size_t kUniqueIdBytes = 128;
constexpr size_t kSecretBytes = 32;

// Layout of the bytes inside ncclUniqueId.
struct UniqueIdData {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;  // kIdRootByRank0, kIdNoKey
  uint64_t rootHostId;
  uint16_t family;
  uint16_t port;
  uint8_t ip[16];
  uint8_t secret[kSecretBytes];  // the communicator's key (auth::Key)
  uint64_t nonce;         // identifies the communicator (shm names, logs); 0: the root draws it
  uint16_t loopbackPort;  // the root's loopback listener (0: none), for ranks on its host
  uint8_t reserved[kUniqueIdBytes - 82];
};
static_assert(sizeof(UniqueIdData) == kUniqueIdBytes, "UniqueIdData must be 128 bytes");
static_assert(std::is_trivially_copyable_v<UniqueIdData>, "UniqueIdData crosses processes");
constexpr uint32_t kIdMagic = 0x54555454;  // "TTUT"
constexpr uint16_t kIdVersion = 2;
constexpr uint16_t kIdRootByRank0 = 1;
constexpr uint16_t kIdNoKey = 4;  // NCCL_COMM_ID without a key: unauthenticated

// What every rank tells every other at init. Plain data: it crosses processes.
struct PeerInfo {
  int32_t rank;
  int32_t pid;
  uint64_t hostId;
  uint16_t family;
  uint16_t port;   // bootstrap listener on the advertised address
  uint8_t ip[16];  // address towards other hosts
  char hostname[64];
  int32_t nranks;
  uint16_t loopbackPort;  // bootstrap listener on loopback (0: none), for peers on this host
  uint16_t flags;
};
static_assert(sizeof(PeerInfo) == 112, "PeerInfo layout changed");
static_assert(std::is_trivially_copyable_v<PeerInfo>, "PeerInfo crosses processes");

Status createUniqueId(uint8_t out[kUniqueIdBytes]);
// A fresh root on this process and a fresh random secret, whatever
// NCCL_COMM_ID says: what createUniqueId() makes without NCCL_COMM_ID, and
// the id of a communicator made from an existing one (ncclCommSplit). The id travels to the
// other ranks over the parent's authenticated bootstrap. (NCCL_COMM_ID's one
// address serves the first communicator only: children that reused it
// collided on its port.)
Status createFreshId(uint8_t out[kUniqueIdBytes]);

// The processes of this host a communicator made from another (a split's or
// a shrink's) needs alive while it waits for its ranks to join: Comm::split
// and Comm::shrink register them under the new id's nonce, and that
// communicator's Bootstrap takes them (once) and fails its init when one of
// them is gone, naming it, instead of waiting TUTTI_INIT_TIMEOUT for a rank
// that died (found by the soak, tests/mp/soak.cc).
struct JoinMember {
  int parentRank = -1;  // its rank in the communicator made from
  int pid = 0;
};
void expectMembers(const uint8_t id[kUniqueIdBytes], std::vector<JoinMember> members);
Result<UniqueIdData> parseUniqueId(const uint8_t in[kUniqueIdBytes]);

// "<who> gave up after an error of its own: <why>": what a rank reports of
// a peer's failure notice. A `why` that is itself such a report (a failure
// passed on from rank to rank) is cut to its root cause, with the count of
// ranks it passed through: "rank 4 (...) gave up after an error of its own
// (passed on by 3 more ranks): rank 0 (...) is gone: ...".
std::string gaveUpMessage(const std::string& who, std::string_view why);

// The families of bootstrap tags, by their top four bits: allGather and
// barrier (1xxx), data-connection handshakes (01xx but the failure notice),
// the failure notice (0101), a split's exchange (0011) and a shrink's id
// (0010); a family's sequence number and step fill the bits below 60.
inline constexpr uint64_t kCollectiveTagBase = 1ull << 63;  // Bootstrap::allGather, barrier
inline constexpr uint64_t kSplitTagBase = 3ull << 60;       // Comm::splitExchange
inline constexpr uint64_t kShrinkTagBase = 2ull << 60;      // Comm::shrink
// The tag of a failure notice (Comm::noticeFailure): a rank that gave up
// after an error tells every peer why.
inline constexpr uint64_t kFailureNoticeTag = 5ull << 60;
// Data-connection handshakes (Comm::connectPair) use tags kConnectTagBase |
// (pair, channel, step) below bit 62. A wait for one of them from a peer
// whose failure notice has arrived ends with that reason instead of lasting
// until its deadline: a rank that gave up accepts no connection. (Other
// waits are left alone: a communicator in error state may still split.)
inline constexpr uint64_t kConnectTagBase = 1ull << 62;
inline bool isConnectTag(uint64_t tag) { return (tag >> 62) == 1 && tag != kFailureNoticeTag; }
// The tag of channel `ch`'s handshake between ranks lo < hi (steps below
// 16 added); channel kHelloChannel is no channel: the message each side
// sends before its handshakes, by which a rank waiting for a message from
// any rank (Comm::awaitAnySource) sees that a peer wants to connect.
inline constexpr uint64_t kHelloChannel = 1023;
inline uint64_t connectTag(uint64_t lo, uint64_t hi, uint64_t ch) {
  return kConnectTagBase | (lo << 38) | (hi << 14) | (ch << 4);
}

class Bootstrap : public transport::ControlChannel {
 public:
  static Result<std::unique_ptr<Bootstrap>> init(const UniqueIdData& id, int rank, int nranks,
                                                 const std::atomic<bool>* abortFlag);
  ~Bootstrap() override;

  Status send(int peer, uint64_t tag, const void* data, size_t bytes) override;
  Result<std::vector<uint8_t>> recv(int peer, uint64_t tag) override;
  Result<std::vector<uint8_t>> recvUntil(int peer, uint64_t tag, net::Clock::time_point deadline,
                                         const std::atomic<bool>* abortFlag) override;
  // A failure notice from `peer` has arrived (left in the mailbox for
  // Comm::noticeFrom): its reason as an error; or `peer` is on this host and
  // its process is gone.
  Status gaveUp(int peer) override;
  // Whether a message from `peer` with `tag` waits in the mailbox (it stays there).
  bool pending(int peer, uint64_t tag);
  // send() with its own deadline (best-effort notices to peers that may be gone).
  Status sendUntil(int peer, uint64_t tag, const void* data, size_t bytes,
                   net::Clock::time_point deadline);
  // Whether this rank holds a connection to `peer` (a send then costs no
  // connection, only the write).
  bool connectedTo(int peer);
  // data holds nranks blocks of `bytes`; this rank's block must be filled.
  Status allGather(void* data, size_t bytes);
  Status barrier();

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  const uint8_t* secret() const { return id_.secret; }
  const UniqueIdData& id() const { return id_; }
  const net::SockAddr& localAddr() const { return localAddr_; }
  // The interface localAddr is on (net::selectInterface's choice).
  const std::string& interfaceName() const { return ifName_; }
  // Deadline for control-plane waits started now.
  net::Clock::time_point deadline() const;

 private:
  Status gaveUpLocked(int peer) const;  // gaveUp(), mu_ held
  // An error naming `peer` (every peer: -1) when it is on this host and its
  // process is gone; else ok.
  Status localPeersAlive(int peer) const;
  Bootstrap() = default;
  Status start();
  Status connectRoot(const net::SockAddr& rootAddr, net::Clock::time_point deadline,
                     net::Socket* out);
  Status serviceLoop();
  net::SockAddr peerAddr(int peer) const;
  auth::Key key() const;
  // Queues a message from `peer` (under mu_ or before the service thread runs).
  void deliver(int peer, uint64_t tag, std::vector<uint8_t> payload);

  UniqueIdData id_{};
  int rank_ = -1;
  int nranks_ = 0;
  double timeoutSec_ = 120;
  const std::atomic<bool>* abortFlag_ = nullptr;
  std::vector<PeerInfo> peers_;
  net::SockAddr localAddr_;
  std::string ifName_;
  net::Socket listener_;          // on localAddr_
  net::Socket loopbackListener_;  // on loopback, when localAddr_ is not

  std::thread service_;
  std::atomic<bool> stop_{false};
  int wakeFd_ = -1;  // eventfd in the service thread's poll: ~Bootstrap ends its wait at once
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, uint64_t>, std::deque<std::vector<uint8_t>>> mailbox_;
  size_t mailboxBytes_ = 0;  // payload bytes held in mailbox_ (under mu_)
  Status serviceError_;      // why the service thread ended early (under mu_)

  std::mutex sendMu_;
  std::map<int, net::Socket> out_;
  uint64_t collSeq_ = 0;
};

}  // namespace tutti::core
