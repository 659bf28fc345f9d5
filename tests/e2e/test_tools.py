"""Tool calls through the openai SDK against a real `quire serve`
(stories260K): tools with tool_choice named, required and auto, streamed and
not, at temperature 1 with several seeds - every call's arguments parse and
validate against its function's parameters (Python jsonschema); the
streamed deltas join into the same calls as the whole reply; a
conversation that carries calls and their results goes on; the same over
the WebSocket; bad tools get a 400 that names the field."""
import asyncio
import json

import jsonschema
import openai
import pytest
import websockets

from test_serve_openai import client, server  # noqa: F401 (the module's fixtures)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,9}$"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ROLL = {
    "type": "object",
    "properties": {"sides": {"type": "integer", "minimum": 2, "maximum": 20}, "note": {"type": "string", "maxLength": 8}},
    "required": ["sides"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "roll_die", "parameters": ROLL}},
]
SCHEMAS = {"get_weather": WEATHER, "roll_die": ROLL}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_function(client):
    stops = 0
    for seed in range(6):
        r = client.chat.completions.create(model="stories260K", messages=MSGS, tools=TOOLS, max_tokens=200, temperature=1.0,
                                           seed=seed, tool_choice={"type": "function",
                                                                   "function": {"name": "roll_die"}})
        c = r.choices[0]
        assert c.message.content is None and len(c.message.tool_calls) == 1
        assert c.message.tool_calls[0].function.name == "roll_die"
        assert c.finish_reason in ("tool_calls", "length")
        if c.finish_reason == "tool_calls":
            stops += 1
            check_call(c.message.tool_calls[0])
    assert stops >= 3


def collect_stream(stream):
    """The calls and content a stream's deltas add up to, and its finish."""
    calls, content, finish = {}, "", None
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert c["id"] is None, "a call's id comes once, in its first delta"
                c["id"] = tc.id
                assert tc.function.name
                c["name"] = tc.function.name
            c["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, finish


def test_required_streamed_equals_whole(client):
    """Every call is checked but one that max_tokens cut short (the last,
    when the finish is "length")."""
    checked = 0
    for seed in range(5):
        kw = dict(model="stories260K", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=250, temperature=1.0,
                  seed=seed)
        whole = client.chat.completions.create(**kw).choices[0]
        calls, content, finish = collect_stream(client.chat.completions.create(stream=True, **kw))
        assert finish == whole.finish_reason
        assert content == "" and whole.message.content is None
        assert len(whole.message.tool_calls) >= 1
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
        assert all(c["id"].startswith("call_") for c in calls)
        done = whole.message.tool_calls if finish == "tool_calls" else whole.message.tool_calls[:-1]
        for t in done:
            check_call(t)
            checked += 1
    assert checked >= 3


def test_single_call_when_not_parallel(client):
    for seed in range(3):
        r = client.chat.completions.create(model="stories260K", messages=MSGS, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=250, temperature=1.0, seed=seed)
        c = r.choices[0]
        assert len(c.message.tool_calls) == 1
        if c.finish_reason == "tool_calls":
            check_call(c.message.tool_calls[0])


def test_auto_text_or_calls(client):
    """auto: text, calls after it or none; the tag never shows in content."""
    for seed in range(4):
        kw = dict(model="stories260K", messages=MSGS, tools=TOOLS, max_tokens=40, temperature=1.0, seed=seed)
        c = client.chat.completions.create(**kw).choices[0]
        assert c.finish_reason in ("stop", "length", "tool_calls")
        assert "<tool_call>" not in (c.message.content or "")
        for t in c.message.tool_calls or []:
            if c.finish_reason == "tool_calls":
                check_call(t)
        calls, content, finish = collect_stream(client.chat.completions.create(stream=True, **kw))
        assert finish == c.finish_reason
        assert content == (c.message.content or "")
    # tool_choice none: plain text, no grammar
    c = client.chat.completions.create(model="stories260K", messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=20,
                                       temperature=0).choices[0]
    assert c.message.tool_calls is None and c.message.content


def test_conversation_with_results(client):
    r = client.chat.completions.create(model="stories260K", messages=MSGS, tools=TOOLS, max_tokens=200, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = r.choices[0].message.tool_calls[0]
    msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                   {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees"}]
    r2 = client.chat.completions.create(model="stories260K", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=16,
                                        temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length") and r2.usage.prompt_tokens > r.usage.prompt_tokens


@pytest.mark.parametrize("extra, param, words", [
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice", "not among"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name", "1 to 64"),
    ({"tools": TOOLS + [{"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}]},
     "tools[2].function.parameters", "/properties/a"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "tool_choice", "together"),
])
def test_bad_tools(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="stories260K", messages=MSGS, max_tokens=5, extra_body=extra)
    assert e.value.body["param"] == param and words in e.value.body["message"]


def test_websocket_tool_calls(server):
    async def go():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "t", "messages": MSGS, "tools": TOOLS,
                                      "tool_choice": "required", "max_tokens": 250, "temperature": 1.0, "seed": 2}))
            calls, text = {}, ""
            while True:
                m = json.loads(await ws.recv())
                if m["type"] == "delta":
                    text += m["text"]
                    for tc in m.get("tool_calls", []):
                        c = calls.setdefault(tc["index"], {"name": None, "arguments": ""})
                        if "id" in tc:
                            c["name"] = tc["function"]["name"]
                        c["arguments"] += tc.get("function", {}).get("arguments", "")
                if m["type"] in ("done", "error"):
                    return m, text, calls
    done, text, calls = asyncio.run(asyncio.wait_for(go(), 60))
    assert done["type"] == "done" and text == "" and calls
    if done["choices"][0]["finish_reason"] == "tool_calls":
        for c in calls.values():
            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
    else:
        assert done["choices"][0]["finish_reason"] == "length"
