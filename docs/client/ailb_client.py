#!/usr/bin/env python3
"""ailb client example: tag a socket with a conversation id, then connect to a model VIP.

    python3 docs/client/ailb_client.py [VIP:PORT] [CONVERSATION_ID] [PROMPT]

Defaults: 127.77.0.1:8000 (the VIP of `ailb run`'s embedded default) and "conversation-42".
Only processes in the cgroup ailb is attached to are balanced (`ailb-demo` for the default
config); elsewhere the setsockopt fails with ENOPROTOOPT and the client connects directly.
"""
import errno
import socket
import struct
import sys

SOL_AILB = 0x41494C
AILB_CONVERSATION = 1
AILB_REQUIRED_MEMORY_MB = 2  # value: struct.pack("=I", megabytes)
AILB_MODEL = 3
AILB_PREFIX = 5  # value: struct.pack("=%dQ" % n, *keys), 1..16 keys, none 0
AILB_PREFIX_ON_REQUEST = 6  # value: struct.pack("=I", 1): keys withheld; connect() raises ENOKEY when wanted


def text_prefix_keys(prompt: bytes) -> list:
    """The keys a prompt sends in text mode (docs/prefix.md): chained XXH3-64 over 64-byte
    chunks, then every k-th and the last. Needs the `xxhash` package (pip install xxhash)."""
    import xxhash  # the reference XXH3; any implementation gives the same keys

    seed = int.from_bytes(b"ailbpref", "big")
    h = lambda b: xxhash.xxh3_64_intdigest(b, seed) or 1
    parent = h(b"ailb.prefix.text.v1" + struct.pack("<I", 64))
    keys = []
    for i in range(0, len(prompt) - len(prompt) % 64, 64):
        parent = h(struct.pack("<Q", parent) + prompt[i:i + 64])
        keys.append(parent)
    n, k = len(keys), 1
    while -(-n // k) > 16:
        k *= 2
    sent = [keys[j * k - 1] for j in range(1, n // k + 1)]
    if n and n % k:
        sent.append(keys[-1])
    return sent


def main() -> int:
    vip = sys.argv[1] if len(sys.argv) > 1 else "127.77.0.1:8000"
    conversation = (sys.argv[2] if len(sys.argv) > 2 else "conversation-42").encode()
    host, _, port = vip.rpartition(":")

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Must be set before connect(): the pick happens in the kernel at connect time.
        s.setsockopt(SOL_AILB, AILB_CONVERSATION, conversation)
        print(f"tagged the socket with conversation {conversation.decode()!r}")
        if len(sys.argv) > 3:
            # A prompt's prefix keys: models with a `prefix` mode route by the cached prefix.
            keys = text_prefix_keys(sys.argv[3].encode())
            if keys:
                s.setsockopt(SOL_AILB, AILB_PREFIX, struct.pack("=%dQ" % len(keys), *keys))
                print(f"tagged the socket with {len(keys)} prefix keys")
    except OSError as e:
        if e.errno != errno.ENOPROTOOPT:
            raise  # EINVAL: the id must be 1..128 bytes
        print("ailb not loaded, connecting directly")

    try:
        s.settimeout(10)
        s.connect((host, int(port)))
    except ConnectionRefusedError:
        print(f"connection to {vip} refused: no server there (is `ailb run` up, and is this "
              "process in its cgroup?), or ailb found no live backend that fits")
        return 1
    except OSError as e:
        print(f"cannot connect to {vip}: {e}")
        return 1

    with s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: {vip}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    print(reply.decode(errors="replace"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
