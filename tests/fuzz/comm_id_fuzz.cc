// Fuzz target: the numeric address parsers behind NCCL_COMM_ID-style
// "host:port" / "[v6]:port" strings and the TCP endpoints peers publish
// (net::parseNumericAddr, net::parseIp in base/socket.h). Neither does name
// resolution (net::parseAddr does, through getaddrinfo, and is not fuzzed:
// a fuzzer must not send DNS queries).
//
// Input: byte 0 selects the port handed to parseIp (with byte 1); the rest
// is the string.
//
// Invariants: an accepted address is IPv4 or IPv6 with the matching length;
// parseNumericAddr's port is 1..65535 and is the number after the last ':';
// parseIp keeps the port it was given; what an accepted address prints
// (SockAddr::str) parses back to the same address and port.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "base/socket.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using tutti::net::SockAddr;

void checkAddr(const SockAddr& a) {
  FUZZ_CHECK(a.family() == AF_INET || a.family() == AF_INET6);
  FUZZ_CHECK(a.len == (a.family() == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6)));
}

bool sameAddr(const SockAddr& a, const SockAddr& b) {
  if (a.family() != b.family() || a.port() != b.port()) return false;
  if (a.family() == AF_INET)
    return std::memcmp(&reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr,
                       &reinterpret_cast<const sockaddr_in*>(&b.ss)->sin_addr, 4) == 0;
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(&b.ss)->sin6_addr, 16) == 0;
}

// What an address prints must read back as the same address.
void checkRoundTrip(const SockAddr& a) {
  auto again = tutti::net::parseNumericAddr(a.str());
  if (a.port() == 0) {  // parseIp accepts port 0; an endpoint never has it
    FUZZ_CHECK(!again.isOk());
    return;
  }
  FUZZ_CHECK(again.isOk());
  FUZZ_CHECK(sameAddr(a, *again));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::Input in(data, size);
  const uint16_t port = in.value<uint16_t>();
  size_t n = 0;
  const uint8_t* rest = in.take(in.left(), &n);
  const std::string text(reinterpret_cast<const char*>(rest), n);

  auto endpoint = tutti::net::parseNumericAddr(text);
  if (endpoint.isOk()) {
    checkAddr(*endpoint);
    const size_t colon = text.rfind(':');
    FUZZ_CHECK(colon != std::string::npos);
    FUZZ_CHECK(endpoint->port() >= 1);
    FUZZ_CHECK(std::to_string(endpoint->port()) ==
               std::to_string(std::strtoul(text.c_str() + colon + 1, nullptr, 10)));
    checkRoundTrip(*endpoint);
  } else {
    FUZZ_CHECK(!endpoint.status().message().empty());
  }

  // The host part alone (as NCCL_COMM_ID's "host" would be split off).
  auto ip = tutti::net::parseIp(text, port);
  if (ip.isOk()) {
    checkAddr(*ip);
    FUZZ_CHECK(ip->port() == port);
    checkRoundTrip(*ip);
  }
  return 0;
}
