"""The WebSocket protocol of `quire serve` (/v1/ws) with the Python
`websockets` client: two requests at once on one socket, interleaved and
both complete; cancel; errors for bad messages with the socket still
usable; closing the socket mid-stream frees the requests' blocks."""
import asyncio
import json
import signal
import time

import openai
import pytest
import websockets

from test_serve_openai import Server


@pytest.fixture(scope="module")
def server(quire):
    s = Server(quire)
    yield s
    assert s.stop() == 0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def collect(ws, ids, on_frame=None):
    """Frames until every id in ids is done: {id: [frames]}, and the order of
    ids seen; on_frame(frame) may send more messages."""
    got, order, done = {i: [] for i in ids}, [], set()
    while done != set(ids):
        m = json.loads(await ws.recv())
        got.setdefault(m.get("id"), []).append(m)
        order.append(m.get("id"))
        if m["type"] in ("done", "error") and m.get("id") in ids:
            done.add(m["id"])
        if on_frame:
            await on_frame(m)
    return got, order


def test_two_requests_interleaved(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "s1", "prompt": "Once upon a time", "max_tokens": 300,
                                      "temperature": 0, "token_ids": True, "ignore_eos": True}))
            await ws.send(json.dumps({"type": "chat", "id": "s2", "messages": [{"role": "user", "content": "Hi"}],
                                      "max_tokens": 300, "temperature": 0, "ignore_eos": True}))
            return await collect(ws, ["s1", "s2"])
    got, order = run(go())
    for i in ("s1", "s2"):
        frames = got[i]
        assert frames[0]["type"] == "start" and frames[-1]["type"] == "done"
        assert frames[-1]["usage"]["completion_tokens"] == 300
        assert frames[-1]["choices"][0]["finish_reason"] == "length"
        assert frames[-1]["timings"]["ttft_s"] > 0
    assert all("token" in f for f in got["s1"] if f["type"] == "delta")
    # Interleaved: s2 starts before s1 is done.
    assert order.index("s2") < len(order) - 1 - order[::-1].index("s1")
    # The same text as the HTTP API gives.
    _, body = server.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 300, "temperature": 0,
                                              "ignore_eos": True})
    text = "".join(f["text"] for f in got["s1"] if f["type"] == "delta")
    assert text == json.loads(body)["choices"][0]["text"]


def test_cancel_and_errors(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "long", "prompt": "Once", "max_tokens": 1500,
                                      "ignore_eos": True}))
            await ws.send(json.dumps({"type": "chat", "id": "short", "prompt": "Once", "max_tokens": 5,
                                      "ignore_eos": True}))
            await ws.send("not json")
            await ws.send(json.dumps({"type": "chat", "id": "bad", "prompt": "x", "temperature": "hot"}))
            await ws.send(json.dumps({"type": "dance", "id": "x"}))
            await ws.send(json.dumps({"type": "cancel", "id": "nobody"}))
            sent = []

            async def cancel_long(m):     # at the long request's first token
                if m.get("id") == "long" and m["type"] == "delta" and not sent:
                    sent.append(1)
                    await ws.send(json.dumps({"type": "cancel", "id": "long"}))
            return await collect(ws, ["long", "short", "bad", "x", "nobody"], cancel_long)
    got, _ = run(go())
    assert got["long"][-1]["type"] == "done"
    assert got["long"][-1]["choices"][0]["finish_reason"] == "cancelled"
    assert got["long"][-1]["usage"]["completion_tokens"] < 1500
    assert got["short"][-1]["usage"]["completion_tokens"] == 5
    assert got["bad"][-1]["type"] == "error" and got["bad"][-1]["error"]["param"] == "temperature"
    assert got["x"][-1]["type"] == "error" and "unknown message type" in got["x"][-1]["error"]["message"]
    assert got["nobody"][-1]["type"] == "error"
    assert any(f["type"] == "error" and f["id"] is None for f in got.get(None, []))


def test_oversized_message(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "big", "prompt": "x" * (1536 << 10)}))
            m = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "chat", "id": "ok", "prompt": "Once", "max_tokens": 2}))
            got, _ = await collect(ws, ["ok"])
            return m, got["ok"][-1]
    err, last = run(go())
    assert err["type"] == "error" and "larger than" in err["error"]["message"]
    assert last["type"] == "done"     # the socket still works


def test_close_mid_stream_frees_blocks(server):
    async def go():
        for k in range(10):
            # A client that vanishes: no waiting for the closing handshake.
            async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws", close_timeout=0.01) as ws:
                for i in range(5):
                    await ws.send(json.dumps({"type": "chat", "id": f"r{i}", "prompt": "Once", "max_tokens": 1500,
                                              "ignore_eos": True}))
                n = 0
                while n < 10:
                    if json.loads(await ws.recv())["type"] == "delta":
                        n += 1
    run(go())
    deadline = time.time() + 5
    while time.time() < deadline and server.metric('quire_kv_blocks{state="used"}') != 0:
        time.sleep(0.05)
    assert server.metric("quire_requests_running") == 0
    assert server.metric('quire_kv_blocks{state="used"}') == 0
    assert server.get("/health")[0] == 200


def raw_get(port, path):
    """GET path exactly as written (no client-side normalisation): the status."""
    import socket
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_static_files(server):
    status, page = server.get("/")
    assert status == 200 and "<html" in page and "app.js" in page
    assert server.get("/index.html")[1] == page
    status, js = server.get("/app.js")
    assert status == 200 and "/v1/ws" in js
    for path in ("/../README.md", "/%2e%2e/README.md", "/..%2fREADME.md", "/../../etc/passwd", "/web/index.html",
                 "/nonexistent.js"):
        status, data = raw_get(server.port, path)
        assert status == 404 and b'"error"' in data.split(b"\r\n\r\n", 1)[1], path


def test_sigterm_with_grace_lets_streams_finish(quire):
    """SIGTERM with the default grace: running WebSocket and SSE requests
    finish (done, [DONE]), and the process exits 0."""
    s = Server(quire)

    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{s.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "g", "prompt": "Once", "max_tokens": 400,
                                      "ignore_eos": True, "temperature": 0}))
            while json.loads(await ws.recv())["type"] != "delta":
                pass
            s.proc.send_signal(signal.SIGTERM)
            got, _ = await collect(ws, ["g"])
            return got["g"][-1]
    last = run(go())
    assert last["type"] == "done" and last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 400
    assert s.proc.wait(timeout=30) == 0


def test_200_concurrent_clients(server):
    """100 SSE clients (the openai SDK, async) and 100 WebSocket clients at
    once: every stream complete and equal to the greedy text of its prompt,
    and /health answering all along."""
    prompts = ["Once upon a time", "The dog", "Lily and Ben", "A big red ball"]
    want = {p: json.loads(server.post("/v1/completions", {"prompt": p, "max_tokens": 32, "temperature": 0,
                                                           "ignore_eos": True})[1])["choices"][0]["text"]
            for p in prompts}

    async def sse(client, k):
        p = prompts[k % 4]
        stream = await client.completions.create(model="stories260K", prompt=p, max_tokens=32, temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True})
        text, fin = "", None
        async for c in stream:
            if c.choices:
                text += c.choices[0].text
                fin = c.choices[0].finish_reason or fin
        return text == want[p] and fin == "length"

    async def wsc(k):
        p = prompts[k % 4]
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "x", "prompt": p, "max_tokens": 32, "temperature": 0,
                                      "ignore_eos": True}))
            got, _ = await collect(ws, ["x"])
        text = "".join(f["text"] for f in got["x"] if f["type"] == "delta")
        return text == want[p] and got["x"][-1]["usage"]["completion_tokens"] == 32

    async def health(stop):
        import urllib.request
        n = 0
        while not stop.is_set():
            status = await asyncio.to_thread(lambda: urllib.request.urlopen(server.url + "/health", timeout=5).status)
            assert status == 200
            n += 1
            await asyncio.sleep(0.02)
        return n

    async def go():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        stop = asyncio.Event()
        h = asyncio.create_task(health(stop))
        results = await asyncio.gather(*[sse(client, k) for k in range(100)], *[wsc(k) for k in range(100)])
        stop.set()
        return results, await h
    results, n_health = run(go())
    assert sum(results) == 200
    assert n_health >= 1


def test_websocket_origin(quire):
    """A browser page of another site (its Origin not this server) cannot
    open the WebSocket; the server's own page and clients that send no
    Origin can, and --allow-origin admits one more."""
    s = Server(quire, "--allow-origin", "http://app.example:9000")

    async def try_origin(origin):
        try:
            async with websockets.connect(f"ws://127.0.0.1:{s.port}/v1/ws", origin=origin) as ws:
                await ws.send(json.dumps({"type": "chat", "id": "o", "prompt": "Once", "max_tokens": 2}))
                while json.loads(await ws.recv())["type"] != "done":
                    pass
                return "open"
        except (websockets.exceptions.InvalidStatus, websockets.exceptions.InvalidMessage):
            return "refused"
    try:
        assert run(try_origin(None)) == "open"
        assert run(try_origin(f"http://127.0.0.1:{s.port}")) == "open"
        assert run(try_origin("http://app.example:9000")) == "open"
        assert run(try_origin("http://evil.example")) == "refused"
        assert run(try_origin(f"http://127.0.0.1:{s.port + 1}")) == "refused"
    finally:
        assert s.stop() == 0
