"""The chat templates of issue 28's families, rendered by HF transformers, for test_chat.

Each template file under tests/fixtures/chat_templates (copied byte-exact,
provenance in the README there) is rendered on a few conversations by
transformers.apply_chat_template(tokenize=False) with the template's own
switches (enable_thinking through chat_template_kwargs, as vLLM passes
them); the records have chat_templates.json's layout ({"name", "bos_token",
"eos_token", "template", "cases": [{"case", "context", "expected"}]}), where
context is every variable the template reads.  quire must render the same
bytes from the same context.

Run once, in a venv with transformers and jinja2 (no torch needed):
    build/tfvenv/bin/python scripts/gen_family_templates.py tests/fixtures/chat_templates/family_templates.json
"""
import json
import pathlib
import sys

import jinja2
import transformers

from gen_tool_chat_fixtures import tokenizer  # a stand-in tokenizer holding only the special tokens

DIR = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "chat_templates"

TEMPLATES = [  # file, bos, eos
    ("HuggingFaceTB-SmolLM3-3B.jinja", None, "<|im_end|>"),
    ("Qwen-Qwen3-0.6B.jinja", None, "<|im_end|>"),
]

CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
MULTI = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},
    {"role": "user", "content": "And of Italy?"},
]
NO_THINK_SYSTEM = [{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "Hi"}]
THOUGHT = [
    {"role": "user", "content": "Is 7 prime?"},
    {"role": "assistant", "content": "<think>\nIt has no divisor but 1 and 7.\n</think>\n\nYes."},
    {"role": "user", "content": "And 9?"},
]
CASES = [  # name, messages, template switches
    ("user", CHAT, {}),
    ("system_multi_turn", MULTI, {}),
    ("enable_thinking_false", MULTI, {"enable_thinking": False}),
    ("no_think_in_system", NO_THINK_SYSTEM, {}),
    ("reasoning_in_history", THOUGHT, {}),
    ("reasoning_in_history_no_think", THOUGHT, {"enable_thinking": False}),
]


def main(dst):
    out = []
    for file, bos, eos in TEMPLATES:
        template = (DIR / file).read_text()
        tok = tokenizer(bos, eos)
        cases = []
        for name, messages, kw in CASES:
            expected = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                               add_generation_prompt=True, **kw)
            context = {"messages": messages, "add_generation_prompt": True, "eos_token": eos, **kw}
            if bos:
                context["bos_token"] = bos
            cases.append({"case": name, "context": context, "expected": expected})
        out.append({"name": file[:-len(".jinja")], "bos_token": bos, "eos_token": eos, "template": template,
                    "cases": cases})
    meta = {"made_by": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
            "how": "scripts/gen_family_templates.py", "records": out}
    with open(dst, "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for r in out:
        print(r["name"], [len(c["expected"]) for c in r["cases"]])


if __name__ == "__main__":
    main(sys.argv[1])
