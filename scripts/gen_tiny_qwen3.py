#!/usr/bin/env python3
"""Writes tests/fixtures/models/tiny-qwen3-random (an HF folder made by HF
transformers' save_pretrained: config.json, model.safetensors, float32), the
GGUF of the same weights (tests/fixtures/models/tiny-qwen3-random.gguf,
written with the gguf package as llama.cpp's converter lays a Qwen3 out:
its tensor names, no Q/K permutation, rotate-half RoPE; F32; no
vocabulary) and the fixtures tests/fixtures/tiny-qwen3-random.{logits,greedy}.json.

Qwen3 is Qwen2's network with RMSNorm over each head's q and k before RoPE
(q_norm, k_norm), no q/k/v biases, and head_dim given apart from
hidden_size / num_attention_heads: here 48 against 128 / 4 = 32, so a loader
that derives it fails.  Every weight is random (torch seed 1234), the norms'
included (1 + N(0, 0.3)), so that a missing or misplaced norm shows in the
logits.  The vocabulary and tokenizer are tiny-qwen2-random's (512 ids).

    python3 -m venv build/tfvenv && build/tfvenv/bin/pip install torch transformers safetensors
    build/tfvenv/bin/python scripts/gen_tiny_qwen3.py
"""
import json
import pathlib
import shutil

import gguf
import numpy as np
import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "models" / "tiny-qwen3-random"
TOK = ROOT / "tests" / "fixtures" / "models" / "tiny-qwen2-random"
FIX = ROOT / "tests" / "fixtures"


def write_gguf(model, cfg):
    w = gguf.GGUFWriter(str(OUT.parent / "tiny-qwen3-random.gguf"), "qwen3")
    w.add_name("tiny-qwen3-random")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("none")
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, p in model.state_dict().items():
        if name in names:
            out = names[name]
        else:
            parts = name.split(".")  # model.layers.N.<module...>.weight
            out = f"blk.{parts[2]}.{per_layer['.'.join(parts[3:-1])]}.{parts[-1]}"
        w.add_tensor(out, p.detach().to(torch.float32).numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    torch.manual_seed(1234)
    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=320, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=48, max_position_embeddings=4096,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
                      bos_token_id=1, eos_token_id=2, use_sliding_window=False)
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOK / f, OUT / f)

    write_gguf(model, cfg)

    g = torch.Generator().manual_seed(99)
    ids = torch.randint(3, 512, (1, 64), generator=g)
    ids[0, 0] = 1
    with torch.no_grad():
        logits = model(ids).logits[0].to(torch.float32)
    (FIX / "tiny-qwen3-random.logits.json").write_text(json.dumps(
        {"model": "tiny-qwen3-random", "input_ids": ids[0].tolist(), "shape": list(logits.shape),
         "logits": [[float(f"{x:.7g}") for x in row] for row in logits.tolist()]}))
    prompt = torch.randint(3, 512, (1, 20), generator=g)
    prompt[0, 0] = 1
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    (FIX / "tiny-qwen3-random.greedy.json").write_text(json.dumps(
        {"prompt_ids": prompt[0].tolist(), "greedy_ids": out[0, 20:].tolist()}))
    print("transformers", transformers.__version__, "torch", torch.__version__, "gguf", gguf.__name__)


if __name__ == "__main__":
    main()
