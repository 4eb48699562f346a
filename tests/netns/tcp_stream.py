#!/usr/bin/env python3
"""One TCP stream, one direction: the plain link rate to compare tutti with.

    tcp_stream.py recv HOST PORT [SECONDS_MAX]   accept one connection, read to end of stream
    tcp_stream.py send HOST PORT SECONDS          connect (retrying ~5 s), write for SECONDS

The receiver prints one line, GB = 1e9 bytes:
    tcp_stream bytes=<n> seconds=<s> GB/s=<x> Gbit/s=<y>
measured from the first byte received to the end of stream, so connection
setup is not part of it. 1 MiB writes and reads, TCP_NODELAY, kernel socket
buffer autotuning (what tutti's TCP transport gets by default).
"""
import socket
import sys
import time

CHUNK = 1 << 20


def recv(host, port, limit):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(1)
    srv.settimeout(limit)
    conn, _ = srv.accept()
    conn.settimeout(limit)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    t0 = None
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        if t0 is None:
            t0 = time.monotonic()
        total += n
    t1 = time.monotonic()
    secs = (t1 - t0) if t0 is not None else 0.0
    rate = total / secs if secs > 0 else 0.0
    print(f"tcp_stream bytes={total} seconds={secs:.4f} GB/s={rate / 1e9:.4f} "
          f"Gbit/s={rate * 8 / 1e9:.4f}", flush=True)


def send(host, port, seconds):
    deadline = time.monotonic() + 5.0
    while True:
        try:
            s = socket.create_connection((host, port), timeout=5.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = b"\x5a" * CHUNK
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # wait for the receiver to close: every byte has arrived
    s.close()


def main(argv):
    if len(argv) < 4 or argv[1] not in ("send", "recv"):
        print(__doc__, file=sys.stderr)
        return 2
    host, port = argv[2], int(argv[3])
    if argv[1] == "recv":
        recv(host, port, float(argv[4]) if len(argv) > 4 else 60.0)
    else:
        send(host, port, float(argv[4]) if len(argv) > 4 else 2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
