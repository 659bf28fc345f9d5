"""Hostile clients against a running `quire serve` (issue 25): every input of
the hardening report, and more of the same shapes, over raw sockets.  For
each: the process stays alive, the documented status (or a clean close)
comes back, and a normal request is answered within a second afterwards."""
import asyncio
import json
import re
import socket
import subprocess
import time

import pytest
import websockets

from test_serve_openai import MODEL, Server

BODY = json.dumps({"prompt": "Once", "max_tokens": 2, "temperature": 0}).encode()


def post(body=BODY, extra=b"", path=b"/v1/completions"):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
            b"Content-Length: %d\r\n\r\n" % len(body) + body)


def chunked(body, sizes):
    out, i = b"", 0
    for n in sizes:
        out += b"%x\r\n" % n + body[i:i + n] + b"\r\n"
        i += n
    return out + b"0\r\n\r\n"


GET_HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CHUNK_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")

# name, bytes sent, the statuses expected in order ([] : a close with no answer), whether the server closes.
CASES = [
    ("header over 16 KiB", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", [431], True),
    ("header of 5 KB (within the limit)", b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " +
     b"a" * 5000 + b"\r\n\r\n", [200], True),
    ("300 small headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(300)) +
     b"\r\n", [431], True),
    ("100 KB URI", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", [414], True),
    ("9 KB URI", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", [414], True),
    ("%00 in the path", b"GET /v1/models%00 HTTP/1.1\r\nHost: x\r\n\r\n", [400], True),
    ("bad escape", b"GET /v1/%zz HTTP/1.1\r\nHost: x\r\n\r\n", [400], True),
    ("non-UTF-8 path", b"GET /%ff HTTP/1.1\r\nHost: x\r\n\r\n", [400], True),
    ("absolute-form URI", b"GET http://127.0.0.1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", [200], True),
    ("TRACE", b"TRACE / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", [405], True),
    ("PUT", b"PUT /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", [405], True),
    ("PROPFIND", b"PROPFIND / HTTP/1.1\r\nHost: x\r\n\r\n", [501], True),
    ("FOO", b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n", [501], True),
    ("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", [405], True),
    ("CONNECT", b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", [405], True),
    ("TLS ClientHello", bytes.fromhex("16030100a5010000a10303") + bytes(range(32)) + b"\x00" * 100, [400], True),
    ("random bytes", bytes(range(256)) * 4, [400], True),
    ("NULs", b"\x00" * 64, [400], True),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", [505], True),
    ("HTTP/3.0", b"GET /health HTTP/3.0\r\nHost: x\r\n\r\n", [505], True),
    ("no Host in HTTP/1.1", b"GET /health HTTP/1.1\r\n\r\n", [400], True),
    ("HTTP/1.0 without Host", b"GET /health HTTP/1.0\r\n\r\n", [200], True),
    ("folded header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n", [400], True),
    ("header without colon", b"GET /health HTTP/1.1\r\nHost: x\r\nbogus\r\n\r\n", [400], True),
    ("GET then POST pipelined", GET_HEALTH + post(), [200, 200], False),
    ("POST then POST pipelined", post() + post(), [200, 200], False),
    ("3 POSTs pipelined", post() * 3, [200, 200, 200], False),
    ("50 POSTs pipelined", post() * 50, [200] * 50, False),
    ("pipelined, the last with close", post() * 2 + post(extra=b"Connection: close\r\n"), [200, 200, 200], True),
    ("chunked body", CHUNK_HEAD + chunked(BODY, [5, len(BODY) - 5]), [200], False),
    ("chunked body, one byte a chunk", CHUNK_HEAD + chunked(BODY, [1] * len(BODY)), [200], False),
    ("chunked with extension and trailer", CHUNK_HEAD + b"%x;ext=1\r\n" % len(BODY) + BODY + b"\r\n0\r\nX-T: 1\r\n\r\n",
     [200], False),
    ("chunked, bad size", CHUNK_HEAD + b"zz\r\nabc\r\n0\r\n\r\n", [400], True),
    ("chunked, data longer than its size", CHUNK_HEAD + b"2\r\nabcd\r\n0\r\n\r\n", [400], True),
    ("chunked past --max-body", CHUNK_HEAD + b"200000\r\n", [413], True),
    ("Content-Length and Transfer-Encoding", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", [400], True),
    ("Transfer-Encoding gzip", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", [501], True),
    ("Content-Length -1", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + BODY, [400], True),
    ("Content-Length huge", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
     [400], True),
    ("two Content-Lengths", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"
     b"abcd", [400], True),
    ("declared over --max-body (413 before the body)", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 5000000\r\n\r\n", [413], True),
    ("POST without a length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n" + BODY, [411], True),
    ("Content-Length 0", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
     [400], True),
    ("Expect 100-continue", post(extra=b"Expect: 100-continue\r\nConnection: close\r\n"), [100, 200], True),
    ("Expect something else", post(extra=b"Expect: magic\r\n"), [417], True),
    ("unknown path", b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", [404], True),
    ("POST to /health", post(path=b"/health", extra=b"Connection: close\r\n"), [405], True),
    ("WebSocket handshake without a key", b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
     b"Connection: Upgrade\r\n\r\n", [400], True),
    ("WebSocket version 8", b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n", [426], True),
    ("DNS rebinding: Origin and Host a name", b"GET /v1/ws HTTP/1.1\r\nHost: evil.example:80\r\n"
     b"Origin: http://evil.example:80\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", [403], True),
    ("Origin of another scheme", b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:80\r\n"
     b"Origin: https://127.0.0.1:80\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", [403], True),
    ("cross-site POST", post(extra=b"Origin: http://evil.example\r\n"), [403], True),
]


def statuses(data):
    """The status codes of the HTTP replies in data, in order."""
    return [int(m) for m in re.findall(rb"HTTP/1\.1 (\d{3}) [A-Za-z]", data)]


def exchange(port, data, want, wait=10.0):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(wait)
    try:
        s.sendall(data)
    except OSError:
        pass
    got, closed = b"", False
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            b = s.recv(65536)
        except socket.timeout:
            break
        except OSError:
            closed = True
            break
        if not b:
            closed = True
            break
        got += b
        if len(statuses(got)) >= len(want) and not want[-1:] == [100]:
            # All answers are in; wait a little for a close, if one comes.
            s.settimeout(0.3)
    s.close()
    return got, closed


def port_of(url):
    return int(url.rsplit(":", 1)[1])


def normal_request_fast(server):
    t = time.time()
    status, body = server.post("/v1/completions", {"prompt": "Once", "max_tokens": 2, "temperature": 0})
    assert status == 200, body
    return time.time() - t


@pytest.fixture(scope="module")
def server(quire):
    s = Server(quire, "--max-body", "1024", "--request-timeout", "2", "--idle-timeout", "2")
    yield s
    assert s.stop() == 0


@pytest.mark.parametrize("name,data,want,closes", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(server, name, data, want, closes):
    got, closed = exchange(server.port, data, want)
    assert statuses(got) == want, got[:600]
    if closes:
        assert closed, f"{name}: the connection stayed open"
    assert server.proc.poll() is None, "the server died"
    assert normal_request_fast(server) < 1.0


def test_slowloris_and_idle(server):
    """A request sent a byte at a time past --request-timeout gets 408 and a
    close; an idle connection is closed after --idle-timeout; meanwhile the
    server answers others at once."""
    slow = socket.create_connection(("127.0.0.1", server.port))
    idle = socket.create_connection(("127.0.0.1", server.port))
    t0 = time.time()
    got = b""
    slow.settimeout(0.2)
    for ch in GET_HEALTH[:20]:
        try:
            slow.send(bytes([ch]))
        except OSError:
            break
        try:
            b = slow.recv(4096)
            if not b:
                break
            got += b
        except socket.timeout:
            pass
        assert normal_request_fast(server) < 1.0
    slow.settimeout(5)
    try:
        while True:
            b = slow.recv(4096)
            if not b:
                break
            got += b
    except OSError:
        pass
    assert statuses(got) == [408]
    assert time.time() - t0 < 10
    idle.settimeout(5)
    assert idle.recv(10) == b""  # closed by the server after 2 s
    assert server.metric('quire_connections_closed_total{reason="timeout"}') >= 2


def test_disconnect_storm(server):
    """200 connections that send half a request and vanish, 100 that vanish
    mid-body: nothing leaks, the server answers at once afterwards."""
    for i in range(300):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(post()[: 30 if i < 200 else len(post()) - 5])
        s.close()
    assert normal_request_fast(server) < 1.0
    assert server.metric("quire_requests_running") == 0


def test_websocket_protocol_errors(server):
    """Frames that break RFC 6455 close the socket with the code the RFC
    gives; the server goes on."""
    async def frames(raw, expect_code):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101") and b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head
        writer.write(raw)
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        # The close frame: 0x88, length, code.
        i = data.find(b"\x88\x02")
        assert i >= 0 and int.from_bytes(data[i + 2:i + 4], "big") == expect_code, data

    def masked(op, payload, fin=True, rsv=0):
        mask = b"\x01\x02\x03\x04"
        n = len(payload)
        head = bytes([(0x80 if fin else 0) | rsv << 4 | op])
        head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
        return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))

    asyncio.run(frames(b"\x81\x05hello", 1002))                   # unmasked
    asyncio.run(frames(masked(1, b"x", rsv=4), 1002))              # reserved bit
    asyncio.run(frames(masked(9, b"p" * 126), 1002))               # control frame too long
    asyncio.run(frames(masked(1, b"\xff\xfe"), 1007))              # text not UTF-8
    asyncio.run(frames(masked(0, b"x"), 1002))                     # continuation of nothing
    asyncio.run(frames(masked(3, b"x"), 1002))                     # unknown opcode
    asyncio.run(frames(masked(8, b"\x03\xe8"), 1000))              # a close is answered
    assert normal_request_fast(server) < 1.0


def test_websocket_ping_and_fragments(server):
    """A ping gets its pong; a message in fragments is one message."""
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await asyncio.wait_for(await ws.ping(b"abc"), 5)
            msg = json.dumps({"type": "chat", "id": "f", "prompt": "Once", "max_tokens": 2})
            await ws.send([msg[:7], msg[7:20], msg[20:]])
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 10))
                if m["type"] in ("done", "error"):
                    return m
    assert asyncio.run(go())["type"] == "done"


def test_session_turn_refused_after_storing_keeps_alternation(quire):
    """A session turn valid alone but too long with its history is refused
    after the turn was stored: an empty reply marked partial keeps the
    conversation's roles alternating (templates such as Mistral's refuse two
    user messages in a row)."""
    s = Server(quire)
    try:
        words = " ".join(["Lily went to the park with her dog."] * 30)

        async def go():
            async with websockets.connect(f"ws://127.0.0.1:{s.port}/v1/ws") as ws:
                sid, errors = None, 0
                for i in range(6):
                    msg = {"type": "chat", "id": f"t{i}", "messages": [{"role": "user", "content": words}],
                           "max_tokens": 2, "temperature": 0}
                    msg.update({"session": sid} if sid else {"new_session": True})
                    await ws.send(json.dumps(msg))
                    while True:
                        m = json.loads(await asyncio.wait_for(ws.recv(), 30))
                        if m["type"] == "start":
                            sid = m.get("session") or sid
                        if m["type"] in ("done", "error"):
                            break
                    if m["type"] == "error":
                        errors += 1
                        assert m["error"]["code"] == "context_length_exceeded" or "context" in m["error"]["message"]
                        break
                return sid, errors
        sid, errors = asyncio.run(go())
        assert sid and errors == 1
        deadline = time.time() + 5
        while time.time() < deadline:
            msgs = s.request("GET", f"/v1/sessions/{sid}")[1]["messages"]
            if msgs[-1]["role"] == "assistant":
                break
            time.sleep(0.05)
        roles = [m["role"] for m in msgs]
        assert roles == ["user", "assistant"] * (len(roles) // 2), roles
        assert msgs[-1]["content"] == "" and msgs[-1]["status"] == "partial"
    finally:
        assert s.stop() == 0


def big_schema_body(n=2000):
    """A schema of n alternatives whose grammar is too large: it compiles for
    about a second here before it is refused."""
    schema = {"anyOf": [{"type": "object", "properties": {
        "a": {"type": "integer", "minimum": i, "maximum": i + 5000},
        "b": {"type": "string", "maxLength": i % 50 + 1}}, "required": ["a", "b"]} for i in range(n)]}
    return {"prompt": "x", "max_tokens": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}}


def test_health_answers_while_a_schema_compiles(server):
    """Request preparation runs off the socket thread: /health answers within
    100 ms while an anyOf of 2,000 alternatives compiles (beside 400
    patternProperties and a prompt of 1 MB); a schema that failed is refused
    again at once."""
    import threading
    results = {}

    def post(name, body):
        t = time.time()
        results[name] = (server.post("/v1/completions", body), time.time() - t)

    pp = {"prompt": "x", "max_tokens": 2, "guided_json": {
        "type": "object", "patternProperties": {f"^p{i}[a-z]+$": {"type": "integer"} for i in range(400)}}}
    big_prompt = {"prompt": "Once upon a time " * 60000, "max_tokens": 1}
    threads = [threading.Thread(target=post, args=("schema", big_schema_body())),
               threading.Thread(target=post, args=("pp", pp)),
               threading.Thread(target=post, args=("prompt", big_prompt))]
    for th in threads:
        th.start()
    worst, polls = 0.0, 0
    while threads[0].is_alive():
        t = time.time()
        assert server.get("/health")[0] == 200
        worst = max(worst, time.time() - t)
        polls += 1
        time.sleep(0.02)
    for th in threads:
        th.join()
    (status, body), took = results["schema"]
    assert status == 400 and "too many states" in body
    assert polls >= 5, f"the compile took {took:.2f} s: too short to measure"
    assert worst < 0.1, f"/health took {worst * 1000:.0f} ms while the schema compiled"
    assert results["pp"][0][0] == 200 and results["prompt"][0][0] in (200, 400)
    (status2, body2), again = (lambda t: (server.post("/v1/completions", big_schema_body()), time.time() - t))(time.time())
    assert status2 == 400 and json.loads(body2) == json.loads(body)
    assert again < max(0.2, took / 5), f"refused again in {again:.2f} s (first: {took:.2f} s)"


def test_max_connections(quire):
    """Past --max-connections a new connection is closed at once (counted);
    once others close, connections are taken again."""
    s = Server(quire, "--max-connections", "4")
    try:
        time.sleep(2.5)  # the start's /health polls closed (a closing connection lingers up to 2 s)
        held = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(4)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", s.port))
        extra.settimeout(5)
        try:
            assert extra.recv(10) == b""
        except ConnectionResetError:
            pass
        extra.close()
        for c in held:
            c.close()
        time.sleep(0.2)
        assert s.get("/health")[0] == 200
        assert s.metric('quire_connections_closed_total{reason="too_many"}') == 1
    finally:
        assert s.stop() == 0


def test_refusals_name_their_field(server):
    """400s name the field at fault (top_p 0, a stop string past 512 bytes),
    and the range said is the one the server takes."""
    for body, param, words in [({"prompt": "x", "top_p": 0}, "top_p", "(0, 1]"),
                               ({"prompt": "x", "top_p": 1.5}, "top_p", "outside"),
                               ({"prompt": "x", "stop": ["a" * 600]}, "stop", "at most 512 bytes"),
                               ({"prompt": "x", "stop": "b" * 513}, "stop", "at most 512 bytes")]:
        status, text = server.post("/v1/completions", body)
        err = json.loads(text)["error"]
        assert status == 400 and err["param"] == param and words in err["message"], (body, err)
    status, _ = server.post("/v1/completions", {"prompt": "x", "top_p": 1, "max_tokens": 1, "stop": ["a" * 512]})
    assert status == 200


def test_grammar_timeout(quire):
    """--grammar-timeout bounds a compile's wall time: the 2,000-alternative
    anyOf is refused with a 400 that names the budget and the field, a
    schema that fits is still taken, and the refused one is refused again
    from the cache of failures.  A budget that is not a positive number of
    seconds stops the start."""
    bad = subprocess.run([quire, "serve", "-m", MODEL, "--grammar-timeout", "0"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "--grammar-timeout" in bad.stderr
    s = Server(quire, "--grammar-timeout", "0.05")
    try:
        t = time.time()
        status, body = s.post("/v1/completions", big_schema_body())
        took = time.time() - t
        err = json.loads(body)["error"]
        assert status == 400 and err["param"] == "response_format.json_schema.schema", body
        assert "time budget (0.05 s)" in err["message"], err
        assert s.get("/health")[0] == 200
        ok = {"prompt": "x", "max_tokens": 4, "guided_json": {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"]}}
        assert s.post("/v1/completions", ok)[0] == 200
        t = time.time()
        status2, body2 = s.post("/v1/completions", big_schema_body())
        again = time.time() - t
        assert status2 == 400 and json.loads(body2) == json.loads(body)
        print(f"refused after {took:.3f} s, again in {again:.3f} s")
    finally:
        assert s.stop() == 0
