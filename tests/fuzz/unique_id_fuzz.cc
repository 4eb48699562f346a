// Fuzz target: core::parseUniqueId, the 128 bytes of an ncclUniqueId a rank
// receives from its launcher (core/bootstrap.h). The input is padded with
// zeros or truncated to 128 bytes.
//
// Invariants: an id whose magic or version is not this tutti's is refused,
// with a message; an accepted id is the input's bytes, unchanged; the root
// address it names prints without reading past the id.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "base/socket.h"
#include "core/bootstrap.h"
#include "tests/fuzz/fuzz_input.h"

using tutti::core::kIdMagic;
using tutti::core::kIdVersion;
using tutti::core::kUniqueIdBytes;
using tutti::core::UniqueIdData;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t id[kUniqueIdBytes] = {};
  std::memcpy(id, data, size < kUniqueIdBytes ? size : kUniqueIdBytes);
  UniqueIdData raw;
  std::memcpy(&raw, id, sizeof(raw));

  auto parsed = tutti::core::parseUniqueId(id);
  const bool ours = raw.magic == kIdMagic && raw.version == kIdVersion;
  if (!ours) FUZZ_CHECK(!parsed.isOk());
  if (!parsed.isOk()) {
    FUZZ_CHECK(!parsed.status().message().empty());
    return 0;
  }
  const UniqueIdData& got = *parsed;
  FUZZ_CHECK(std::memcmp(&got, id, sizeof(got)) == 0);

  // The root's address, as a rank would dial it (whatever the family says).
  tutti::net::SockAddr a;
  if (got.family == AF_INET) {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&a.ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(got.port);
    std::memcpy(&s4->sin_addr, got.ip, 4);
    a.len = sizeof(sockaddr_in);
  } else if (got.family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(got.port);
    std::memcpy(&s6->sin6_addr, got.ip, 16);
    a.len = sizeof(sockaddr_in6);
  }
  const std::string where = a.str();
  FUZZ_CHECK(!where.empty());
  if (a.len) FUZZ_CHECK(a.port() == got.port);
  return 0;
}
