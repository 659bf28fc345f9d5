#!/usr/bin/env python3
"""Writes, for each family below, a tiny random checkpoint made by HF
transformers' save_pretrained (tests/fixtures/models/tiny-<family>-random:
config.json, model.safetensors, float32), the GGUF of the same weights
(tests/fixtures/models/tiny-<family>-random.gguf, written with the gguf
package the way llama.cpp's convert_hf_to_gguf.py lays the family out: its
architecture, keys and tensor names, Llama's Q/K permuted for adjacent-pair
RoPE, Gemma's norms stored as 1 + w; F32; no vocabulary) and its fixtures:

  tests/fixtures/tiny-<family>-random.logits.json  64 ids and the float32
      logits of every position;
  tests/fixtures/tiny-<family>-random.greedy.json  8 prompts (5 to 40 ids)
      and each one's 48-token greedy continuation (model.generate).

The families: qwen3 (QK-norm, head_dim set apart from hidden / heads), gemma2
(GeGLU, sandwich and (1 + w) norms, scaled embeddings, attention and final
soft-caps, local and global layers in turn), gemma3 (Gemma 2's network with
QK-norm and no soft-caps, five local layers to a global one, the local
layers' own RoPE base, linear RoPE scaling on the global ones) and mistral
with a sliding window on every layer, and phi3 (q/k/v and gate/up fused,
Phi-4-mini's partial rotary factor 0.75, LongRoPE with an original context of
32 in a context of 128: every prompt is longer than 32, so transformers uses
the long factors throughout, as quire does in a context past the original
one), and smollm3 (Llama's network, tied, its fourth layer without RoPE,
as llama.cpp's converter writes it: Q/K permuted, no key for the NoPE
step, which llama.cpp fixes at 4), and llama32 (Llama 3.2's shape: tied
head, Llama 3.1's RoPE scaling with an original context of 16, which the
converter writes as a rope_freqs tensor of divisors).  The windows (12) are shorter than every sequence's end, so the
windowed layers mask.  Every weight is random
(torch seed 1234 + the family's index), every norm's included, so that a
missing or misplaced one shows in the logits.  The tokenizer is
tiny-qwen2-random's (512 ids).  Attention runs as "eager" (the soft-caps).

"gemma3-mm" writes the layout of Gemma 3's image-text checkpoints (4B, 12B,
27B: Gemma3ForConditionalGeneration) around tiny-gemma3-random's language
model (read back from its folder) and a tiny SigLIP vision tower, and checks
that transformers gives it the same logits as the text model; it commits no
weights, only tests/fixtures/models/tiny-gemma3-mm/config.json (as
save_pretrained writes it) and tensors.json (each saved tensor's name and
shape, and the tiny-gemma3-random tensor of equal value it holds, or null
for the vision tower's), from which the tests build the folder.

    python3 -m venv build/tfvenv && build/tfvenv/bin/pip install torch transformers safetensors gguf
    build/tfvenv/bin/python scripts/gen_tiny_families.py [family ... | gemma3-mm]
"""
import json
import math
import pathlib
import shutil
import sys

import gguf
import numpy as np
import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "fixtures" / "models"
TOK = MODELS / "tiny-qwen2-random"
FIX = ROOT / "tests" / "fixtures"

COMMON = dict(vocab_size=512, hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
WINDOW = 12

FAMILIES = {
    "qwen3": dict(cls="Qwen3ForCausalLM", cfg="Qwen3Config", arch="qwen3",
                  kw=dict(num_hidden_layers=2, head_dim=24, rope_theta=1000000.0, tie_word_embeddings=False,
                          attention_bias=False, use_sliding_window=False)),
    "gemma2": dict(cls="Gemma2ForCausalLM", cfg="Gemma2Config", arch="gemma2",
                   kw=dict(num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=16,
                           attn_logit_softcapping=5.0, final_logit_softcapping=3.0, rope_theta=10000.0,
                           hidden_activation="gelu_pytorch_tanh")),
    "gemma3": dict(cls="Gemma3ForCausalLM", cfg="Gemma3TextConfig", arch="gemma3",
                   kw=dict(num_hidden_layers=6, sliding_window=WINDOW, query_pre_attn_scalar=16,
                           hidden_activation="gelu_pytorch_tanh",
                           rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                               "rope_theta": 1000000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "mistral-swa": dict(cls="MistralForCausalLM", cfg="MistralConfig", arch="llama",
                        kw=dict(num_hidden_layers=2, sliding_window=WINDOW, rope_theta=1000000.0,
                                tie_word_embeddings=False)),
    "phi3": dict(cls="Phi3ForCausalLM", cfg="Phi3Config", arch="phi3", prompts=(33, 34, 35, 36, 37, 38, 39, 40),
                 kw=dict(num_hidden_layers=2, hidden_size=64, head_dim=None, max_position_embeddings=128,
                         original_max_position_embeddings=32, partial_rotary_factor=0.75, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                          "original_max_position_embeddings": 32,
                                          "long_factor": [1.0, 1.5, 2.5, 4.0, 7.0, 11.0],
                                          "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5]})),
    "smollm3": dict(cls="SmolLM3ForCausalLM", cfg="SmolLM3Config", arch="smollm3",
                    kw=dict(num_hidden_layers=4, hidden_size=32, intermediate_size=64, head_dim=8,
                            rope_theta=2000000.0, tie_word_embeddings=True, use_sliding_window=False)),
    "llama32": dict(cls="LlamaForCausalLM", cfg="LlamaConfig", arch="llama",
                    kw=dict(num_hidden_layers=2, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 16})),
}

GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
GGUF_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",
}
# Llama's post_attention_layernorm is the MLP's pre-norm; Gemma's comes after attention.
LLAMA_NORMS = {"post_attention_layernorm": "ffn_norm"}
GEMMA_NORMS = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf permute: rotate-half pairs to adjacent ones."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(rp, dim):
    """The divisors of RoPE's frequencies that Llama 3.1's scaling applies: 1 for short wavelengths, the
    factor for those past the original context, a smooth blend between."""
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    orig = rp["original_max_position_embeddings"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * rp["rope_theta"] ** (i / dim)
        if wavelen < orig / hi:
            out.append(1.0)
        elif wavelen > orig / lo:
            out.append(factor)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(name, fam, model, cfg):
    arch = fam["arch"]
    gemma = arch.startswith("gemma")
    w = gguf.GGUFWriter(str(MODELS / f"tiny-{name}-random.gguf"), arch)
    w.add_name(f"tiny-{name}-random")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rp = cfg.rope_parameters
    full = rp.get("full_attention", rp)
    w.add_rope_freq_base(float(full["rope_theta"]))
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(full["factor"]))
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if arch == "phi3":  # as convert_hf_to_gguf's Phi3MiniModel writes a LongRoPE model
        orig = full["original_max_position_embeddings"]
        scale = cfg.max_position_embeddings / orig
        w.add_rope_dimension_count(int(head_dim * cfg.partial_rotary_factor))
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.array(full["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(full["short_factor"], dtype=np.float32))
    if full.get("rope_type") == "llama3":  # as convert_hf_to_gguf's LlamaModel writes it: the factors as a tensor
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(full, head_dim))
    w.add_tokenizer_model("none")
    norms = GEMMA_NORMS if gemma else LLAMA_NORMS
    for key, p in model.state_dict().items():
        t = p.detach().to(torch.float32)
        if key in GGUF_NAMES:
            if key == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            out = GGUF_NAMES[key]
        else:
            parts = key.split(".")  # model.layers.N.<module...>.weight
            mod = ".".join(parts[3:-1])
            out = f"blk.{parts[2]}.{GGUF_LAYER.get(mod) or norms[mod]}.{parts[-1]}"
            if arch in ("llama", "smollm3") and mod == "self_attn.q_proj":
                t = permute(t, cfg.num_attention_heads)
            if arch in ("llama", "smollm3") and mod == "self_attn.k_proj":
                t = permute(t, cfg.num_key_value_heads)
        if gemma and key.endswith("norm.weight"):
            t = t + 1  # the converter stores Gemma's (1 + w)
        w.add_tensor(out, t.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make(name, index):
    fam = FAMILIES[name]
    torch.manual_seed(1234 + index)
    kw = dict(COMMON)
    kw.update(fam["kw"])
    kw = {k: v for k, v in kw.items() if v is not None}
    cfg = getattr(transformers, fam["cfg"])(**kw)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, fam["cls"])(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                # Gemma's norms scale by 1 + w: centre them at 0 there, at 1 elsewhere.
                p.copy_((0.0 if name.startswith("gemma") else 1.0) + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    out = MODELS / f"tiny-{name}-random"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOK / f, out / f)
    write_gguf(name, fam, model, cfg)

    g = torch.Generator().manual_seed(99)
    ids = torch.randint(3, 512, (1, 64), generator=g)
    ids[0, 0] = 1
    with torch.no_grad():
        logits = model(ids).logits[0].to(torch.float32)
    (FIX / f"tiny-{name}-random.logits.json").write_text(json.dumps(
        {"model": f"tiny-{name}-random", "input_ids": ids[0].tolist(), "shape": list(logits.shape),
         "logits": [[float(f"{x:.7g}") for x in row] for row in logits.tolist()]}))
    prompts = []
    for n in fam.get("prompts", (5, 9, 12, 13, 17, 24, 31, 40)):
        prompt = torch.randint(3, 512, (1, n), generator=g)
        prompt[0, 0] = 1
        with torch.no_grad():
            gen = model.generate(prompt, max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=0)
        prompts.append({"prompt_ids": prompt[0].tolist(), "greedy_ids": gen[0, n:].tolist()})
    (FIX / f"tiny-{name}-random.greedy.json").write_text(json.dumps({"prompts": prompts}))
    print(name, "transformers", transformers.__version__, "torch", torch.__version__)


def make_gemma3_mm():
    import safetensors.torch
    text = transformers.Gemma3ForCausalLM.from_pretrained(MODELS / "tiny-gemma3-random", dtype=torch.float32,
                                                         attn_implementation="eager").eval()
    tc = text.config.to_dict()
    vc = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)
    cfg = transformers.Gemma3Config(text_config=tc, vision_config=vc, mm_tokens_per_image=4,
                                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(1234 + 100)
    mm = transformers.Gemma3ForConditionalGeneration(cfg).to(torch.float32).eval()
    mm.model.language_model.load_state_dict(text.model.state_dict())
    ids = torch.tensor([json.loads((FIX / "tiny-gemma3-random.logits.json").read_text())["input_ids"]])
    with torch.no_grad():
        a, b = text(ids).logits, mm(input_ids=ids).logits
    diff = float((a - b).abs().max())
    assert diff == 0.0, diff
    out = MODELS / "tiny-gemma3-mm"
    tmp = pathlib.Path("/tmp/tiny-gemma3-mm-save")
    if tmp.exists():
        shutil.rmtree(tmp)
    mm.save_pretrained(tmp, safe_serialization=True)
    saved = safetensors.torch.load_file(tmp / "model.safetensors")
    textw = dict(text.state_dict())
    rows = []
    for name, t in saved.items():
        src = [k for k, v in textw.items() if v.shape == t.shape and torch.equal(v, t) and not k.startswith("lm_head")]
        src = [k for k in src if k.split(".")[-2:] == name.split(".")[-2:]] or src
        assert len(src) <= 1 or name.startswith("model.vision_tower"), (name, src)
        rows.append({"name": name, "shape": list(t.shape), "from": src[0] if src and "vision" not in name
                     and "multi_modal" not in name else None})
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    saved_cfg = json.loads((tmp / "config.json").read_text())
    saved_cfg["text_config"]["_name_or_path"] = "tiny-gemma3-random"
    (out / "config.json").write_text(json.dumps(saved_cfg, indent=2, sort_keys=True) + "\n")
    (out / "tensors.json").write_text(json.dumps({"tensors": rows}, indent=0))
    n_text = sum(r["from"] is not None for r in rows)
    print("gemma3-mm: %d tensors (%d of the language model), max |logits diff| %g, transformers %s, torch %s"
          % (len(rows), n_text, diff, transformers.__version__, torch.__version__))


def main():
    names = sys.argv[1:] or list(FAMILIES) + ["gemma3-mm"]
    for name in names:
        if name == "gemma3-mm":
            make_gemma3_mm()
        else:
            make(name, list(FAMILIES).index(name))


if __name__ == "__main__":
    main()
