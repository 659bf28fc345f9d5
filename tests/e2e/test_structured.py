"""Structured output through the openai SDK against a real `quire serve`
(stories260K): response_format json_schema and json_object, streamed and
not, at temperature 1 with several seeds - every reply that finishes with
"stop" parses and holds the schema's constraints; guided_choice and
guided_regex; refused schemas get a 400 that names the keyword; the same
over the WebSocket."""
import asyncio
import json
import re

import openai
import pytest
import websockets

from test_serve_openai import client, server  # noqa: F401 (the module's fixtures)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 3},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}


def check_person(p):
    assert set(p) <= {"name", "age", "mood", "tags"} and {"name", "age", "mood"} <= set(p)
    assert isinstance(p["name"], str) and len(p["name"]) <= 12
    assert isinstance(p["age"], int) and 0 <= p["age"] <= 120
    assert p["mood"] in ("happy", "sad")
    for t in p.get("tags", []):
        assert re.fullmatch(r"[a-z]{1,6}", t)
    assert len(p.get("tags", [])) <= 3


RF = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def test_json_schema_sampled(client):
    stops = 0
    for seed in range(8):
        r = client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "Who is there?"}],
                                           max_tokens=300, temperature=1.0, seed=seed, response_format=RF)
        c = r.choices[0]
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "stop":
            stops += 1
            check_person(json.loads(c.message.content))
    assert stops >= 4


def test_json_schema_streamed(client):
    for seed in (11, 12, 13):
        stream = client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "Who?"}],
                                                max_tokens=300, temperature=1.0, seed=seed, response_format=RF,
                                                stream=True)
        text, finish = "", None
        for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        if finish == "stop":
            check_person(json.loads(text))
        else:
            assert finish == "length" and text.startswith("{")


def test_json_object_and_choices(client):
    r = client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "Hi"}], max_tokens=60,
                                       temperature=0, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    for seed in range(5):
        r = client.completions.create(model="stories260K", prompt="Answer:", max_tokens=10, temperature=1.0, seed=seed,
                                      extra_body={"guided_choice": ["yes", "no", "maybe so"]})
        assert r.choices[0].text in ("yes", "no", "maybe so") and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model="stories260K", prompt="Code:", max_tokens=20, temperature=1.0, seed=1,
                                  extra_body={"guided_regex": "[A-Z]{3}-[0-9]{2}"})
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", r.choices[0].text) and r.choices[0].finish_reason == "stop"


def test_refused_schema(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="stories260K", messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "n", "schema": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}})
    err = e.value.body
    assert err["param"] == "response_format.json_schema.schema"
    assert "uniqueItems" in err["message"] and "/properties/a" in err["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="stories260K", prompt="x", extra_body={"guided_regex": "(?=a)b"})


def test_websocket(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "j", "messages": [{"role": "user", "content": "Who?"}],
                                      "max_tokens": 300, "temperature": 1.0, "seed": 5, "response_format": RF}))
            text = ""
            while True:
                m = json.loads(await ws.recv())
                if m["type"] == "delta":
                    text += m["text"]
                if m["type"] in ("done", "error"):
                    return m, text
    done, text = asyncio.run(asyncio.wait_for(go(), 60))
    assert done["type"] == "done"
    if done["choices"][0]["finish_reason"] == "stop":
        check_person(json.loads(text))
