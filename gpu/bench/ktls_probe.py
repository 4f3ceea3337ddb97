"""Whether this machine's kernel can carry TLS records itself (kernel TLS, the `tls` ULP).

Kernel TLS would let a lane's bytes be encrypted and decrypted by the kernel after a rustls
handshake, with no copies through rustls's buffers. This probe needs no TLS library: it
attaches the ULP to a loopback TCP pair, installs the same made-up AES-GCM-256 keys for
sending on one end and receiving on the other, and checks that bytes sent arrive intact.
Prints one line: what worked, or the first step that failed and its errno.
"""

import os
import socket
import struct
import sys

TCP_ULP = 31
SOL_TLS = 282
TLS_TX = 1
TLS_RX = 2
TLS_1_3_VERSION = 0x0304
TLS_CIPHER_AES_GCM_256 = 52


def crypto_info(key: bytes, iv: bytes, salt: bytes, seq: bytes) -> bytes:
    """`struct tls12_crypto_info_aes_gcm_256` from linux/tls.h."""
    return struct.pack("<HH", TLS_1_3_VERSION, TLS_CIPHER_AES_GCM_256) + iv + key + salt + seq


def main() -> int:
    """Runs the probe; 0 when kernel TLS carried the bytes, 1 otherwise."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    info = crypto_info(os.urandom(32), os.urandom(8), os.urandom(4), bytes(8))
    steps = [
        ("ULP on sender", lambda: sender.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")),
        ("ULP on receiver", lambda: receiver.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")),
        ("TLS_TX", lambda: sender.setsockopt(SOL_TLS, TLS_TX, info)),
        ("TLS_RX", lambda: receiver.setsockopt(SOL_TLS, TLS_RX, info)),
    ]
    for name, step in steps:
        try:
            step()
        except OSError as error:
            print(f"kernel TLS: no ({name}: errno {error.errno} {error.strerror}; uname {os.uname().release})")
            return 1
    payload = os.urandom(1 << 20)
    sender.sendall(payload)
    got = bytearray()
    while len(got) < len(payload):
        chunk = receiver.recv(len(payload) - len(got))
        if not chunk:
            break
        got += chunk
    ok = bytes(got) == payload
    print(f"kernel TLS: {'yes' if ok else 'NO: bytes differ'} (AES-GCM-256 TX and RX, 1 MiB; uname {os.uname().release})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
