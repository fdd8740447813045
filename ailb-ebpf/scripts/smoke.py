#!/usr/bin/env python3
"""Attach smoke test of the ailb eBPF object, without the daemon (root, cgroup2, bpftool).

Loads target/bpf/ailb.bpf.o with bpftool (programs and maps pinned under a scratch bpffs
dir), attaches the three programs to a CHILD cgroup it creates, fills the maps through the
bpf(2) syscall, then runs clients inside that cgroup against python servers on 127.0.0.0/8
and checks placement, affinity, refusals, hostile setsockopt inputs and that the in-flight
counters return to 0. Everything it creates is removed at the end.

Usage: sudo python3 ailb-ebpf/scripts/smoke.py [OBJ]
"""
import ctypes
import errno
import os
import socket
import struct
import subprocess
import sys
import threading
import time

OBJ = sys.argv[1] if len(sys.argv) > 1 else "target/bpf/ailb.bpf.o"
PIN = "/sys/fs/bpf/ailb-ebpf-smoke"
MAPS = PIN + "-maps"

SOL_AILB = 0x41494C
AILB_CONVERSATION, AILB_REQUIRED_MEMORY_MB, AILB_MODEL = 1, 2, 3
MAX_TABLE_SIZE, MAX_MEMBERS, MAX_BACKENDS = 65521, 1024, 4096
MEM_UNKNOWN = 0xFFFFFFFF
VIP = ("127.77.9.1", 8000)
VIP_SHARED = ("127.77.9.2", 8000)
BACKENDS = [("127.0.9.11", 28001), ("127.0.9.12", 28002)]
B0, B1 = (f"{ip}:{port}" for ip, port in BACKENDS)
DEAD = ("127.0.9.13", 28009)  # nothing listens here
NCPU = os.cpu_count()  # possible CPUs == online here (checked below)

libc = ctypes.CDLL(None, use_errno=True)
NR_BPF = 321  # x86_64


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(bytes(attr), 128)
    r = libc.syscall(NR_BPF, cmd, buf, 128)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({cmd}): {os.strerror(e)}")
    return r, buf


def obj_get(path):
    p = ctypes.create_string_buffer(path.encode())
    fd, _ = bpf(7, struct.pack("<QII", ctypes.addressof(p), 0, 0))
    return fd


def map_update(fd, key, value):
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    bpf(2, struct.pack("<IIQQQ", fd, 0, ctypes.addressof(k), ctypes.addressof(v), 0))


def map_lookup(fd, key, size):
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(size)
    bpf(1, struct.pack("<IIQQQ", fd, 0, ctypes.addressof(k), ctypes.addressof(v), 0))
    return v.raw


def u32(i):
    return struct.pack("<I", i)


def addr_key(ip, port):
    return socket.inet_aton(ip) + struct.pack("!H", port)


def conv_hash(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & (2**64 - 1)
    k = h ^ (((len(b) << 56) | (len(b) >> 8)) & (2**64 - 1))
    for m in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        k ^= k >> 33
        k = (k * m) & (2**64 - 1)
    k ^= k >> 33
    return k


STATS = ["picks", "affinity_hits", "affinity_breaks", "spills", "fallbacks", "no_backend", "no_fit",
         "established", "closed", "connect_failures", "sockopts", "bad_sockopts"]
BSTATS = ["picks", "affinity_hits", "established", "closed", "connect_failures", "rtt_us_sum", "rtt_samples"]


def percpu_sum(fd, key, fields):
    raw = map_lookup(fd, u32(key), NCPU * len(fields) * 8)
    out = dict.fromkeys(fields, 0)
    for c in range(NCPU):
        vals = struct.unpack_from(f"<{len(fields)}Q", raw, c * len(fields) * 8)
        for f, v in zip(fields, vals):
            out[f] += v
    return out


def sh(*args, check=True):
    r = subprocess.run(args, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r


def cgroup2_mount():
    for line in open("/proc/mounts"):
        f = line.split()
        if f[2] == "cgroup2":
            return f[1]
    raise RuntimeError("no cgroup2 mount")


class Server(threading.Thread):
    """Accepts connections and answers every one with its own 'ip:port'."""

    def __init__(self, addr):
        super().__init__(daemon=True)
        self.s = socket.socket()
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.s.bind(addr)
        self.s.listen(128)
        self.name_ = f"{addr[0]}:{addr[1]}".encode()

    def run(self):
        while True:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            c.sendall(self.name_)
            c.close()


CLIENT = r'''
import errno, json, socket, struct, sys
SOL_AILB = 0x41494C
res = {}
def conn(addr, opts=()):
    s = socket.socket()
    try:
        for name, val in opts:
            s.setsockopt(SOL_AILB, name, val)
        s.settimeout(5)
        s.connect(tuple(addr))
        data = s.recv(100).decode()
        return data
    except OSError as e:
        return "errno:" + errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
def sockopt(name, val):
    s = socket.socket()
    try:
        s.setsockopt(SOL_AILB, name, val)
        return "ok"
    except OSError as e:
        return "errno:" + errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
vip, shared = tuple(json.loads(sys.argv[1])), tuple(json.loads(sys.argv[2]))
res["plain"] = [conn(vip) for _ in range(20)]
res["conv_a"] = [conn(vip, [(1, b"conversation-a")]) for _ in range(5)]
res["conv_b"] = [conn(vip, [(1, b"conversation-b")]) for _ in range(5)]
res["mem_fit"] = conn(vip, [(2, struct.pack("=I", 1000))])
res["mem_nofit"] = conn(vip, [(2, struct.pack("=I", 90000))])
res["shared_no_model"] = conn(shared)
res["shared_model"] = conn(shared, [(3, b"demo-7b")])
res["shared_unknown_model"] = conn(shared, [(3, b"nope")])
res["bad_empty"] = sockopt(1, b"")
res["bad_129"] = sockopt(1, b"x" * 129)
res["ok_128"] = sockopt(1, b"x" * 128)
res["bad_4096"] = sockopt(1, b"x" * 4096)
res["bad_5000"] = sockopt(1, b"x" * 5000)
res["bad_mem_len3"] = sockopt(2, b"abc")
res["bad_model_65"] = sockopt(3, b"m" * 65)
res["bad_unknown"] = sockopt(99, b"abc")
# Other levels pass through to the kernel.
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
res["reuseaddr"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR); s.close()
s = socket.socket()
try:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, b"x" * 5000)
    res["big_other_level"] = "ok"
except OSError as e:
    res["big_other_level"] = "errno:" + errno.errorcode.get(e.errno, str(e.errno))
s.close()
# Non-VIP destination is untouched.
res["direct"] = conn(json.loads(sys.argv[3]))
print(json.dumps(res))
'''


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    assert open("/sys/devices/system/cpu/possible").read().strip() == f"0-{NCPU - 1}"
    if not any(l.split()[2] == "bpf" and l.split()[1] == "/sys/fs/bpf" for l in open("/proc/mounts")):
        sh("mount", "-t", "bpf", "bpf", "/sys/fs/bpf")
    cg = os.path.join(cgroup2_mount(), "ailb-ebpf-smoke")
    attached = []
    servers = []
    failures = []

    def check(name, cond, detail=""):
        print(("ok   " if cond else "FAIL ") + name + (f"  ({detail})" if detail else ""))
        if not cond:
            failures.append(name)

    try:
        sh("bpftool", "prog", "loadall", OBJ, PIN, "pinmaps", MAPS)
        os.makedirs(cg, exist_ok=True)
        for prog, at in [("ailb_connect4", "connect4"), ("ailb_setsockopt", "setsockopt"), ("ailb_sockops", "sock_ops")]:
            sh("bpftool", "cgroup", "attach", cg, at, "pinned", f"{PIN}/{prog}")
            attached.append((prog, at))
        fd = {n: obj_get(f"{MAPS}/{n}") for n in os.listdir(MAPS)}

        # Config: affinity + load bound, c = 1.25, 4 probes, no TTL.
        map_update(fd["AILB_CONFIG"], u32(0), struct.pack("<IIIIQQ", 1, 1250, 4, 3, 0, 1))
        map_update(fd["AILB_SERVICES"], addr_key(*VIP) + b"\0\0", struct.pack("<II", 0, 0))
        map_update(fd["AILB_SERVICES"], addr_key(*VIP_SHARED) + b"\0\0", struct.pack("<II", 0, 1))
        map_update(fd["AILB_MODEL_NAMES"], struct.pack("<Q", conv_hash(b"demo-7b")), u32(0))
        for i, (ip, port) in enumerate(BACKENDS):
            map_update(fd["AILB_BACKENDS"], u32(i),
                       addr_key(ip, port) + struct.pack("<HIIIIII", 0, 0, 1, 0, 80000, 1, 0))
        size = 4093
        table = [i % 2 for i in range(size)] + [0xFFFFFFFF] * (MAX_TABLE_SIZE - size)
        map_update(fd["AILB_TABLES"], u32(0), struct.pack(f"<{MAX_TABLE_SIZE}I", *table))
        members = [0, 1] + [0xFFFFFFFF] * (MAX_MEMBERS - 2)
        map_update(fd["AILB_MEMBERS"], u32(0), struct.pack(f"<{MAX_MEMBERS}I", *members))
        name = b"demo-7b".ljust(64, b"\0")
        map_update(fd["AILB_MODELS"], u32(0),
                   struct.pack("<II", 0, 1) + struct.pack("<IIQQ", size, 2, 2, 1) + bytes(24) + name)

        for addr in BACKENDS:
            s = Server(addr)
            s.start()
            servers.append(s)

        import json
        env_cmd = [sys.executable, "-c", CLIENT, json.dumps(VIP), json.dumps(VIP_SHARED), json.dumps(BACKENDS[1])]

        def into_cgroup():
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

        out = subprocess.run(env_cmd, capture_output=True, text=True, preexec_fn=into_cgroup, timeout=60)
        if out.returncode != 0:
            raise RuntimeError("client failed: " + out.stderr)
        res = json.loads(out.stdout)
        names = {f"{ip}:{port}" for ip, port in BACKENDS}
        check("plain connects reach a backend", all(r in names for r in res["plain"]), str(res["plain"][:4]))
        # 20 socket-cookie hashes over a table alternating 0/1: all on one backend has p = 2^-19.
        check("plain connects spread over both backends", len(set(res["plain"])) == 2, str(sorted(set(res["plain"]))))
        check("conversation a sticks", len(set(res["conv_a"])) == 1 and res["conv_a"][0] in names, str(res["conv_a"]))
        check("conversation b sticks", len(set(res["conv_b"])) == 1 and res["conv_b"][0] in names, str(res["conv_b"]))
        check("memory hint that fits", res["mem_fit"] in names, res["mem_fit"])
        check("memory hint that fits nowhere -> ECONNREFUSED", res["mem_nofit"] == "errno:ECONNREFUSED", res["mem_nofit"])
        check("shared VIP without model -> ECONNREFUSED", res["shared_no_model"] == "errno:ECONNREFUSED", res["shared_no_model"])
        check("shared VIP with model", res["shared_model"] in names, res["shared_model"])
        check("shared VIP unknown model -> ECONNREFUSED", res["shared_unknown_model"] == "errno:ECONNREFUSED",
              res["shared_unknown_model"])
        for k in ["bad_empty", "bad_129", "bad_4096", "bad_5000", "bad_mem_len3", "bad_model_65"]:
            check(f"{k} -> EINVAL", res[k] == "errno:EINVAL", res[k])
        check("bad_unknown -> ENOPROTOOPT", res["bad_unknown"] == "errno:ENOPROTOOPT", res["bad_unknown"])
        check("128-byte conversation accepted", res["ok_128"] == "ok", res["ok_128"])
        check("other level passes through", res["reuseaddr"] == 1, str(res["reuseaddr"]))
        check("other level, 5000-byte value passes through", res["big_other_level"] == "ok", res["big_other_level"])
        check("non-VIP destination untouched", res["direct"] == B1, res["direct"])

        # Counters settle once every socket is closed (the client has exited).
        deadline = time.time() + 5
        while True:
            inflight = [struct.unpack("<Q", map_lookup(fd["AILB_INFLIGHT"], u32(i), 8))[0] for i in (0, 1, MAX_BACKENDS)]
            if inflight == [0, 0, 0] or time.time() > deadline:
                break
            time.sleep(0.1)
        check("in-flight back to 0 (backends 0, 1, model 0)", inflight == [0, 0, 0], str(inflight))
        st = percpu_sum(fd["AILB_STATS"], 0, STATS)
        print("stats:", st)
        b = [percpu_sum(fd["AILB_BACKEND_STATS"], i, BSTATS) for i in range(2)]
        print("backend stats:", b)
        # plain 20 + conv 10 + mem_fit 1 + shared_model 1 = 32 picks.
        check("picks == 32", st["picks"] == 32, str(st["picks"]))
        check("affinity_hits == 8 (4 + 4 repeats)", st["affinity_hits"] == 8, str(st["affinity_hits"]))
        check("no_fit == 1", st["no_fit"] == 1, str(st["no_fit"]))
        check("no_backend == 2", st["no_backend"] == 2, str(st["no_backend"]))
        check("established == 32", st["established"] == 32, str(st["established"]))
        check("closed == 32", st["closed"] == 32, str(st["closed"]))
        check("sockopts: 10 conv + 2 mem + 2 model + 1 ok_128 = 15", st["sockopts"] == 15, str(st["sockopts"]))
        check("bad_sockopts == 7", st["bad_sockopts"] == 7, str(st["bad_sockopts"]))
        check("backend picks sum to 32", b[0]["picks"] + b[1]["picks"] == 32)
        check("rtt samples taken", b[0]["rtt_samples"] + b[1]["rtt_samples"] == 32)

        def run_client(code):
            lib = CLIENT.split("vip, shared =")[0]
            out = subprocess.run([sys.executable, "-c", lib + code], capture_output=True, text=True,
                                 preexec_fn=into_cgroup, timeout=60)
            if out.returncode != 0:
                raise RuntimeError("client failed: " + out.stderr)
            return json.loads(out.stdout)

        # The kernel's hash of the setsockopt bytes == ailb_common::hash (golden "hello"), read
        # back from the socket's sk_storage (the map key is the socket fd).
        here = os.path.dirname(os.path.abspath(__file__))
        r = run_client(f"""
sys.path.insert(0, {here!r})
import smoke
fd = smoke.obj_get({MAPS + "/AILB_SOCK"!r})
out = []
for conv in [b"hello", b"conversation-a", b"x" * 128]:
    s = socket.socket()
    s.setsockopt(SOL_AILB, 1, conv)
    s.setsockopt(SOL_AILB, 2, struct.pack("=I", 1234))
    s.setsockopt(SOL_AILB, 3, b"demo-7b")
    v = smoke.map_lookup(fd, struct.pack("<i", s.fileno()), 32)
    out.append(list(struct.unpack("<QQIIII", v)))
    s.close()
print(json.dumps(out))
""")
        for conv, (c, mh, mem, flags, _, _) in zip([b"hello", b"conversation-a", b"x" * 128], r):
            check(f"kernel hash of {conv[:16]!r} == conversation_hash", c == conv_hash(conv), f"{c:#x}")
            check(f"model hash, memory hint and flags for {conv[:16]!r}",
                  mh == conv_hash(b"demo-7b") and mem == 1234 and flags == 7, f"{mh:#x} {mem} {flags}")
        check("golden hash of 'hello'", conv_hash(b"hello") == 2797699151107936019)

        # Least-loaded fallback (the bpf_loop member scan): c = 0 puts every slot over its bound.
        map_update(fd["AILB_CONFIG"], u32(0), struct.pack("<IIIIQQ", 1, 0, 4, 3, 0, 2))
        r = run_client(f"print(json.dumps([conn({list(VIP)!r}) for _ in range(4)]))")
        check("fallback connects reach a backend", all(x in names for x in r), str(r))
        # Backend 0 has too little memory for the hint: the scan must skip it.
        map_update(fd["AILB_BACKENDS"], u32(0),
                   addr_key(*BACKENDS[0]) + struct.pack("<HIIIIII", 0, 0, 1, 0, 500, 1, 0))
        r = run_client(f"print(json.dumps([conn({list(VIP)!r}, [(2, struct.pack('=I', 1000))]) for _ in range(4)]))")
        check("fallback with a memory hint skips the backend that does not fit",
              r == [B1] * 4, str(r))
        st3 = percpu_sum(fd["AILB_STATS"], 0, STATS)
        check("fallbacks == 8", st3["fallbacks"] == 8, str(st3["fallbacks"]))
        map_update(fd["AILB_CONFIG"], u32(0), struct.pack("<IIIIQQ", 1, 1250, 4, 3, 0, 3))

        # Affinity break: conversation-a's backend is drained; it moves, and the break is counted.
        home = [B0, B1].index(res["conv_a"][0])
        other = 1 - home

        def set_backend(i, free_mb, state):
            map_update(fd["AILB_BACKENDS"], u32(i),
                       addr_key(*BACKENDS[i]) + struct.pack("<HIIIIII", 0, 0, 1, 0, free_mb, state, 0))

        set_backend(home, 80000, 0)
        r = run_client(f"print(json.dumps([conn({list(VIP)!r}, [(1, b'conversation-a')]) for _ in range(2)]))")
        st4 = percpu_sum(fd["AILB_STATS"], 0, STATS)
        check("drained affinity backend: conversation moves", r == [[B0, B1][other]] * 2, str(r))
        check("affinity_breaks == 1 (then a hit on the new home)",
              st4["affinity_breaks"] == 1 and st4["affinity_hits"] == st["affinity_hits"] + 1, str(st4))
        set_backend(home, 80000, 1)

        # Connect failure: backend 1 points at a closed port; pick it via a 1-backend table.
        map_update(fd["AILB_BACKENDS"], u32(1), addr_key(*DEAD) + struct.pack("<HIIIIII", 0, 0, 1, 0, 80000, 1, 0))
        map_update(fd["AILB_TABLES"], u32(1), struct.pack(f"<{MAX_TABLE_SIZE}I", *([1] * MAX_TABLE_SIZE)))
        map_update(fd["AILB_MEMBERS"], u32(1), struct.pack(f"<{MAX_MEMBERS}I", *([1] + [0xFFFFFFFF] * (MAX_MEMBERS - 1))))
        map_update(fd["AILB_MODELS"], u32(0),
                   struct.pack("<II", 1, 1) + struct.pack("<IIQQ", size, 2, 2, 1) + struct.pack("<IIQQ", 7, 1, 1, 2) + name)
        out = subprocess.run([sys.executable, "-c", CLIENT.split("vip, shared =")[0] +
                              f"print(json.dumps([conn({list(VIP)!r}) for _ in range(3)]))"],
                             capture_output=True, text=True, preexec_fn=into_cgroup, timeout=60)
        r = out.stdout.strip()
        check("connect to a dead backend -> ECONNREFUSED x3", r == '["errno:ECONNREFUSED", "errno:ECONNREFUSED", "errno:ECONNREFUSED"]', r + out.stderr)
        st2 = percpu_sum(fd["AILB_STATS"], 0, STATS)
        b1 = percpu_sum(fd["AILB_BACKEND_STATS"], 1, BSTATS)
        check("connect_failures == 3", st2["connect_failures"] == 3, str(st2["connect_failures"]))
        check("backend 1 connect_failures == 3", b1["connect_failures"] == 3, str(b1["connect_failures"]))
        inflight = [struct.unpack("<Q", map_lookup(fd["AILB_INFLIGHT"], u32(i), 8))[0] for i in (0, 1, MAX_BACKENDS)]
        check("in-flight 0 after failures", inflight == [0, 0, 0], str(inflight))
        for v in fd.values():
            os.close(v)
    finally:
        for s in servers:
            s.s.close()
        for prog, at in reversed(attached):
            sh("bpftool", "cgroup", "detach", cg, at, "pinned", f"{PIN}/{prog}", check=False)
        if os.path.isdir(cg):
            try:
                os.rmdir(cg)
            except OSError as e:
                print("rmdir cgroup:", e)
        sh("rm", "-rf", PIN, MAPS)
    if failures:
        print(f"{len(failures)} FAILED: {failures}")
        sys.exit(1)
    print("all smoke checks passed")


if __name__ == "__main__":
    main()
