#!/usr/bin/env python3
"""make_model.py - write a random-weight GGUF file for benchmarks.

The file has the shape of a real llama.cpp conversion (GGUF v3, alignment
32, architecture "llama", an SPM-style vocabulary with 256 byte tokens) but
its weights are drawn from normal(0, 0.02), with the RMS-norm weights at
1.0, so that activations stay in a sane range through any number of layers.
Only numpy is needed (see requirements.txt); --fill tile runs without it, on
Python's own random and struct (for GPU machines with a bare Python).

Tensors are generated and written one row block at a time, so peak memory
stays at a few tens of MB whatever the model size.

    python bench/make_model.py --preset 24m --dtype f16 --out bench/models/24m-f16.gguf
    python bench/make_model.py --dim 512 --layers 8 --heads 8 --kv-heads 4 --ffn 1376 --out m.gguf
    python bench/make_model.py --config bench/configs/qwen3-8b.json --dtype f16 --fill tile --out q.gguf

--config reads a Hugging Face config.json and writes that family's GGUF as
llama.cpp's convert_hf_to_gguf lays it out: llama (Llama, Mistral), qwen2,
qwen3 (QK-norm), gemma2 / gemma3 (sandwich norms, QK-norm for Gemma 3, the
sliding window, tied embeddings) and phi3 (fused q/k/v and gate/up,
partial rotary, LongRoPE factors).  --fill tile repeats one 8 MB block of
normal draws through every matrix, so that a 24 GB file is written at the
disk's speed (for speed runs, where the values do not matter).

Presets (vocabulary 32000, output head untied):
    24m   dim 288, 6 layers, 6 heads, ffn 768     (the llama2.c "stories15M" shape)
    134m  dim 768, 12 layers, 12 heads, ffn 2048  (the llama2.c "stories110M" shape)
"""
import argparse
import json
import math
import os
import struct
import sys

import random
from array import array

try:
    import numpy as np
except ImportError:  # --fill tile only
    np = None

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# GGUF metadata value types
GT_U32, GT_I32, GT_F32, GT_STRING, GT_ARRAY = 4, 5, 6, 8, 9
# ggml tensor types
GGML_F32, GGML_F16 = 0, 1
# llama.cpp token types
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_BYTE = 1, 2, 3, 6

PRESETS = {
    "24m": dict(dim=288, layers=6, heads=6, kv_heads=6, ffn=768, vocab=32000),
    "134m": dict(dim=768, layers=12, heads=12, kv_heads=12, ffn=2048, vocab=32000),
}

ROW_BLOCK_BYTES = 8 << 20  # generate and write about this much at a time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named model shape (flags below override it)")
    p.add_argument("--dim", type=int, help="embedding width")
    p.add_argument("--layers", type=int, help="number of transformer blocks")
    p.add_argument("--heads", type=int, help="attention heads")
    p.add_argument("--kv-heads", type=int, help="key/value heads (default: --heads)")
    p.add_argument("--ffn", type=int, help="feed-forward hidden width")
    p.add_argument("--vocab", type=int, help="vocabulary size (default 32000)")
    p.add_argument("--ctx", type=int, default=2048, help="context length (default 2048)")
    p.add_argument("--dtype", choices=["f32", "f16"], default="f32",
                   help="type of the 2-D weights; norm weights are always f32 (default f32)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--std", type=float, default=0.02, help="weight standard deviation (default 0.02)")
    p.add_argument("--config", help="a Hugging Face config.json: the family and shape (flags above override it)")
    p.add_argument("--fill", choices=["normal", "tile"], default="normal",
                   help="normal: fresh draws everywhere; tile: one 8 MB block of draws repeated (default normal)")
    p.add_argument("--out", required=True, help="output path")
    a = p.parse_args(argv)

    if a.preset and a.config:
        p.error("give --preset or --config, not both")
    shape = dict(PRESETS[a.preset]) if a.preset else {}
    shape["arch"] = "llama"
    if a.config:
        try:
            shape.update(from_config(a.config))
        except (OSError, ValueError, KeyError) as e:
            p.error("--config %s: %s" % (a.config, e))
    for k in ("dim", "layers", "heads", "kv_heads", "ffn", "vocab"):
        v = getattr(a, k)
        if v is not None:
            shape[k] = v
    shape.setdefault("vocab", 32000)
    if "heads" in shape:
        shape.setdefault("kv_heads", shape["heads"])
    missing = [k for k in ("dim", "layers", "heads", "ffn") if k not in shape]
    if missing:
        p.error("give --preset or all of --dim --layers --heads --ffn (missing: %s)"
                % ", ".join("--" + k.replace("_", "-") for k in missing))
    for k, v in shape.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
            p.error("--%s must be positive" % k.replace("_", "-"))
    if "head_dim" not in shape and shape["dim"] % shape["heads"]:
        p.error("--dim %d is not a multiple of --heads %d" % (shape["dim"], shape["heads"]))
    if shape["heads"] % shape["kv_heads"]:
        p.error("--heads %d is not a multiple of --kv-heads %d" % (shape["heads"], shape["kv_heads"]))
    if shape["vocab"] < 3 + 256:
        p.error("--vocab must be at least 259 (3 control tokens and 256 byte tokens)")
    a.shape = shape
    return a


# ---- Hugging Face configs ----------------------------------------------------

ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
         "gemma3": "gemma3", "gemma3_text": "gemma3", "phi3": "phi3"}


def from_config(path):
    """The shape and family of a config.json, as convert_hf_to_gguf reads them."""
    with open(path) as f:
        c = json.load(f)
    c = c.get("text_config", c)
    mt = c.get("model_type")
    if mt not in ARCHS:
        raise ValueError("model_type %r is not one of %s" % (mt, ", ".join(sorted(ARCHS))))
    sh = dict(arch=ARCHS[mt], dim=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
              kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"], ffn=c["intermediate_size"],
              vocab=c["vocab_size"], eps=float(c.get("rms_norm_eps", 1e-5)),
              rope_theta=float(c.get("rope_theta", 10000.0)),
              tied=bool(c.get("tie_word_embeddings", mt.startswith("gemma"))))
    if c.get("head_dim"):
        sh["head_dim"] = c["head_dim"]
    hd = sh.get("head_dim") or sh["dim"] // sh["heads"]
    sh["rope_dim"] = int(hd * float(c.get("partial_rotary_factor", 1.0)))
    if (sh["arch"] in ("gemma2", "gemma3") or mt == "mistral") and c.get("sliding_window"):
        sh["window"] = c["sliding_window"]
    rs = c.get("rope_scaling") or {}
    kind = rs.get("rope_type") or rs.get("type")
    if kind == "linear":
        sh["rope_linear"] = float(rs["factor"])
    if sh["arch"] == "gemma2":
        sh["softcaps"] = (float(c.get("attn_logit_softcapping") or 0), float(c.get("final_logit_softcapping") or 0))
    if kind == "longrope":
        orig = c["original_max_position_embeddings"]
        scale = c["max_position_embeddings"] / orig
        sh["longrope"] = dict(orig=orig, long=rs["long_factor"], short=rs["short_factor"],
                              attn=math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
    sh["ctx"] = c.get("max_position_embeddings", 2048)
    return sh



# ---- metadata encoding -------------------------------------------------------

def enc_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def enc_kv_u32(key, v):
    return enc_str(key) + struct.pack("<II", GT_U32, v)


def enc_kv_f32(key, v):
    return enc_str(key) + struct.pack("<If", GT_F32, v)


def enc_kv_str(key, v):
    return enc_str(key) + struct.pack("<I", GT_STRING) + enc_str(v)


def enc_kv_arr(key, elem_type, payload, n):
    return enc_str(key) + struct.pack("<IIQ", GT_ARRAY, elem_type, n) + payload


def vocabulary(n, arch="llama"):
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL] + [TT_BYTE] * 256
    if arch == "phi3":  # llama.cpp sets this one's attributes in a model named phi3
        tokens.append("<|endoftext|>")
        types.append(TT_CONTROL)
    tokens += ["\u2581tok%d" % i for i in range(n - len(tokens))]
    types += [TT_NORMAL] * (n - len(types))
    # SPM-like scores: control/byte tokens 0, pieces decreasing with rank.
    k = n - sum(1 for t in types if t == TT_NORMAL)
    scores = array("f", [0.0] * k + [-float(i) for i in range(n - k)])
    return tokens, scores, array("i", types)


def metadata(shape, ctx, name):
    tokens, scores, types = vocabulary(shape["vocab"], shape["arch"])
    arch = shape["arch"]
    hd = shape.get("head_dim") or shape["dim"] // shape["heads"]
    A = arch + "."
    kv = [
        enc_kv_str("general.architecture", arch),
        enc_kv_str("general.name", name),
        enc_kv_u32("general.alignment", ALIGNMENT),
        enc_kv_u32(A + "context_length", ctx),
        enc_kv_u32(A + "embedding_length", shape["dim"]),
        enc_kv_u32(A + "block_count", shape["layers"]),
        enc_kv_u32(A + "feed_forward_length", shape["ffn"]),
        enc_kv_u32(A + "attention.head_count", shape["heads"]),
        enc_kv_u32(A + "attention.head_count_kv", shape["kv_heads"]),
        enc_kv_u32(A + "attention.key_length", hd),
        enc_kv_u32(A + "attention.value_length", hd),
        enc_kv_u32(A + "rope.dimension_count", shape.get("rope_dim", hd)),
        enc_kv_f32(A + "attention.layer_norm_rms_epsilon", shape.get("eps", 1e-5)),
        enc_kv_f32(A + "rope.freq_base", shape.get("rope_theta", 10000.0)),
    ]
    if "window" in shape:
        kv.append(enc_kv_u32(A + "attention.sliding_window", shape["window"]))
    if "rope_linear" in shape:
        kv += [enc_kv_str(A + "rope.scaling.type", "linear"), enc_kv_f32(A + "rope.scaling.factor", shape["rope_linear"])]
    if "softcaps" in shape:
        kv += [enc_kv_f32(A + "attn_logit_softcapping", shape["softcaps"][0]),
               enc_kv_f32(A + "final_logit_softcapping", shape["softcaps"][1])]
    if "longrope" in shape:
        lr = shape["longrope"]
        kv += [enc_kv_u32(A + "rope.scaling.original_context_length", lr["orig"]),
               enc_kv_f32(A + "rope.scaling.attn_factor", lr["attn"])]
    kv += [
        enc_kv_str("tokenizer.ggml.model", "llama"),
        enc_kv_arr("tokenizer.ggml.tokens", GT_STRING, b"".join(enc_str(t) for t in tokens), len(tokens)),
        enc_kv_arr("tokenizer.ggml.scores", GT_F32, scores.tobytes(), len(tokens)),
        enc_kv_arr("tokenizer.ggml.token_type", GT_I32, types.tobytes(), len(tokens)),
        enc_kv_u32("tokenizer.ggml.unknown_token_id", 0),
        enc_kv_u32("tokenizer.ggml.bos_token_id", 1),
        enc_kv_u32("tokenizer.ggml.eos_token_id", 2),
    ]
    return kv


# ---- tensors -------------------------------------------------------------------

def tensor_list(shape, wtype):
    """(name, PyTorch shape, ggml type, init) in file order, named as llama.cpp's converter names them."""
    arch = shape["arch"]
    d, f, v = shape["dim"], shape["ffn"], shape["vocab"]
    hd = shape.get("head_dim") or d // shape["heads"]
    qd, kvd = shape["heads"] * hd, shape["kv_heads"] * hd
    gemma = arch.startswith("gemma")
    ts = [("token_embd.weight", (v, d), wtype, "normal")]
    if "longrope" in shape:
        lr = shape["longrope"]
        ts += [("rope_factors_long.weight", (len(lr["long"]),), GGML_F32, lr["long"]),
               ("rope_factors_short.weight", (len(lr["short"]),), GGML_F32, lr["short"])]
    for i in range(shape["layers"]):
        b = "blk.%d." % i
        ts.append((b + "attn_norm.weight", (d,), GGML_F32, "ones"))
        if arch == "phi3":
            ts.append((b + "attn_qkv.weight", (qd + 2 * kvd, d), wtype, "normal"))
        else:
            ts += [(b + "attn_q.weight", (qd, d), wtype, "normal"),
                   (b + "attn_k.weight", (kvd, d), wtype, "normal"),
                   (b + "attn_v.weight", (kvd, d), wtype, "normal")]
            if arch == "qwen2":
                ts += [(b + "attn_%s.bias" % x, (n,), GGML_F32, "zeros") for x, n in (("q", qd), ("k", kvd), ("v", kvd))]
        if arch in ("qwen3", "gemma3"):
            ts += [(b + "attn_q_norm.weight", (hd,), GGML_F32, "ones"),
                   (b + "attn_k_norm.weight", (hd,), GGML_F32, "ones")]
        ts.append((b + "attn_output.weight", (d, qd), wtype, "normal"))
        if gemma:
            ts.append((b + "post_attention_norm.weight", (d,), GGML_F32, "ones"))
        ts.append((b + "ffn_norm.weight", (d,), GGML_F32, "ones"))
        if arch == "phi3":
            ts.append((b + "ffn_up.weight", (2 * f, d), wtype, "normal"))
        else:
            ts += [(b + "ffn_gate.weight", (f, d), wtype, "normal"),
                   (b + "ffn_up.weight", (f, d), wtype, "normal")]
        ts.append((b + "ffn_down.weight", (d, f), wtype, "normal"))
        if gemma:
            ts.append((b + "post_ffw_norm.weight", (d,), GGML_F32, "ones"))
    ts.append(("output_norm.weight", (d,), GGML_F32, "ones"))
    if not shape.get("tied", False):
        ts.append(("output.weight", (v, d), wtype, "normal"))
    return ts


def elt_size(t):
    return 4 if t == GGML_F32 else 2


def nbytes(shp, t):
    n = 1
    for x in shp:
        n *= x
    return n * elt_size(t)


def pad_to(n, a=ALIGNMENT):
    return (n + a - 1) // a * a


def write_tensor(f, rng, shp, t, init, std, tile=None):
    code = "<%d" + ("f" if t == GGML_F32 else "e")
    if isinstance(init, list):
        f.write(struct.pack(code % len(init), *init))
        return
    if init in ("ones", "zeros"):
        n = nbytes(shp, t) // elt_size(t)
        f.write(struct.pack(code % n, *([1.0 if init == "ones" else 0.0] * n)))
        return
    if tile is not None:  # the same block of draws, over and over
        left = nbytes(shp, t)
        while left:
            n = min(left, len(tile))
            f.write(tile[:n])
            left -= n
        return
    rows = shp[0]
    row_elems = 1
    for x in shp[1:]:
        row_elems *= x
    block = max(1, ROW_BLOCK_BYTES // (4 * row_elems))
    for r0 in range(0, rows, block):
        n = min(block, rows - r0)
        x = rng.standard_normal(n * row_elems, dtype=np.float32)
        x *= std
        f.write(x.astype("<f4" if t == GGML_F32 else "<f2", copy=False).tobytes())


def main(argv=None):
    a = parse_args(argv)
    shape = a.shape
    wtype = GGML_F32 if a.dtype == "f32" else GGML_F16
    ts = tensor_list(shape, wtype)
    name = "random-%s-d%d-l%d-%s" % (shape["arch"], shape["dim"], shape["layers"], a.dtype)

    kvs = metadata(shape, shape.get("ctx", a.ctx) if a.config else a.ctx, name)
    infos = []
    off = 0
    for tname, shp, t, _ in ts:
        dims = tuple(reversed(shp))  # GGUF lists the fastest dimension first
        infos.append(enc_str(tname) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
                     + struct.pack("<IQ", t, off))
        off = pad_to(off + nbytes(shp, t))
    header = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(ts), len(kvs)) + b"".join(kvs) + b"".join(infos)
    data_start = pad_to(len(header))

    if np is None and a.fill != "tile":
        sys.exit("make_model.py: --fill normal needs numpy (pip install numpy), or use --fill tile")
    rng = np.random.default_rng(a.seed) if np is not None else None
    tile = None
    if a.fill == "tile":
        r = random.Random(a.seed)
        n = ROW_BLOCK_BYTES // elt_size(wtype)
        tile = struct.pack("<%d%s" % (n, "f" if wtype == GGML_F32 else "e"), *(r.gauss(0.0, a.std) for _ in range(n)))
    tmp = a.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(b"\0" * (data_start - len(header)))
        for tname, shp, t, init in ts:
            pos = f.tell() - data_start
            assert pos % ALIGNMENT == 0
            write_tensor(f, rng, shp, t, init, a.std, tile if t == wtype else None)
            end = f.tell() - data_start
            f.write(b"\0" * (pad_to(end) - end))
        total = f.tell()
    os.replace(tmp, a.out)

    n_params = sum(nbytes(shp, GGML_F32) // 4 for _, shp, _, _ in ts)
    print("%s: %s %s, %d params (%.1fM), %d layers, dim %d, heads %d/%d, ffn %d, vocab %d, %.1f MB"
          % (a.out, shape["arch"], a.dtype, n_params, n_params / 1e6, shape["layers"], shape["dim"], shape["heads"],
             shape["kv_heads"], shape["ffn"], shape["vocab"], total / 1e6), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
