#!/usr/bin/env python3
"""A TCP relay that adds a round-trip time and paces each direction to a bandwidth cap.

    wan_relay.py --listen 127.0.0.1:43300 --target 127.0.0.1:43211 --rtt-ms 70 --mbit 1000
    wan_relay.py --measure --rtt-ms 70 --mbit 1000      # what the relay itself carries

Why not ../shared/tools/wan_delay.py for bandwidth: it paces from the moment it gets round
to each piece (`max(free_at, now)`), so every late wake-up of its event loop is lost link
time; on a 2-core machine it carries 83 MB/s of a 125 MB/s cap with nothing else running.
Here the link is modelled, not the relay's scheduling: a piece that arrives at `t` starts
on the link at `max(t, link free)`, occupies it for `len / rate`, and is delivered one
way's delay after it has left. Delivery times advance by exactly the bytes' serialization
time however late a thread wakes, so a late wake-up only delays bytes, it does not lose
bandwidth. Each direction has a reader and a writer thread (socket calls release the GIL).

The cap is the link's, shared by every connection through the relay in that direction (a
client with several connections, such as bulk lanes, shares one link, as it would on a
real WAN); each connection keeps its own queue and order.

What is buffered is bounded: two bandwidth-delay products (at least 64 MiB) per
direction; past that the reader stops reading and TCP pushes back on the sender, as a
full network queue does.
"""

from __future__ import annotations

import argparse
import collections
import socket
import sys
import threading
import time

PIECE = 1 << 20


class Wire:
    """One direction of the modelled link: when it is next free, shared by connections."""

    def __init__(self, rate_bps: float) -> None:
        self.rate = rate_bps  # bytes per second; 0 = unlimited
        self.free_at = 0.0
        self.lock = threading.Lock()

    def send(self, now: float, size: int) -> float:
        """Put `size` bytes that arrived at `now` on the link: when their last byte leaves."""
        with self.lock:
            start = max(now, self.free_at)
            self.free_at = start + (size / self.rate if self.rate else 0.0)
            return self.free_at


class Link:
    """One direction of one connection: pieces of bytes with the time each is due at the
    far end."""

    def __init__(self, delay_s: float, wire: Wire, limit: int) -> None:
        self.delay = delay_s
        self.wire = wire
        self.limit = limit
        self.pieces: collections.deque[tuple[float, bytes]] = collections.deque()
        self.held = 0
        self.closed = False
        self.cond = threading.Condition()

    def put(self, data: bytes) -> None:
        """Queue bytes that arrived now (blocks while the link's buffer is full)."""
        with self.cond:
            while self.held >= self.limit and not self.closed:
                self.cond.wait()
            left = self.wire.send(time.monotonic(), len(data))
            self.pieces.append((left + self.delay, data))
            self.held += len(data)
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def take(self) -> bytes | None:
        """The next piece once it is due; None when the link is closed and empty."""
        with self.cond:
            while not self.pieces and not self.closed:
                self.cond.wait()
            if not self.pieces:
                return None
            due, data = self.pieces[0]
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with self.cond:
            self.pieces.popleft()
            self.held -= len(data)
            self.cond.notify_all()
        return data


def reader(src: socket.socket, link: Link) -> None:
    try:
        while True:
            data = src.recv(PIECE)
            if not data:
                break
            link.put(data)
    except OSError:
        pass
    finally:
        link.close()


def writer(dst: socket.socket, link: Link, other: socket.socket) -> None:
    try:
        while (data := link.take()) is not None:
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        # The far side is gone: stop the other direction too.
        for s in (dst, other):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def relay(client: socket.socket, target: tuple[str, int], delay: float, wires: tuple[Wire, Wire], limit: int) -> None:
    try:
        server = socket.create_connection(target)
    except OSError as e:
        print(f"wan_relay: cannot reach {target[0]}:{target[1]}: {e}", file=sys.stderr)
        client.close()
        return
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up, down = Link(delay, wires[0], limit), Link(delay, wires[1], limit)
    threads = [
        threading.Thread(target=reader, args=(client, up), daemon=True),
        threading.Thread(target=writer, args=(server, up, client), daemon=True),
        threading.Thread(target=reader, args=(server, down), daemon=True),
        threading.Thread(target=writer, args=(client, down, server), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    server.close()


def serve(listen: tuple[str, int], target: tuple[str, int], delay: float, rate: float, limit: int) -> socket.socket:
    """Accept on `listen` in a thread of its own; each connection relayed to `target`."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(listen)
    ls.listen(64)
    wires = (Wire(rate), Wire(rate))

    def accept() -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=relay, args=(c, target, delay, wires, limit), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return ls


def measure(delay: float, rate: float, limit: int, mib: int) -> float:
    """Bytes per second the relay carries from a sender to a sink on this machine."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)
    total = mib << 20

    def drain() -> None:
        c, _ = sink.accept()
        got = 0
        while got < total and (d := c.recv(PIECE)):
            got += len(d)
        c.sendall(b"k")
        c.close()

    threading.Thread(target=drain, daemon=True).start()
    ls = serve(("127.0.0.1", 0), sink.getsockname(), delay, rate, limit)
    c = socket.create_connection(ls.getsockname())
    block = bytes(8 << 20)
    t0 = time.monotonic()
    sent = 0
    while sent < total:
        c.sendall(block[: min(len(block), total - sent)])
        sent += min(len(block), total - sent)
    c.recv(1)
    # The last byte's trip and the acknowledgement's trip are latency, not bandwidth.
    return total / (time.monotonic() - t0 - 2 * delay)


def addr(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host or "127.0.0.1", int(port)


def main() -> int:
    p = argparse.ArgumentParser(description="A TCP relay that adds a round-trip time and a bandwidth cap.")
    p.add_argument("--listen", type=addr)
    p.add_argument("--target", type=addr)
    p.add_argument("--rtt-ms", type=float, default=70.0)
    p.add_argument("--mbit", type=float, default=0.0, help="per-direction cap; 0 = none")
    p.add_argument("--max-seconds", type=float, default=3600.0)
    p.add_argument("--measure", type=int, nargs="?", const=1024, metavar="MIB",
                   help="send MIB MiB through the relay to a local sink and print what it carried")
    a = p.parse_args()
    delay = a.rtt_ms / 2000.0
    rate = a.mbit * 1e6 / 8
    limit = max(64 << 20, int(2 * rate * a.rtt_ms / 1000.0))
    if a.measure:
        got = measure(delay, rate, limit, a.measure)
        cap = f" ({got / rate:.2f} of the {a.mbit:g} Mbit/s cap)" if rate else ""
        print(f"wan_relay: carried {got / 1e6:.1f} MB/s at {a.rtt_ms:g} ms{cap}")
        return 0
    if not a.listen or not a.target:
        p.error("--listen and --target are required (or --measure)")
    serve(a.listen, a.target, delay, rate, limit)
    try:
        time.sleep(a.max_seconds)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
