#!/usr/bin/env python3
"""A TCP relay that cuts its connections on demand: for testing sessions that survive a
dropped connection (Wi-Fi change, VPN reconnect, NAT timeout).

    python3 cut_relay.py --listen 127.0.0.1:43400 --target 127.0.0.1:43211 \\
        [--cut-every SECONDS] [--cuts N] [--after-bytes N]

Every connection accepted on --listen is relayed to --target. Connections are cut (both
sockets closed abruptly, with an RST) every --cut-every seconds, or once --after-bytes
bytes went through one, at most --cuts times in all; SIGUSR1 cuts every open connection at
once. New connections are relayed as before, so a client that reconnects gets through.
Each cut is logged on stderr with the time and the bytes relayed. Standard library only.
"""
from __future__ import annotations

import argparse
import signal
import socket
import struct
import sys
import threading
import time


class Relay:
    def __init__(self, target: tuple[str, int], after_bytes: int, cuts: int) -> None:
        self.target = target
        self.after_bytes = after_bytes
        self.cuts_left = cuts
        self.lock = threading.Lock()
        self.open: list[tuple[socket.socket, socket.socket, list[int]]] = []

    def cut_all(self, why: str) -> None:
        with self.lock:
            if self.cuts_left == 0 or not self.open:
                return
            self.cuts_left -= 1
            pairs, self.open = self.open, []
        for a, b, moved in pairs:
            for s in (a, b):
                try:
                    # SO_LINGER 0: close sends an RST, as a broken path would look.
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass
            print(f"cut_relay: {time.strftime('%H:%M:%S')} cut ({why}) after {moved[0]} bytes", file=sys.stderr,
                  flush=True)

    def pump(self, src: socket.socket, dst: socket.socket, moved: list[int]) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
                moved[0] += len(data)
                if self.after_bytes and moved[0] >= self.after_bytes:
                    self.cut_all(f"{self.after_bytes} bytes")
                    return
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target)
        except OSError as e:
            print(f"cut_relay: cannot reach {self.target}: {e}", file=sys.stderr, flush=True)
            client.close()
            return
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        moved = [0]
        with self.lock:
            self.open.append((client, server, moved))
        threading.Thread(target=self.pump, args=(client, server, moved), daemon=True).start()
        threading.Thread(target=self.pump, args=(server, client, moved), daemon=True).start()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--cut-every", type=float, default=0)
    p.add_argument("--after-bytes", type=int, default=0)
    p.add_argument("--cuts", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=3600)
    a = p.parse_args()
    relay = Relay(address(a.target), a.after_bytes, a.cuts)
    signal.signal(signal.SIGUSR1, lambda *_: relay.cut_all("SIGUSR1"))
    listener = socket.create_server(address(a.listen))
    listener.settimeout(0.2)
    start = last_cut = time.monotonic()
    print(f"cut_relay: {a.listen} -> {a.target}", file=sys.stderr, flush=True)
    while time.monotonic() - start < a.max_seconds:
        try:
            client, _ = listener.accept()
            relay.serve(client)
        except socket.timeout:
            pass
        if a.cut_every and time.monotonic() - last_cut >= a.cut_every:
            last_cut = time.monotonic()
            relay.cut_all(f"every {a.cut_every:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
