"""Tool conversations rendered by HF transformers, for test_chat_tools.

Each record is a multi-turn tool conversation as an OpenAI client sends it
(the assistant's tool_calls with arguments as JSON text, its content null,
tool results), rendered through a real chat template by
transformers.apply_chat_template after vLLM's message preprocessing
(arguments parsed into objects, null content as ""), with the tools and
add_generation_prompt=True.  quire must render the same bytes from the raw
messages (server/oai.c qoai_messages does the preprocessing).

Run once, in a venv with transformers and jinja2 (no torch needed):
    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install transformers==5.25.0 jinja2==3.1.6
    /tmp/tfvenv/bin/python scripts/gen_tool_chat_fixtures.py ../shared/fixtures/chat_templates/chat_templates.json \
        tests/fixtures/chat_templates/tool_conversations.json
"""
import copy
import json
import sys

import jinja2
import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

TEMPLATES = ["Qwen2.5-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "Mistral-7B-Instruct-v0.3",
             "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "Phi-3-mini-4k-instruct"]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]

ONE_CALL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "abc123xyz", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
    {"role": "tool", "tool_call_id": "abc123xyz", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 21 degrees and clear in Paris."},
    {"role": "user", "content": "And in Rome?"},
]

TWO_CALLS = [
    {"role": "user", "content": "Weather in Oslo and in Lima, in fahrenheit?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"fahrenheit\"}"}},
        {"id": "call00002", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Lima\", \"unit\": \"fahrenheit\"}"}}]},
    {"role": "tool", "tool_call_id": "call00001", "content": "{\"temperature\": 41}"},
    {"role": "tool", "tool_call_id": "call00002", "content": "{\"temperature\": 66}"},
]

CONVERSATIONS = {"one_call": ONE_CALL, "two_calls": TWO_CALLS}
DATE = "26 Jul 2024"


def vllm_preprocess(messages):
    """vLLM's chat preprocessing as it reaches the template: content None
    (or a list of text parts) becomes a string, and an assistant's
    tool_calls[].function.arguments JSON text becomes its value."""
    out = []
    for m in copy.deepcopy(messages):
        if m.get("content") is None:
            m["content"] = ""
        if m["role"] == "assistant" and isinstance(m.get("tool_calls"), list):
            for tc in m["tool_calls"]:
                if isinstance(tc["function"].get("arguments"), str):
                    tc["function"]["arguments"] = json.loads(tc["function"]["arguments"])
        out.append(m)
    return out


def tokenizer(bos, eos):
    tok = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    kw = {"eos_token": eos}
    if bos:
        kw["bos_token"] = bos
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kw)


def main(src, dst):
    records = {r["name"]: r for r in json.load(open(src))}
    out = []
    for name in TEMPLATES:
        r = records[name]
        tok = tokenizer(r["bos_token"], r["eos_token"])
        for conv_name, conv in CONVERSATIONS.items():
            rec = {"name": name, "conversation": conv_name, "bos_token": r["bos_token"],
                   "eos_token": r["eos_token"], "template": r["template"], "messages": conv, "tools": TOOLS,
                   "date_string": DATE}
            try:
                rec["expected"] = tok.apply_chat_template(vllm_preprocess(conv), tools=TOOLS,
                                                          chat_template=r["template"], tokenize=False,
                                                          add_generation_prompt=True, date_string=DATE)
            except Exception as e:  # the template refuses this conversation (its raise_exception)
                rec["error"] = str(e)
            out.append(rec)
    meta = {"made_by": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
            "how": "scripts/gen_tool_chat_fixtures.py", "records": out}
    with open(dst, "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for rec in out:
        print(rec["name"], rec["conversation"], "error: " + rec["error"] if "error" in rec else
              f"{len(rec['expected'])} chars")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
