#!/usr/bin/env python3
"""Holds idle HTTP/2 connections or bodiless gRPC streams open on a sluiced gRPC port for a
bounded time, and samples the daemon's resident memory meanwhile (docs/failure.md).

    bench/idle-load.py --addr 127.0.0.1:8081 --pid PID --connections 10000 --hold 20
    bench/idle-load.py --addr 127.0.0.1:8081 --pid PID --connections 1 --streams 1000 --hold 20

Each connection sends the HTTP/2 preface and SETTINGS and answers the server's SETTINGS and
PINGs, as a live client does, then stays idle. With --streams, each connection keeps that many
calls open whose headers are sent and whose body never is: when the daemon resets one (its
body deadline), another is opened, so the count holds for the whole run. Prints the RSS
before, the peak and the last sample, and the resets seen. Standard library only.
"""

import argparse
import selectors
import socket
import struct
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(index, value):
    """HPACK: literal without indexing, indexed name (4-bit prefix), raw value."""
    out = bytearray()
    if index < 15:
        out.append(index)
    else:
        out += bytes([15, index - 15])
    v = value.encode()
    out.append(len(v))
    return bytes(out) + v


# POST, http, /sluice.v1.Limiter/Check, authority, content-type, te: trailers.
BLOCK = (
    b"\x83\x86"
    + literal(4, "/sluice.v1.Limiter/Check")
    + literal(1, "sluice")
    + literal(31, "application/grpc")
    + b"\x00\x02te\x08trailers"
)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Conn:
    def __init__(self, sock, streams):
        self.sock = sock
        self.buf = b""
        self.out = bytearray(PREFACE + frame(SETTINGS, 0, 0))
        self.next_id = 1
        self.streams = streams
        self.open = 0
        self.settled = False

    def open_streams(self):
        while self.open < self.streams:
            self.out += frame(HEADERS, 0x4, self.next_id, BLOCK)
            self.next_id += 2
            self.open += 1

    def feed(self, data, stats):
        self.buf += data
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                return
            kind, flags = self.buf[3], self.buf[4]
            payload = self.buf[9 : 9 + length]
            self.buf = self.buf[9 + length :]
            if kind == SETTINGS and not flags & 1:
                self.out += frame(SETTINGS, 1, 0)
                if not self.settled:
                    self.settled = True
                    self.open_streams()
            elif kind == PING and not flags & 1:
                self.out += frame(PING, 1, 0, payload)
            elif kind == RST_STREAM:
                stats["resets"] += 1
                self.open -= 1
                self.open_streams()
            elif kind == HEADERS:
                stats["answered"] += 1
                if flags & 1:
                    self.open -= 1
                    self.open_streams()
            elif kind == GOAWAY:
                stats["goaway"] += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:8081")
    p.add_argument("--pid", type=int, required=True, help="the sluiced process to sample")
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--streams", type=int, default=0, help="bodiless calls kept open per connection")
    p.add_argument("--hold", type=float, default=20.0, help="seconds, at most 600")
    a = p.parse_args()
    host, port = a.addr.rsplit(":", 1)
    hold = min(max(a.hold, 1.0), 600.0)
    sel = selectors.DefaultSelector()
    stats = {"resets": 0, "answered": 0, "goaway": 0, "closed": 0}
    before = rss_kib(a.pid)
    conns = []
    peak = last = before
    samples = []

    def pump(timeout):
        for key, ev in sel.select(timeout=timeout):
            c = key.data
            try:
                if ev & selectors.EVENT_READ:
                    data = c.sock.recv(65536)
                    if not data:
                        stats["closed"] += 1
                        sel.unregister(c.sock)
                        continue
                    c.feed(data, stats)
                if c.out:
                    n = c.sock.send(c.out)
                    del c.out[:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                stats["closed"] += 1
                sel.unregister(c.sock)
                continue
            sel.modify(
                c.sock,
                selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0),
                c,
            )

    # Connections answer the server as they open: a handshake left unanswered is closed.
    started = time.time()
    for i in range(a.connections):
        s = socket.create_connection((host, int(port)))
        s.setblocking(False)
        c = Conn(s, a.streams)
        conns.append(c)
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
        if i % 100 == 99:
            pump(0)
    print(f"opened {a.connections} connections in {time.time() - started:.1f} s", flush=True)
    opened = time.time()
    next_sample = opened
    while time.time() - opened < hold:
        pump(0.2)
        if time.time() >= next_sample:
            last = rss_kib(a.pid)
            peak = max(peak, last)
            samples.append(last)
            next_sample += 1.0
    open_streams = sum(c.open for c in conns)
    print(
        f"connections {a.connections} (closed by the server: {stats['closed']}), "
        f"bodiless streams open at the end {open_streams}, resets {stats['resets']}, "
        f"goaway {stats['goaway']}"
    )
    print(
        f"RSS before {before / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, "
        f"last {last / 1024:.1f} MiB; per connection {(peak - before) / max(a.connections, 1):.1f} KiB"
        + (f", per stream {(peak - before) / max(a.connections * a.streams, 1):.2f} KiB" if a.streams else "")
    )
    print("samples (MiB): " + " ".join(f"{x / 1024:.0f}" for x in samples))
    for c in conns:
        c.sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
