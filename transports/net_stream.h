// A byte-pipe Connection (transport.h) over a message transport (net.h).
//
// Until the executor speaks the message seam itself, this is how a network
// transport carries tutti's traffic: each direction owns a ring of bounce
// buffers registered once at connect time. A send copies bytes into the next
// free slot and posts it as one message; the receiver keeps an irecv posted
// on every free slot and hands out the bytes in order (peek/consume let a
// reduction read them in place). The sizes follow ctx.bufferBytes
// (NCCL_BUFFSIZE): kSlots slots per direction, each at most the transport's
// largest message.
//
// Progress: a net plugin may move bytes only inside test(), so a connection
// with messages in flight needs calls even while its executor waits on other
// peers (needsProgress()/progress()); the executor drives it every pass and
// counts an operation done only once its messages have left.
#pragma once

#include <memory>

#include "transports/net.h"
#include "transports/transport.h"

namespace tutti::transport {

// A Transport whose connections are StreamConnections over `net`'s
// NetComms; `net` must outlive it.
std::unique_ptr<Transport> makeStreamTransport(NetTransport* net);

}  // namespace tutti::transport
