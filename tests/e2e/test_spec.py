"""Speculative decoding through a real `quire serve`, by n-gram drafts
(`--spec ngram`) and by a draft model (`--draft`, stories260K cut to 4
layers): greedy replies are the same with and without drafts (per-request
opt-out "speculative": false), alone and concurrent, with a JSON schema
too; sampled replies under a schema stay valid; usage, the WebSocket's done
timings and /metrics report drafted and kept tokens; bad options are
refused."""
import asyncio
import concurrent.futures
import json
import re
import subprocess

import openai
import pytest
import websockets

from conftest import ROOT
from test_serve_openai import MODEL, Server, free_port

DRAFT = str(ROOT / "tests" / "fixtures" / "models" / "stories260K-draft4.gguf")


@pytest.fixture(scope="module", params=["ngram", "draft"])
def spec_server(quire, request):
    how = ["--spec", "ngram"] if request.param == "ngram" else ["--draft", DRAFT]
    # Drafts in every step: what the drafts do is under test, not whether
    # the probe finds them faster on this machine.
    s = Server(quire, *how, "--spec-k", "4", "--spec-always", "--no-persist")
    s.draft = request.param == "draft"
    yield s
    assert s.stop() == 0


PROMPTS = ["Once upon a time", "Lily and Ben went to the park. Lily and Ben", "The cat sat. The cat", "Tom had a red ball"]


def complete(client, prompt, spec):
    return client.completions.create(model="stories260K", prompt=prompt, max_tokens=120, temperature=0, extra_body={
        "ignore_eos": True, "speculative": spec})


def test_greedy_same_with_drafts(spec_server):
    client = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0)
    drafted = kept = 0
    for p in PROMPTS:
        plain = complete(client, p, False)
        spec = complete(client, p, True)
        assert spec.choices[0].text == plain.choices[0].text
        assert plain.usage.model_extra["speculative"]["drafted_tokens"] == 0
        s = spec.usage.model_extra["speculative"]
        drafted += s["drafted_tokens"]
        kept += s["accepted_tokens"]
        assert s["accepted_tokens"] <= s["drafted_tokens"]
        if s["passes"]:
            assert s["mean_accepted_length"] == pytest.approx((s["accepted_tokens"] + s["passes"]) / s["passes"])
    # The tiny model repeats itself: drafts are made and many kept.
    assert drafted > 0 and kept > 0
    # Concurrent: the same replies again, the requests batched together.
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda p: complete(client, p, True).choices[0].text, PROMPTS))
    for p, text in zip(PROMPTS, got):
        assert text == complete(client, p, False).choices[0].text
    _, metrics = spec_server.get("/metrics")
    m = re.search(r'^quire_spec_tokens_total\{kind="drafted"\} (\d+)$', metrics, re.M)
    assert m and int(m.group(1)) >= drafted
    assert re.search(r"^quire_spec_passes_total \d+$", metrics, re.M)
    m = re.search(r"^quire_spec_draft_passes_total (\d+)$", metrics, re.M)
    assert m and (int(m.group(1)) > 0) == spec_server.draft
    assert re.search(r"^quire_spec_draft_seconds_total [0-9.]+$", metrics, re.M)


def test_websocket_timings(spec_server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{spec_server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "a", "prompt": PROMPTS[1], "max_tokens": 80,
                                      "temperature": 0, "ignore_eos": True}))
            while True:
                f = json.loads(await ws.recv())
                if f["type"] == "done":
                    return f
    done = asyncio.run(go())
    assert 0 <= done["timings"]["spec_acceptance"] <= 1
    assert done["timings"]["spec_mean_accepted_length"] >= 1
    assert done["usage"]["speculative"]["drafted_tokens"] > 0


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def test_schema_with_drafts(spec_server):
    """Drafts under a grammar: greedy the same reply as without, sampled
    replies valid for the schema."""
    client = openai.OpenAI(base_url=spec_server.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Tell me about Lily."}]
    ask = lambda spec, **kw: client.chat.completions.create(model="stories260K", messages=msgs, max_tokens=200, response_format=RF,
                                                            extra_body={"speculative": spec}, **kw)
    plain, spec = ask(False, temperature=0), ask(True, temperature=0)
    assert spec.choices[0].message.content == plain.choices[0].message.content
    drafted = spec.usage.model_extra["speculative"]["drafted_tokens"]
    for seed in range(8):
        r = ask(True, temperature=1.0, seed=seed)
        v = json.loads(r.choices[0].message.content)
        assert set(v) == {"name", "age"} and isinstance(v["age"], int) and 0 <= v["age"] <= 120
        assert len(v["name"]) <= 12
        drafted += r.usage.model_extra["speculative"]["drafted_tokens"]
    assert drafted > 0


def test_bad_options(quire, tmp_path):
    for args, says in ((["--spec", "draft-model"], "--spec"), (["--spec", "ngram", "--spec-k", "17"], "--spec-k"),
                       (["--spec", "draft"], "--draft PATH"), (["--spec", "ngram", "--draft", DRAFT], "--draft goes")):
        r = subprocess.run([quire, "serve", "-m", MODEL, "--port", str(free_port()), "--no-persist", *args],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and says in r.stderr
    # A draft model that cannot be read: the server says so and stops.
    bad = tmp_path / "draft.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    r = subprocess.run([quire, "serve", "-m", MODEL, "--port", str(free_port()), "--no-persist", "--draft", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "the draft model: " in r.stderr
