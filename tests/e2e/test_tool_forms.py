"""Tool calls in the form of the model's template family (issue 26, item 4):
Llama 3.1's `{"name": ..., "parameters": ...}` joined by "; ", Mistral's
`[TOOL_CALLS] [...]`, Hermes/Qwen's `<tool_call>` (and Hermes where the
template shows none), detected from the chat template or named with
--tool-call-parser as vLLM names its parsers.  Each server runs the bundled
stories260K with one of the real templates in
tests/fixtures/chat_templates/tool_conversations.json; the raw output (the
tokens' texts from logprobs) is checked against the form, and read back into
the same tool_calls the openai SDK gets, whole and streamed.  Where the
marker is one of the model's special tokens (Mistral's [TOOL_CALLS], id 5,
served with a random-weight model and Mistral's real tokenizer), the grammar
lets the model write it as that one token and the reader still sees it."""
import json
import os
import subprocess
import tempfile

import jsonschema
import openai
import pytest

from conftest import ROOT
from test_serve_openai import MODEL, Server

NAME = "stories260K"
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates" / "tool_conversations.json"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{1,9}$"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
NOW = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "now", "description": "The time", "parameters": NOW}},
]
SCHEMAS = {"get_weather": WEATHER, "now": NOW}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]

# (server, the template's record name or None, extra flags, the form expected)
CASES = {
    "llama3_json": ("meta-llama-Llama-3.1-8B-Instruct", (), "llama3_json"),
    "mistral": ("Mistral-7B-Instruct-v0.3", (), "mistral"),
    "hermes": ("Qwen2.5-Instruct", (), "hermes"),
    "fallback": ("Phi-3-mini-4k-instruct", (), "hermes"),
    "flag": ("Qwen2.5-Instruct", ("--tool-call-parser", "mistral"), "mistral"),
}


def render(form, calls):
    """The calls as the form writes them (the server's grammar: spaced head,
    compact arguments)."""
    if form == "hermes":
        return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>' for n, a in calls)
    if form == "llama3_json":
        return "; ".join(f'{{"name": "{n}", "parameters": {a}}}' for n, a in calls)
    return "[TOOL_CALLS] [" + ", ".join(f'{{"name": "{n}", "arguments": {a}}}' for n, a in calls) + "]"


def starts(form):
    return {"hermes": '<tool_call>\n{"name": "', "llama3_json": '{"name": "', "mistral": '[TOOL_CALLS] [{"name": "'}[form]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, quire):
    record, flags, form = CASES[request.param]
    tmpl = next(r["template"] for r in json.load(open(TEMPLATES))["records"] if r["name"] == record)
    path = os.path.join(tempfile.mkdtemp(prefix="quire-tmpl-"), record + ".jinja")
    with open(path, "w") as f:
        f.write(tmpl)
    srv = Server(quire, "--chat-template", path, *flags)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    yield srv, client, form, request.param
    assert srv.stop() == 0


def ask(client, **kw):
    kw.setdefault("max_tokens", 80)
    r = client.chat.completions.create(model=NAME, messages=MSGS, tools=TOOLS, temperature=1.0, logprobs=True, **kw)
    c = r.choices[0]
    raw = "".join(t.token for t in c.logprobs.content) if c.logprobs and c.logprobs.content else ""
    return c, raw


def pairs(msg):
    return [(t.function.name, t.function.arguments) for t in msg.tool_calls or []]


def test_form_detected_and_logged(case):
    srv, _, form, name = case
    said = "--tool-call-parser" if name == "flag" else "the chat template's"
    assert f"tool calls in the {form} form ({said})" in srv.log_text()


def test_required_calls_in_the_form(case):
    """One call (parallel_tool_calls false): the raw output is exactly the
    call in the family's form, and its arguments validate."""
    _, client, form, _ = case
    done = 0
    for seed in range(5):
        c, raw = ask(client, tool_choice="required", parallel_tool_calls=False, seed=seed, max_tokens=200)
        assert raw.startswith(starts(form)), raw
        assert c.message.content is None and len(c.message.tool_calls) == 1
        if c.finish_reason == "tool_calls":
            done += 1
            assert raw == render(form, pairs(c.message)), raw
            call = c.message.tool_calls[0]
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        else:
            assert c.finish_reason == "length"
            assert render(form, pairs(c.message)).startswith(raw[: len(starts(form))])
    assert done >= 3


def test_several_calls_in_the_form(case):
    """Parallel calls: every whole call, in order, joined by the form's
    separator, and streamed deltas that add up to the same calls."""
    _, client, form, _ = case
    for seed in range(3):
        c, raw = ask(client, tool_choice="required", seed=seed, max_tokens=120)
        calls = pairs(c.message)
        assert calls and raw.startswith(starts(form))
        whole = calls if c.finish_reason == "tool_calls" else calls[:-1]
        if whole:
            assert raw.startswith(render(form, whole)[: -1 if form == "mistral" else None]), (raw, whole)
        stream = client.chat.completions.create(model=NAME, messages=MSGS, tools=TOOLS, temperature=1.0, seed=seed,
                                                max_tokens=120, tool_choice="required", stream=True)
        got, finish = {}, None
        for ch in stream:
            if not ch.choices:
                continue
            finish = ch.choices[0].finish_reason or finish
            for tc in ch.choices[0].delta.tool_calls or []:
                g = got.setdefault(tc.index, ["", ""])
                g[0] += (tc.function.name or "") if tc.function else ""
                g[1] += (tc.function.arguments or "") if tc.function else ""
        assert [tuple(got[i]) for i in sorted(got)] == calls
        assert finish == c.finish_reason


def test_auto_text_or_calls(case):
    """tool_choice auto: text (which in Llama's form never begins with '{',
    and in the others never holds the trigger) or calls; the content and
    calls read back add up to the raw output."""
    _, client, form, _ = case
    kinds = set()
    for seed in range(8):
        c, raw = ask(client, seed=seed, max_tokens=60)
        calls = pairs(c.message)
        kinds.add(bool(calls))
        content = c.message.content or ""
        if not calls:
            assert content == raw
            if form == "llama3_json":
                assert not raw.startswith("{")
            else:
                assert {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]"}[form] not in raw
            continue
        assert raw.startswith(content + starts(form))
        if c.finish_reason == "tool_calls":
            assert raw == content + render(form, calls)
    assert kinds  # at least one reply; which kinds come depends on the seeds


def test_history_goes_back_through_the_template(case):
    """The calls a reply carries go back in the next turn with their
    results, through the same template: 200, and a longer prompt."""
    _, client, form, _ = case
    c, _ = ask(client, tool_choice="required", parallel_tool_calls=False, seed=1)
    call = c.message.tool_calls[0]
    msgs = MSGS + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abc123xyz", "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": "abc123xyz", "content": '{"temperature": 21}'},
    ]
    r = client.chat.completions.create(model=NAME, messages=msgs, tools=TOOLS, max_tokens=8, temperature=0)
    first = client.chat.completions.create(model=NAME, messages=MSGS, tools=TOOLS, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > first.usage.prompt_tokens


def test_bad_parser_name_stops_the_start(quire):
    p = subprocess.run([quire, "serve", "-m", MODEL, "--no-persist", "--tool-call-parser", "pythonic"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "--tool-call-parser must be auto, hermes, llama3_json or mistral" in p.stderr


def test_mistral_marker_as_its_special_token(quire, tmp_path):
    fx = ROOT / "tests" / "fixtures"
    d = tmp_path / "tiny-mistral"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        (d / f).symlink_to(fx / "models" / "tiny-mistral-random" / f)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).symlink_to(fx / "tokenizers" / "mistral-v0.3" / f)
    srv = Server(quire, model=str(d))
    try:
        assert "tool calls in the mistral form (the chat template's), its markers as the model's special tokens" in \
            srv.log_text()
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        tools = [TOOLS[1]]
        for stream in (False, True):
            kw = dict(model="tiny-mistral", messages=MSGS, tools=tools, tool_choice="required", max_tokens=60,
                      temperature=0, logit_bias={"5": 100}, parallel_tool_calls=False)
            if not stream:
                r = client.chat.completions.create(logprobs=True, **kw)
                c = r.choices[0]
                toks = [t.token for t in c.logprobs.content]
                assert toks[0] == "[TOOL_CALLS]", toks[:4]  # one token, the special one
                assert "".join(toks) == render("mistral", pairs(c.message))
                assert c.finish_reason == "tool_calls" and pairs(c.message) == [("now", "{}")]
                assert c.message.content is None
            else:
                got, content = "", ""
                for ch in client.chat.completions.create(stream=True, **kw):
                    if ch.choices:
                        content += ch.choices[0].delta.content or ""
                        for tc in ch.choices[0].delta.tool_calls or []:
                            got += (tc.function.name or "") + "|" + (tc.function.arguments or "")
                assert got.startswith("now|") and content == ""
        # Without tools the special token is masked by no grammar, and its
        # text is skipped as before (skip_special_tokens' default).
        r = client.completions.create(model="tiny-mistral", prompt="hi", max_tokens=3, temperature=0,
                                      logit_bias={"5": 100})
        assert "[TOOL_CALLS]" not in r.choices[0].text
    finally:
        assert srv.stop() == 0
