#!/usr/bin/env python3
"""make_model.py - write a random-weight Llama GGUF file for benchmarks.

The file has the shape of a real llama.cpp conversion (GGUF v3, alignment
32, architecture "llama", an SPM-style vocabulary with 256 byte tokens) but
its weights are drawn from normal(0, 0.02), with the RMS-norm weights at
1.0, so that activations stay in a sane range through any number of layers.
Only numpy is needed (see requirements.txt).

Tensors are generated and written one row block at a time, so peak memory
stays at a few tens of MB whatever the model size.

    python bench/make_model.py --preset 24m --dtype f16 --out bench/models/24m-f16.gguf
    python bench/make_model.py --dim 512 --layers 8 --heads 8 --kv-heads 4 --ffn 1376 --out m.gguf

Presets (vocabulary 32000, output head untied):
    24m   dim 288, 6 layers, 6 heads, ffn 768     (the llama2.c "stories15M" shape)
    134m  dim 768, 12 layers, 12 heads, ffn 2048  (the llama2.c "stories110M" shape)
"""
import argparse
import os
import struct
import sys

import numpy as np

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
    p.add_argument("--out", required=True, help="output path")
    a = p.parse_args(argv)

    shape = dict(PRESETS[a.preset]) if a.preset else {}
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
        if v <= 0:
            p.error("--%s must be positive" % k.replace("_", "-"))
    if shape["dim"] % shape["heads"]:
        p.error("--dim %d is not a multiple of --heads %d" % (shape["dim"], shape["heads"]))
    if shape["heads"] % shape["kv_heads"]:
        p.error("--heads %d is not a multiple of --kv-heads %d" % (shape["heads"], shape["kv_heads"]))
    if shape["vocab"] < 3 + 256:
        p.error("--vocab must be at least 259 (3 control tokens and 256 byte tokens)")
    a.shape = shape
    return a


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


def vocabulary(n):
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)]
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL] + [TT_BYTE] * 256
    tokens += ["\u2581tok%d" % i for i in range(n - len(tokens))]
    types += [TT_NORMAL] * (n - len(types))
    # SPM-like scores: control/byte tokens 0, pieces decreasing with rank.
    scores = np.zeros(n, dtype="<f4")
    scores[259:] = -np.arange(n - 259, dtype=np.float32)
    return tokens, scores, np.asarray(types, dtype="<i4")


def metadata(shape, ctx, name):
    tokens, scores, types = vocabulary(shape["vocab"])
    kv = [
        enc_kv_str("general.architecture", "llama"),
        enc_kv_str("general.name", name),
        enc_kv_u32("general.alignment", ALIGNMENT),
        enc_kv_u32("llama.context_length", ctx),
        enc_kv_u32("llama.embedding_length", shape["dim"]),
        enc_kv_u32("llama.block_count", shape["layers"]),
        enc_kv_u32("llama.feed_forward_length", shape["ffn"]),
        enc_kv_u32("llama.attention.head_count", shape["heads"]),
        enc_kv_u32("llama.attention.head_count_kv", shape["kv_heads"]),
        enc_kv_u32("llama.rope.dimension_count", shape["dim"] // shape["heads"]),
        enc_kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
        enc_kv_f32("llama.rope.freq_base", 10000.0),
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
    """(name, PyTorch shape, ggml type, init) in file order."""
    d, f, v = shape["dim"], shape["ffn"], shape["vocab"]
    hd = d // shape["heads"]
    kvd = shape["kv_heads"] * hd
    ts = [("token_embd.weight", (v, d), wtype, "normal")]
    for i in range(shape["layers"]):
        b = "blk.%d." % i
        ts += [
            (b + "attn_norm.weight", (d,), GGML_F32, "ones"),
            (b + "attn_q.weight", (d, d), wtype, "normal"),
            (b + "attn_k.weight", (kvd, d), wtype, "normal"),
            (b + "attn_v.weight", (kvd, d), wtype, "normal"),
            (b + "attn_output.weight", (d, d), wtype, "normal"),
            (b + "ffn_norm.weight", (d,), GGML_F32, "ones"),
            (b + "ffn_gate.weight", (f, d), wtype, "normal"),
            (b + "ffn_up.weight", (f, d), wtype, "normal"),
            (b + "ffn_down.weight", (d, f), wtype, "normal"),
        ]
    ts += [
        ("output_norm.weight", (d,), GGML_F32, "ones"),
        ("output.weight", (v, d), wtype, "normal"),
    ]
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


def write_tensor(f, rng, shp, t, init, std):
    np_t = np.dtype("<f4") if t == GGML_F32 else np.dtype("<f2")
    if init == "ones":
        f.write(np.ones(shp, dtype=np_t).tobytes())
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
        f.write(x.astype(np_t, copy=False).tobytes())


def main(argv=None):
    a = parse_args(argv)
    shape = a.shape
    wtype = GGML_F32 if a.dtype == "f32" else GGML_F16
    ts = tensor_list(shape, wtype)
    name = "random-llama-d%d-l%d-%s" % (shape["dim"], shape["layers"], a.dtype)

    kvs = metadata(shape, a.ctx, name)
    infos = []
    off = 0
    for tname, shp, t, _ in ts:
        dims = tuple(reversed(shp))  # GGUF lists the fastest dimension first
        infos.append(enc_str(tname) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
                     + struct.pack("<IQ", t, off))
        off = pad_to(off + nbytes(shp, t))
    header = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(ts), len(kvs)) + b"".join(kvs) + b"".join(infos)
    data_start = pad_to(len(header))

    rng = np.random.default_rng(a.seed)
    tmp = a.out + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(b"\0" * (data_start - len(header)))
        for tname, shp, t, init in ts:
            pos = f.tell() - data_start
            assert pos % ALIGNMENT == 0
            write_tensor(f, rng, shp, t, init, a.std)
            end = f.tell() - data_start
            f.write(b"\0" * (pad_to(end) - end))
        total = f.tell()
    os.replace(tmp, a.out)

    n_params = sum(int(np.prod(shp)) for _, shp, _, _ in ts)
    print("%s: %s, %d params (%.1fM), %d layers, dim %d, heads %d/%d, ffn %d, vocab %d, %.1f MB"
          % (a.out, a.dtype, n_params, n_params / 1e6, shape["layers"], shape["dim"], shape["heads"],
             shape["kv_heads"], shape["ffn"], shape["vocab"], total / 1e6), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
