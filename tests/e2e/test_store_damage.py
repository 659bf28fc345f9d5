"""A damaged database and a turn cut by kill -9 (issue 25, item 6), against a
real `quire serve` on stories260K with a WebSocket client and raw HTTP: a
database with a page of its messages table overwritten, or with that table
dropped, stops the start (exit 1, the file and what is wrong on stderr,
nothing listening, the file untouched); a server killed while it streams a
session's reply starts again with that turn answered by an empty reply
marked partial, so the session's roles alternate and the conversation goes
on."""
import asyncio
import json
import signal
import socket
import sqlite3
import subprocess
import time

import pytest
import websockets

from test_serve_openai import MODEL, Server, free_port
from test_sessions import chat, run, ws_url


def make_sessions(s, n_sessions=4, n_turns=4):
    """n_sessions sessions of n_turns answered turns each: their ids."""
    async def go():
        ids = []
        async with websockets.connect(ws_url(s)) as ws:
            for k in range(n_sessions):
                sid = None
                for i in range(n_turns):
                    done, _ = await chat(ws, f"s{k}-{i}", f"Tell me about the cat number {k}, part {i}.", sid,
                                         max_tokens=32)
                    assert done["stored"] is True
                    sid = done["session"]
                ids.append(sid)
        return ids
    return run(go())


def garble_messages_page(db):
    """Overwrites a leaf page of the messages table, in the middle of the
    file, with garbage (its header too)."""
    con = sqlite3.connect(db)
    psz = con.execute("PRAGMA page_size").fetchone()[0]
    pages = con.execute("PRAGMA page_count").fetchone()[0]
    leaves = [r[0] for r in con.execute(
        "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf' ORDER BY pageno")]
    con.close()
    assert leaves, "the messages table has no leaf page"
    pg = leaves[len(leaves) // 2]
    assert 1 < pg < pages
    with open(db, "r+b") as f:
        f.seek((pg - 1) * psz)
        f.write(bytes((i * 151 + 7) & 0xFF for i in range(psz)))


def drop_messages(db):
    con = sqlite3.connect(db)
    con.execute("DROP TABLE messages")
    con.commit()
    con.close()


@pytest.mark.parametrize("damage, says", [
    (garble_messages_page, "the database is damaged (quick_check: "),
    (drop_messages, "the database is damaged (the table 'messages' is missing)"),
])
def test_damaged_database_stops_the_start(quire, damage, says):
    s = Server(quire)
    make_sessions(s)
    db = s.db
    assert s.stop() == 0
    damage(db)
    before = open(db, "rb").read()

    port = free_port()
    t0 = time.time()
    r = subprocess.run([quire, "serve", "-m", MODEL, "--port", str(port), "--db", db],
                       capture_output=True, text=True, timeout=60)
    took = time.time() - t0
    assert r.returncode == 1, r.stderr
    assert took < 10
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("quire serve: ")]
    assert len(line) == 1, r.stderr  # one line says it all
    assert line[0].startswith(f"quire serve: {db}: {says}"), r.stderr
    assert line[0].endswith("; move it aside or restore a backup")
    # It never listened, and wrote nothing into the file.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert open(db, "rb").read() == before


def roles(msgs):
    return [m["role"] for m in msgs]


def test_kill9_mid_reply_is_mended_at_restart(quire):
    s = Server(quire, "-t", "1")
    db = s.db

    async def first_and_cut():
        async with websockets.connect(ws_url(s)) as ws:
            done, first = await chat(ws, "t0", "Tell me a story.")
            sid = done["session"]
            # The second turn streams a long reply; the server is killed at
            # its first delta, long before it finishes and stores it.
            await ws.send(json.dumps({"type": "chat", "id": "t1", "session": sid, "max_tokens": 1900,
                                      "ignore_eos": True, "temperature": 0,
                                      "messages": [{"role": "user", "content": "And then what happened?"}]}))
            while True:
                m = json.loads(await ws.recv())
                if m.get("id") == "t1" and m["type"] == "delta":
                    break
                assert m["type"] != "error" and m["type"] != "done", m
            s.proc.send_signal(signal.SIGKILL)
            return sid, first
    sid, first = run(first_and_cut())
    s.proc.wait(timeout=30)

    # The turn is on disk, its reply is not: two user messages would follow.
    con = sqlite3.connect(db)
    stored = [r[0] for r in con.execute("SELECT role FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
    con.close()
    assert stored == ["user", "assistant", "user"]

    s = Server(quire, db=db)
    try:
        status, sess = s.request("GET", f"/v1/sessions/{sid}")
        assert status == 200
        msgs = sess["messages"]
        assert roles(msgs) == ["user", "assistant", "user", "assistant"]
        assert msgs[1]["content"] == first and msgs[1]["status"] == "done"
        assert msgs[2]["content"] == "And then what happened?"
        assert msgs[3]["content"] == "" and msgs[3]["status"] == "partial"
        # The conversation goes on, alternating.
        async def next_turn():
            async with websockets.connect(ws_url(s)) as ws:
                return await chat(ws, "t2", "Who was there?", sid)
        done, text = run(next_turn())
        assert done["stored"] is True
        msgs = s.request("GET", f"/v1/sessions/{sid}")[1]["messages"]
        assert roles(msgs) == ["user", "assistant"] * 3
        assert msgs[5]["content"] == text and msgs[5]["status"] == "done"
    finally:
        assert s.stop() == 0
    assert "cut by a stop" in s.log_text()

    # Another start mends nothing more.
    s = Server(quire, db=db)
    try:
        msgs = s.request("GET", f"/v1/sessions/{sid}")[1]["messages"]
        assert roles(msgs) == ["user", "assistant"] * 3
    finally:
        assert s.stop() == 0
    assert "cut by a stop" not in s.log_text()
