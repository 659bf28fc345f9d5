"""Reasoning split from content (issue 28): a chat reply whose output is
`<think>reasoning</think>content` comes back, through the openai SDK, with
`reasoning_content` (and vLLM's newer name `reasoning`) apart from a clean
`content`, whole and streamed alike; `chat_template_kwargs:
{"enable_thinking": false}` renders the template's no-think prompt.

The server runs the bundled stories260K with Qwen3's real chat template
(tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja, from llama.cpp's
models/templates in the llama-cpp-python 0.3.36 sdist); guided_regex makes
the small model write a think block, so the split is what is tested, not
the model.  The rendered prompts are checked against what jinja2 3.1 renders
from that template (the strings below)."""
import re

import openai
import pytest

from conftest import ROOT
from test_serve_openai import Server

NAME = "stories260K"
TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"
MSGS = [{"role": "user", "content": "Hi"}]
THINK = r"<think>\n[a-z ]{5,30}\n</think>\n\n[A-Z][a-z ]{5,30}\."
# jinja2 3.1 renders these from the template (trim_blocks, lstrip_blocks, as transformers does).
PROMPT_THINK = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
PROMPT_NO_THINK = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def srv(quire):
    s = Server(quire, "--chat-template", str(TEMPLATE))
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def extra(delta, name):
    return (delta.model_extra or {}).get(name)


def test_parser_named_in_the_log(srv):
    assert "split into reasoning_content and content (qwen3, the chat template writes </think>)" in srv.log_text()


def test_whole_reply(client):
    for seed in range(3):
        r = client.chat.completions.create(model=NAME, messages=MSGS, max_tokens=120, temperature=1.0, seed=seed,
                                           logprobs=True, extra_body={"guided_regex": THINK})
        m = r.choices[0].message
        raw = "".join(t.token for t in r.choices[0].logprobs.content)
        assert re.fullmatch(THINK, raw), raw
        reasoning = extra(m, "reasoning_content")
        assert reasoning == raw[len("<think>"):raw.index("</think>")]
        assert extra(m, "reasoning") == reasoning
        assert "<think>" not in m.content and "</think>" not in m.content
        assert m.content == raw[raw.index("</think>") + len("</think>"):]
        assert re.fullmatch(r"\n\n[A-Z][a-z ]{5,30}\.", m.content)


def test_streamed_equals_whole(client):
    for seed in range(3):
        kw = dict(model=NAME, messages=MSGS, max_tokens=120, temperature=1.0, seed=seed,
                  extra_body={"guided_regex": THINK})
        whole = client.chat.completions.create(**kw).choices[0].message
        reasoning, content, chunks_with_both = "", "", 0
        for ch in client.chat.completions.create(stream=True, **kw):
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            r = extra(d, "reasoning_content") or ""
            assert (extra(d, "reasoning") or "") == r
            reasoning += r
            content += d.content or ""
            assert "<think>" not in (d.content or "") + r and "</think>" not in (d.content or "") + r
        assert reasoning == extra(whole, "reasoning_content")
        assert content == whole.content


def test_enable_thinking_false(srv, client):
    """The no-think prompt, as jinja2 renders it; an output without a think
    block is all content."""
    for kwargs, want in (({}, PROMPT_THINK), ({"enable_thinking": False}, PROMPT_NO_THINK)):
        st, tok = srv.request("POST", "/tokenize", {"model": NAME, "messages": MSGS, "chat_template_kwargs": kwargs,
                                                   "add_special_tokens": False})
        assert st == 200, tok
        st, text = srv.request("POST", "/detokenize", {"model": NAME, "tokens": tok["tokens"]})
        assert st == 200 and text["prompt"] == want, text
    r = client.chat.completions.create(model=NAME, messages=MSGS, max_tokens=40, temperature=1.0, seed=1,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                                   "guided_regex": r"[A-Z][a-z ]{5,30}\."})
    m = r.choices[0].message
    assert re.fullmatch(r"[A-Z][a-z ]{5,30}\.", m.content)
    assert extra(m, "reasoning_content") is None


def test_cut_off_while_thinking(client):
    """max_tokens inside the think block: all of it is reasoning, content null."""
    seen = 0
    for n in range(8, 20):
        r = client.chat.completions.create(model=NAME, messages=MSGS, max_tokens=n, temperature=1.0, seed=2,
                                           logprobs=True, extra_body={"guided_regex": THINK})
        raw = "".join(t.token for t in r.choices[0].logprobs.content)
        if not raw.startswith("<think>\n") or "</" in raw:
            continue
        seen += 1
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "length"
        assert m.content is None and extra(m, "reasoning_content") == raw[len("<think>"):]
    assert seen >= 2


def test_parser_none(quire):
    s = Server(quire, "--chat-template", str(TEMPLATE), "--reasoning-parser", "none")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        m = c.chat.completions.create(model=NAME, messages=MSGS, max_tokens=120, temperature=1.0, seed=0,
                                      extra_body={"guided_regex": THINK}).choices[0].message
        assert m.content.startswith("<think>") and extra(m, "reasoning_content") is None
    finally:
        assert s.stop() == 0


def test_parser_flag_checked(quire, tmp_path):
    import subprocess
    p = subprocess.run([quire, "serve", "-m", str(ROOT / "models" / "stories260K.gguf"), "--reasoning-parser", "r2d2"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--reasoning-parser must be auto, none, qwen3 or deepseek_r1" in p.stderr
