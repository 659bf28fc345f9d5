"""Every README code block that talks to a server, run as written against
the bundled model (only the address is the test server's): each reply
finishes (stop or tool_calls, never length), and what should parse does and
validates (the schema, the tool's parameters).  The WebSocket transcript is
replayed too."""
import asyncio
import io
import json
import re
import contextlib

import jsonschema
import openai.resources.chat.completions as chat_api
import pytest
import websockets

from conftest import ROOT
from test_serve_openai import Server

README = (ROOT / "README.md").read_text()


def code_blocks():
    """(language, text) of every fenced block, in order."""
    out, lang, lines = [], None, []
    for line in README.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                out.append((lang, "\n".join(lines) + "\n"))
                lang = None
        elif lang is not None:
            lines.append(line)
    return out


BLOCKS = [b for lang, b in code_blocks() if lang == "python" and "127.0.0.1:8080" in b]


@pytest.fixture(scope="module")
def server(quire):
    s = Server(quire, "--no-persist")
    yield s
    assert s.stop() == 0


def test_the_readme_has_its_examples():
    assert len(BLOCKS) >= 3
    assert any("response_format" in b for b in BLOCKS) and any("tools=" in b for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block(server, block, monkeypatch):
    calls = []
    orig = chat_api.Completions.create

    def recording(self, **kw):
        calls.append(kw)
        return orig(self, **kw)

    monkeypatch.setattr(chat_api.Completions, "create", recording)
    code = block.replace("http://127.0.0.1:8080", server.url)
    ns = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), ns)
    assert calls, "the block made no request"
    kw = calls[-1]
    if kw.get("stream"):
        finish = ns["chunk"].choices[0].finish_reason
        assert out.getvalue().strip(), "no text streamed"
    else:
        finish = ns["r"].choices[0].finish_reason
    assert finish in ("stop", "tool_calls"), (finish, out.getvalue()[:300])
    rf = kw.get("response_format")
    if rf:
        value = json.loads(ns["r"].choices[0].message.content)
        jsonschema.validate(value, rf["json_schema"]["schema"])
    if kw.get("tools"):
        assert finish == "tool_calls"
        params = {t["function"]["name"]: t["function"]["parameters"] for t in kw["tools"]}
        for call in ns["r"].choices[0].message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])


def test_readme_websocket_transcript(server):
    """The README's WebSocket conversation: the client's lines sent as written,
    the server's answered in the same shapes."""
    block = next(b for _, b in code_blocks() if '{"type": "chat", "id": "a"' in b)
    sent = [json.loads(line[2:]) for line in block.splitlines() if line.startswith("> ")]
    shown = [line[2:] for line in block.splitlines() if line.startswith("< ")]

    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps(sent[0]))
            await ws.send(json.dumps(sent[1]))
            frames = []
            cancelled = False
            while sum(f["type"] == "done" for f in frames) < 2:
                f = json.loads(await ws.recv())
                frames.append(f)
                if f["type"] == "delta" and f["id"] == "b" and not cancelled:
                    await ws.send(json.dumps(sent[2]))
                    cancelled = True
            return frames

    frames = asyncio.run(go())
    for cid in ("a", "b"):
        mine = [f["type"] for f in frames if f.get("id") == cid]
        assert mine[0] == "start" and mine[-1] == "done" and "delta" in mine, mine
    done = {f["id"]: f for f in frames if f["type"] == "done"}
    assert done["a"]["choices"][0]["finish_reason"] == "length" and done["a"]["usage"]["completion_tokens"] == 3
    assert done["b"]["choices"][0]["finish_reason"] in ("cancelled", "length", "stop")
    for line in shown:
        if "..." not in line:
            want = json.loads(line)
            assert any(f["type"] == want["type"] and set(want) <= set(f) for f in frames), line
