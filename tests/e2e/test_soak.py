"""Load that must not hurt `quire serve` (issue 25): a WebSocket client that
never reads, and a soak of 2,000 mixed requests (HTTP whole and streamed,
WebSocket, cancels, clients that vanish, hostile shapes).  Afterwards no
request runs, no KV block is used, and the memory stays within its bounds."""
import json
import os
import random
import re
import socket
import struct
import tempfile
import threading
import time

from test_hostile import CASES, exchange
from test_serve_openai import Server

# The slow reader's bound on RSS growth from the start: the KV pool (--kv-mem
# 64, touched as it fills), the connection's --max-pending (8 MiB) and 40 MB
# for the requests' own state and the allocator.  The soak's bound on growth
# after its first 200 requests (the pool touched by then).
SLOW_RSS_BOUND_MB = 64 + 8 + 40
SOAK_RSS_BOUND_MB = 48
# Under ASan freed memory waits in a quarantine (256 MB) and RSS says
# nothing of the server's own bounds: those runs check everything else.
SANITIZED = os.environ.get("QUIRE_SANITIZED") == "1"


def ws_connect(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 101")
    return s


def ws_frame(text):
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    head = b"\x81" + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536
                      else bytes([0x80 | 127]) + struct.pack(">Q", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def ws_read_until_done(s, cid, timeout=30):
    """Reads frames until cid's done or error frame (unmasked server frames)."""
    s.settimeout(timeout)
    buf = b""
    while True:
        while len(buf) < 2 or len(buf) < frame_len(buf):
            b = s.recv(65536)
            if not b:
                raise ConnectionError("closed")
            buf += b
        n = frame_len(buf)
        op, payload = buf[0] & 15, buf[n - payload_len(buf):n]
        buf = buf[n:]
        if op == 1:
            m = json.loads(payload)
            if m.get("id") == cid and m["type"] in ("done", "error"):
                return m


def payload_len(b):
    n = b[1] & 127
    return struct.unpack(">H", b[2:4])[0] if n == 126 else struct.unpack(">Q", b[2:10])[0] if n == 127 else n


def frame_len(b):
    if len(b) < 2:
        return 2
    n = b[1] & 127
    head = 4 if n == 126 else 10 if n == 127 else 2
    if len(b) < head:
        return head
    return head + payload_len(b)


def wait_idle(server, secs=10):
    deadline = time.time() + secs
    while time.time() < deadline:
        if server.metric("quire_requests_running") == 0 and server.metric('quire_kv_blocks{state="used"}') == 0:
            return True
        time.sleep(0.05)
    return False


def test_slow_reader_websocket(quire):
    """One WebSocket with 400 requests that never reads a frame: the server
    keeps at most --max-pending (8 MiB) of its output, then cancels its
    requests and closes it with a log line and a metric; RSS stays within
    SLOW_RSS_BOUND_MB of where it began (without the bound it grew by 456 MB)."""
    log = tempfile.mktemp(prefix="quire-slow-", suffix=".log")
    s = Server(quire, "--max-requests", "512", log=log)
    try:
        base = s.rss_kb()
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", s.port))
        c.sendall(b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        for i in range(400):
            c.sendall(ws_frame(json.dumps({"type": "chat", "id": f"r{i}", "prompt": "Once upon a time",
                                           "max_tokens": 2000, "ignore_eos": True, "logprobs": 5})))
        peak = base
        deadline = time.time() + 120
        closed = 0
        while time.time() < deadline:
            peak = max(peak, s.rss_kb())
            closed = s.metric('quire_connections_closed_total{reason="slow_reader"}') or 0
            if closed >= 1 and wait_idle(s, 0.1):
                break
            time.sleep(0.1)
        assert closed == 1, "the unread socket was not closed"
        assert wait_idle(s), "requests or KV blocks left behind"
        growth = (peak - base) / 1024
        print(f"slow reader: RSS {base / 1024:.0f} MB at the start, peak {peak / 1024:.0f} MB (+{growth:.1f} MB)")
        assert SANITIZED or growth < SLOW_RSS_BOUND_MB
        # The socket is closed: reading gives what was sent, then the end.
        c.settimeout(10)
        try:
            while c.recv(1 << 20):
                pass
        except OSError:
            pass
        c.close()
        status, _ = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
        assert status == 200
    finally:
        assert s.stop() == 0
    text = open(log).read()
    assert re.search(r"a client fell \d+ bytes behind \(--max-pending 8 MiB\); its \d+ requests are cancelled", text)


HOSTILE = [c for c in CASES if "pipelined" not in c[0] and "50" not in c[0]]


def soak_one(server, rng, i):
    kind = rng.choice(["http", "http", "sse", "sse", "ws", "ws", "ws_cancel", "vanish", "vanish_ws", "hostile"])
    body = {"prompt": rng.choice(["Once upon a time", "The cat", "Lily"]), "max_tokens": rng.randint(1, 12),
            "temperature": rng.choice([0, 0.8])}
    if kind == "http":
        status, _ = server.post("/v1/completions", body)
        assert status == 200
    elif kind == "sse":
        status, text = server.post("/v1/completions", {**body, "stream": True})
        assert status == 200 and text.rstrip().endswith("data: [DONE]")
    elif kind in ("ws", "ws_cancel"):
        s = ws_connect(server.port)
        try:
            s.sendall(ws_frame(json.dumps({"type": "chat", "id": "a", **body,
                                           **({"max_tokens": 2000, "ignore_eos": True} if kind == "ws_cancel" else {})})))
            if kind == "ws_cancel":
                s.sendall(ws_frame(json.dumps({"type": "cancel", "id": "a"})))
            m = ws_read_until_done(s, "a")
            assert m["type"] == "done"
        finally:
            s.close()
    elif kind == "vanish":
        s = socket.create_connection(("127.0.0.1", server.port))
        data = json.dumps({**body, "max_tokens": 500, "stream": True, "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        s.recv(100)
        s.close()
    elif kind == "vanish_ws":
        s = ws_connect(server.port)
        s.sendall(ws_frame(json.dumps({"type": "chat", "id": "v", **body, "max_tokens": 500, "ignore_eos": True})))
        s.recv(10)
        s.close()
    else:
        name, data, want, _ = rng.choice(HOSTILE)
        exchange(server.port, data, want, wait=5)
    return kind


def test_soak_2000_mixed(quire):
    """2,000 mixed requests from 12 threads in bounded time; afterwards 0
    running requests, 0 used KV blocks, RSS growth within SOAK_RSS_BOUND_MB, the
    server still answering at once."""
    log = tempfile.mktemp(prefix="quire-soak-", suffix=".log")
    s = Server(quire, "--request-timeout", "3", "--idle-timeout", "3", log=log)
    try:
        counts, errors, lock = {}, [], threading.Lock()
        n_total, done = 2000, [0]
        rss = []

        def worker(seed):
            rng = random.Random(seed)
            while True:
                with lock:
                    if done[0] >= n_total:
                        return
                    done[0] += 1
                    i = done[0]
                try:
                    k = soak_one(s, rng, i)
                    with lock:
                        counts[k] = counts.get(k, 0) + 1
                except Exception as e:  # noqa: BLE001 - every failure is reported below
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}")
                if i in (200, 1000, 2000):
                    rss.append(s.rss_kb())

        t0 = time.time()
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(12)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
        took = time.time() - t0
        print(f"soak: {n_total} requests in {took:.1f} s: {sorted(counts.items())}; RSS (MB) "
              f"{[round(r / 1024) for r in rss]}")
        assert not errors, errors[:5]
        assert sum(counts.values()) == n_total
        assert took < 240
        assert s.proc.poll() is None
        assert wait_idle(s, 15), "requests or KV blocks left behind"
        assert SANITIZED or (s.rss_kb() - rss[0]) / 1024 < SOAK_RSS_BOUND_MB
        status, _ = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
        assert status == 200
    finally:
        assert s.stop() == 0
