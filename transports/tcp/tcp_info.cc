// TCP_INFO, read through the kernel's own header: glibc's netinet/tcp.h
// stops at older fields of struct tcp_info (so this file includes no other
// header that pulls it in).
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "transports/tcp/tcp_transport.h"

namespace tutti::transport::tcp {

bool tcpLinkCounters(int fd, Connection::LinkCounters* out) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  // Kernels before 4.10 have no busy time: nothing to tell.
  if (len < offsetof(tcp_info, tcpi_sndbuf_limited) + sizeof info.tcpi_sndbuf_limited) return false;
  out->bytesAcked = info.tcpi_bytes_acked;
  out->busyUs = info.tcpi_busy_time > info.tcpi_rwnd_limited
                    ? info.tcpi_busy_time - info.tcpi_rwnd_limited
                    : 0;
  return true;
}

}  // namespace tutti::transport::tcp
