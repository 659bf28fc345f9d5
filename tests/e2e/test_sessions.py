"""Sessions and the persistent prefix cache (issue 7), against a real
`quire serve` on stories260K with a WebSocket client and raw HTTP: a
conversation of 10 turns, a restart, and turn 11 the same as without the
restart, its history loaded from sqlite; kill -9 while 20 sessions write;
sessions belong to their API key; the disk bound; databases the server
must not start on."""
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import time

import pytest
import websockets

from test_serve_openai import MODEL, Server, free_port


def run(coro, timeout=120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def chat(ws, cid, content, session=None, max_tokens=12, **extra):
    """One session turn: (done frame, reply text).  An error frame raises."""
    msg = {"type": "chat", "id": cid, "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "temperature": 0, **extra}
    if session:
        msg["session"] = session
    else:
        msg["new_session"] = True
    await ws.send(json.dumps(msg))
    text = ""
    while True:
        m = json.loads(await ws.recv())
        if m.get("id") != cid:
            continue
        if m["type"] == "error":
            raise RuntimeError(m["error"])
        if m["type"] == "delta":
            text += m["text"]
        if m["type"] == "done":
            return m, text


def ws_url(s):
    return f"ws://127.0.0.1:{s.port}/v1/ws"


USER = ["Tell me a story.", "What happened next?", "Who was there?", "Was it sunny?", "Did they play?",
        "What did mom say?", "Was the dog happy?", "Where did they go?", "What did they eat?", "How did it end?",
        "Tell me another one."]


def turns(s, n, session=None):
    """Turns USER[0..n) (a new session unless one is given): [(done, text)]."""
    async def go():
        out, sid = [], session
        async with websockets.connect(ws_url(s)) as ws:
            for i in range(n):
                done, text = await chat(ws, f"t{i}", USER[i], sid)
                sid = done["session"]
                out.append((done, text))
        return out
    return run(go())


def prefill(s):
    return s.metric("quire_prefill_tokens_total") or 0  # absent before the engine's first step


async def turn11(s, sid):
    async with websockets.connect(ws_url(s)) as ws:
        return await chat(ws, "t10", USER[10], sid)


def test_ten_turns_restart_same_reply_from_disk(quire):
    # An uninterrupted server: 11 turns.
    a = Server(quire)
    ref = turns(a, 10)
    sid_a = ref[0][0]["session"]
    before = prefill(a)
    done_a, text_a = run(turn11(a, sid_a))
    computed_a = prefill(a) - before
    assert a.stop() == 0

    # The same 10 turns on a second server, a restart, then turn 11.
    b = Server(quire)
    got = turns(b, 10)
    assert [t for _, t in got] == [t for _, t in ref]  # greedy: the same conversation
    sid_b = got[0][0]["session"]
    db = b.db
    assert b.stop() == 0
    # (always: stories260K computes faster than sqlite loads, so the default
    # policy would soon compute; this test is about the loading.)
    b = Server(quire, "--cache-disk-load", "always", db=db)
    try:
        assert b.metric('quire_kv_blocks{state="cached"}') in (None, 0)  # nothing in memory
        before = prefill(b)
        done_b, text_b = run(turn11(b, sid_b))
        computed_b = prefill(b) - before
        # The reply is the one the uninterrupted server gave ...
        assert text_b == text_a and text_b
        # ... and turn 11 computed no more than there: the history came from
        # sqlite (what the uninterrupted server had in memory).
        cached_a = done_a["usage"]["prompt_tokens_details"]["cached_tokens"]
        cached_b = done_b["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached_a > 100 and cached_b == cached_a
        assert computed_b == computed_a == done_b["usage"]["prompt_tokens"] - cached_b
        assert b.metric('quire_prompt_tokens_cached_total{source="disk"}') == cached_b
        assert b.metric('quire_disk_blocks_total{event="loaded"}') == cached_b // 16
        # The session holds all 22 messages.
        status, sess = b.request("GET", f"/v1/sessions/{sid_b}")
        assert status == 200 and len(sess["messages"]) == 22
        assert sess["messages"][-1] == {**sess["messages"][-1], "role": "assistant", "content": text_b,
                                        "status": "done"}
    finally:
        assert b.stop() == 0


def test_kill9_while_twenty_sessions_write(quire):
    s = Server(quire)
    seen = []  # (session, reply) of every done event a client received

    async def one(k):
        async with websockets.connect(ws_url(s)) as ws:
            sid = None
            for i in range(1000):
                done, text = await chat(ws, f"c{k}-{i}", f"Story {k} part {i}", sid, max_tokens=24)
                sid = done["session"]
                assert done["stored"] is True
                seen.append((sid, text))

    async def go():
        tasks = [asyncio.create_task(one(k)) for k in range(20)]
        while len(seen) < 200:
            await asyncio.sleep(0.02)
        s.proc.send_signal(signal.SIGKILL)
        await asyncio.gather(*tasks, return_exceptions=True)
    run(go())
    s.proc.wait(timeout=30)
    n_seen = len(seen)

    con = sqlite3.connect(s.db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    # Every reply whose done event reached a client is there, whole.
    for sid, text in seen[:n_seen]:
        row = con.execute("SELECT status FROM messages WHERE session_id = ? AND role = 'assistant' AND content = ?",
                          (sid, text)).fetchone()
        assert row == ("done",), (sid, text)
    # Every block's row has its K/V (they commit together).
    assert con.execute("SELECT count(*) FROM blocks").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM blocks b LEFT JOIN block_data d ON d.id = b.id "
                       "WHERE d.id IS NULL").fetchone()[0] == 0
    con.close()

    # The server starts on it again and every block it loads passes its check.
    s2 = Server(quire, "--cache-disk-load", "always", db=s.db)
    try:
        async def again():
            async with websockets.connect(ws_url(s2)) as ws:
                for sid, _ in seen[:20]:
                    await chat(ws, "again" + sid, "And then?", sid)
        run(again())
        assert s2.metric('quire_disk_blocks_total{event="loaded"}') > 0
        assert s2.metric('quire_disk_blocks_total{event="corrupt"}') == 0
    finally:
        assert s2.stop() == 0


def test_sessions_belong_to_their_key(quire, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice-key\nbob-key\n")
    s = Server(quire, "--api-key-file", str(keys))
    alice, bob = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
    try:
        async def make(h):
            async with websockets.connect(ws_url(s), additional_headers=h) as ws:
                done, _ = await chat(ws, "a", "Hello")
                return done["session"]
        sid = run(make(alice))
        assert s.request("GET", f"/v1/sessions/{sid}", headers=alice)[0] == 200
        # Bob can neither see, rename, delete nor continue it.
        assert s.request("GET", "/v1/sessions", headers=bob) == (200, {"object": "list", "data": []})
        assert s.request("GET", f"/v1/sessions/{sid}", headers=bob)[0] == 404
        assert s.request("PATCH", f"/v1/sessions/{sid}", {"title": "bob's"}, headers=bob)[0] == 404
        assert s.request("DELETE", f"/v1/sessions/{sid}", headers=bob)[0] == 404

        async def hijack():
            async with websockets.connect(ws_url(s), additional_headers=bob) as ws:
                return await chat(ws, "h", "Mine now", sid)
        with pytest.raises(RuntimeError, match="no session"):
            run(hijack())
        # Without a key: 401.
        assert s.request("GET", "/v1/sessions")[0] == 401
        # Alice's session is intact; she renames and deletes it.
        status, body = s.request("GET", f"/v1/sessions/{sid}", headers=alice)
        assert status == 200 and len(body["messages"]) == 2
        assert s.request("PATCH", f"/v1/sessions/{sid}", {"title": "Greeting"}, headers=alice)[1]["title"] == "Greeting"
        assert s.request("PATCH", f"/v1/sessions/{sid}", {"title": 5}, headers=alice)[0] == 400
        assert s.request("GET", "/v1/sessions", headers=alice)[1]["data"][0]["title"] == "Greeting"
        assert s.request("DELETE", f"/v1/sessions/{sid}", headers=alice)[1]["deleted"] is True
        assert s.request("GET", f"/v1/sessions/{sid}", headers=alice)[0] == 404
        # The keys themselves are not in the database.
        raw = open(s.db, "rb").read() + (open(s.db + "-wal", "rb").read() if os.path.exists(s.db + "-wal") else b"")
        assert b"alice-key" not in raw
    finally:
        assert s.stop() == 0


def test_session_errors(quire):
    s = Server(quire)
    try:
        async def go():
            out = []
            async with websockets.connect(ws_url(s)) as ws:
                for bad in ({"session": "sess_nope"}, {"session": 5}, {"new_session": False},
                            {"new_session": True, "temperature": "hot"},
                            {"new_session": True, "keep_messages": 0},
                            {"session": "sess_nope", "keep_messages": -1},
                            {"session": "sess_nope", "keep_messages": "2"}):
                    msg = {"type": "chat", "id": "e", "messages": [{"role": "user", "content": "x"}], **bad}
                    await ws.send(json.dumps(msg))
                    out.append(json.loads(await ws.recv()))
                # The socket still works.
                done, _ = await chat(ws, "ok", "Hi")
                out.append(done)
            return out
        errs = run(go())
        assert [e["type"] for e in errs] == ["error"] * 7 + ["done"]
        assert "no session" in errs[0]["error"]["message"]
        assert errs[1]["error"]["param"] == "session"
        assert "new_session" in errs[2]["error"]["message"]
        assert errs[3]["error"]["param"] == "temperature"
        assert all(e["error"]["param"] == "keep_messages" for e in errs[4:7])
        # A bad request stored nothing: only the good turn's session exists.
        assert len(s.request("GET", "/v1/sessions")[1]["data"]) == 1
        # keep_messages: the session keeps its first n messages, then the new one.
        sid = errs[-1]["session"]

        async def again():
            async with websockets.connect(ws_url(s)) as ws:
                await chat(ws, "k1", "Second question", sid)
                return await chat(ws, "k2", "Hi, again", sid, keep_messages=2)
        run(again())
        msgs = s.request("GET", f"/v1/sessions/{sid}")[1]["messages"]
        assert [(m["role"], m["content"]) for m in msgs][0::2] == [("user", "Hi"), ("user", "Hi, again")]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
        assert s.request("GET", "/v1/sessions/x/y")[0] == 404
        assert s.request("POST", "/v1/sessions", {})[0] == 405  # the path exists; Allow names its methods
    finally:
        assert s.stop() == 0


def test_disk_bound_evicts_least_recently_used(quire, tmp_path):
    db = str(tmp_path / "bound.db")
    s = Server(quire, "--cache-disk-max", "1", db=db)
    prompts = [" ".join(f"w{k}x{i}" for i in range(60)) for k in range(30)]
    try:
        for p in prompts:
            status, _ = s.post("/v1/completions", {"prompt": p, "max_tokens": 2, "temperature": 0})
            assert status == 200
        # Written past the bound, so blocks were evicted; the tier stays under it.
        assert s.metric('quire_disk_blocks_total{event="evicted"}') > 0
        assert s.metric("quire_disk_cache_bytes") <= 1 << 20
    finally:
        assert s.stop() == 0
    assert os.path.getsize(db) <= 1 << 20
    # After a restart the newest prompt's blocks are there, the oldest's gone.
    s = Server(quire, "--cache-disk-load", "always", db=db)
    try:
        s.post("/v1/completions", {"prompt": prompts[-1], "max_tokens": 2, "temperature": 0})
        newest = s.metric('quire_prompt_tokens_cached_total{source="disk"}')
        s.post("/v1/completions", {"prompt": prompts[0], "max_tokens": 2, "temperature": 0})
        oldest = s.metric('quire_prompt_tokens_cached_total{source="disk"}') - newest
        assert newest > 0 and oldest == 0
    finally:
        assert s.stop() == 0


def test_databases_it_must_not_start_on(quire, tmp_path):
    port = free_port()
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    r = subprocess.run([quire, "serve", "-m", MODEL, "--port", str(port), "--db", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "corrupt.db" in r.stderr
    newer = tmp_path / "newer.db"
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.close()
    r = subprocess.run([quire, "serve", "-m", MODEL, "--port", str(port), "--db", str(newer)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "newer" in r.stderr
    # --no-persist: no database, sessions answered with a clear 404.
    s = Server(quire, "--no-persist")
    try:
        status, body = s.request("GET", "/v1/sessions")
        assert status == 404 and "--no-persist" in body["error"]["message"]
    finally:
        assert s.stop() == 0
