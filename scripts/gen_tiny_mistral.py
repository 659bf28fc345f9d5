#!/usr/bin/env python3
"""Writes tests/fixtures/models/tiny-mistral-random: a Mistral-architecture
HF folder's config.json and model.safetensors with random float32 weights
(numpy seed 0; 1 layer, hidden 8, GQA 2:1).  The tests serve it with
Mistral-7B-Instruct-v0.3's real tokenizer beside it (tokenizer.json and
tokenizer_config.json with its chat template, from
tests/fixtures/tokenizers/mistral-v0.3, linked into a scratch folder).  The
weights mean nothing: the model exists so that a served model has Mistral's
vocabulary, where [TOOL_CALLS] is a special token (id 5).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install numpy==2.4.6 safetensors==0.8.0
    /tmp/v/bin/python scripts/gen_tiny_mistral.py
"""
import json
import pathlib

import numpy as np
from safetensors.numpy import save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "models" / "tiny-mistral-random"
V, H, I, L, NH, KV = 32768, 8, 16, 1, 2, 1


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": V, "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV,
           "head_dim": H // NH, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
           "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
           "torch_dtype": "float32", "hidden_act": "silu"}
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    hd = H // NH
    t = {"model.embed_tokens.weight": w(V, H), "lm_head.weight": w(V, H), "model.norm.weight": np.ones(H, np.float32)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = w(NH * hd, H)
        t[p + "self_attn.k_proj.weight"] = w(KV * hd, H)
        t[p + "self_attn.v_proj.weight"] = w(KV * hd, H)
        t[p + "self_attn.o_proj.weight"] = w(H, NH * hd)
        t[p + "mlp.gate_proj.weight"] = w(I, H)
        t[p + "mlp.up_proj.weight"] = w(I, H)
        t[p + "mlp.down_proj.weight"] = w(H, I)
        t[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
    save_file(t, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    (OUT / "model.safetensors").chmod(0o644)


if __name__ == "__main__":
    main()
