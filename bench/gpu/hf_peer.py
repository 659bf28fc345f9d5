#!/usr/bin/env python3
"""The "peer" measurement for the CUDA backend benchmark: the same workloads
through HF transformers (eager PyTorch, SDPA attention, dynamic KV cache) on
the same device.

The model is built from a config.json with random weights directly on the
device (no checkpoint, no network): throughput does not depend on the weight
values, and generation is forced to run exactly --gen tokens (no EOS).

Workloads:
  decode B=...   B random prompts of --prompt tokens, greedy generate() of --gen
                 tokens each. "e2e tok/s" = B*gen / wall time of the whole
                 generate() (prefill included); "decode tok/s" = B*(gen-1) /
                 (that time - the time of a generate() of 1 new token, i.e. the
                 prefill and the first token).
  prefill N      one sequence of N tokens, one forward pass (use_cache=False,
                 logits of the last position only where supported); median of
                 5 timed with CUDA events.

Usage:
  python3 bench/gpu/hf_peer.py --config bench/configs/bench-1b-v32k.json \
      [--dtype float16|bfloat16] [--decode-batches 1,64,256] [--prompt 128] \
      [--gen 128] [--prefill 2048] [--json OUT.json] [--max-seconds 400]

A CPU dry run of the logic (tiny config):  --device cpu --dtype float32
"""

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

T_START = time.perf_counter()

try:
    import torch
except Exception as e:  # pragma: no cover - reported, not survived
    print(f"hf_peer: cannot import torch: {e!r}", file=sys.stderr)
    sys.exit(2)

try:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
except Exception as e:  # pragma: no cover
    print(f"hf_peer: cannot import transformers: {e!r}", file=sys.stderr)
    sys.exit(2)

OOM_ERRORS = tuple(
    t for t in (getattr(torch.cuda, "OutOfMemoryError", None),
                getattr(torch, "OutOfMemoryError", None))
    if isinstance(t, type)
) or (RuntimeError,)

DTYPES = {
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float32": torch.float32, "fp32": torch.float32,
}

# Keys of a checkpoint's config.json that are not model hyper-parameters, or
# whose meaning changed between transformers 4 and 5; the dtype is ours.
CONFIG_DROP = ("torch_dtype", "dtype", "transformers_version", "_name_or_path",
               "auto_map", "quantization_config")


def log(msg=""):
    print(msg, flush=True)


def elapsed():
    return time.perf_counter() - T_START


# ---------------------------------------------------------------- arguments

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="HF transformers peer benchmark (random weights, on device).")
    p.add_argument("--config", required=True,
                   help="a HF config.json (e.g. bench/configs/bench-1b-v32k.json)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES),
                   help="weight/activation dtype (default bfloat16)")
    p.add_argument("--decode-batches", default="1,64,256",
                   help="comma-separated batch sizes for decode; '' for none")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    p.add_argument("--gen", type=int, default=128, help="generated tokens per sequence")
    p.add_argument("--prefill", default="2048",
                   help="prefill length(s), comma-separated; 0 or '' for none")
    p.add_argument("--prefill-iters", type=int, default=5,
                   help="timed prefill passes (median reported)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed generate() runs per batch size (median reported)")
    p.add_argument("--warmup-tokens", type=int, default=4,
                   help="new tokens of the warm-up generate() per batch size")
    p.add_argument("--cache-implementation", default=None,
                   help="passed to generate() (e.g. 'static'); default: HF's dynamic cache")
    p.add_argument("--attn", default="sdpa",
                   help="attn_implementation (default sdpa; 'eager' also works)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu (dry run)")
    p.add_argument("--max-seconds", type=float, default=400.0,
                   help="skip the remaining rows once the script has run this long")
    p.add_argument("--json", default=None, help="write the numbers to this file")
    args = p.parse_args(argv)
    try:
        args.batches = [int(x) for x in args.decode_batches.replace(" ", "").split(",") if x]
        args.prefills = [int(x) for x in str(args.prefill).replace(" ", "").split(",") if x]
    except ValueError as e:
        p.error(f"bad list: {e}")
    args.prefills = [n for n in args.prefills if n > 0]
    if any(b <= 0 for b in args.batches):
        p.error("batch sizes must be positive")
    if args.prompt <= 0 or args.gen <= 0:
        p.error("--prompt and --gen must be positive")
    args.prefill_iters = max(1, args.prefill_iters)
    args.repeats = max(1, args.repeats)
    return args


def resolve_config_path(path):
    """The path as given; failing that, the file of the same name under
    tests/fixtures/configs/ of this repository (where the bench configs live)."""
    if os.path.isfile(path):
        return path
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for cand in (os.path.join(repo, path),
                 os.path.join(repo, "tests", "fixtures", "configs", os.path.basename(path))):
        if os.path.isfile(cand):
            log(f"note: {path} not found, using {os.path.relpath(cand)}")
            return cand
    raise FileNotFoundError(path)


# ---------------------------------------------------------------- model

def load_config(path):
    with open(path) as f:
        raw = json.load(f)
    d = {k: v for k, v in raw.items() if k not in CONFIG_DROP}
    model_type = d.pop("model_type", None)
    config = None
    if model_type:
        try:
            config = AutoConfig.for_model(model_type, **d)
        except Exception as e:
            log(f"note: AutoConfig.for_model({model_type!r}) failed ({e!r}); trying LlamaConfig")
    if config is None:
        from transformers import LlamaConfig
        config = LlamaConfig.from_dict(d)
    # Nothing may stop generation early: there is no EOS.
    for k in ("eos_token_id", "forced_eos_token_id"):
        if hasattr(config, k):
            setattr(config, k, None)
    return raw, config


def build_model(config, dtype, device, attn):
    """Random weights, created on the device (no CPU init). transformers 5 calls
    the dtype argument `dtype`, transformers 4 `torch_dtype`: try both."""
    attempts = []
    for attn_kw in ({"attn_implementation": attn}, {}):
        for dkey in ("dtype", "torch_dtype"):
            attempts.append({dkey: dtype, **attn_kw})
    model, errors = None, []
    for kw in attempts:
        try:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, **kw)
            break
        except OOM_ERRORS:
            raise
        except Exception as e:
            errors.append(f"from_config({', '.join(kw)}): {e!r}")
            model = None
            gc.collect()
    if model is None:
        raise RuntimeError("could not build the model:\n  " + "\n  ".join(errors))
    if errors:
        for e in errors:
            log(f"note: {e}")
    p = next(model.parameters())
    if p.dtype != dtype or p.device.type != torch.device(device).type:
        log(f"note: model came out as {p.dtype} on {p.device}; converting")
        model = model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    gcfg = getattr(model, "generation_config", None)
    if gcfg is not None:
        for k in ("eos_token_id", "forced_eos_token_id"):
            if hasattr(gcfg, k):
                setattr(gcfg, k, None)
        gcfg.pad_token_id = 0
    return model


# ---------------------------------------------------------------- timing helpers

def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device):
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def gen_config(n_new, args):
    kw = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
              use_cache=True, pad_token_id=0, eos_token_id=None,
              num_beams=1, return_dict_in_generate=False)
    if args.cache_implementation:
        kw["cache_implementation"] = args.cache_implementation
    return GenerationConfig(**kw)


def run_generate(model, ids, mask, n_new, args):
    """One timed generate(); returns (seconds, new tokens per sequence)."""
    gc_ = gen_config(n_new, args)
    sync(args.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc_)
    sync(args.device)
    t = time.perf_counter() - t0
    n = out.shape[1] - ids.shape[1]
    del out
    return t, n


def forward_prefill(model, ids, mode):
    if mode == "logits_to_keep":
        return model(input_ids=ids, use_cache=False, logits_to_keep=1)
    if mode == "num_logits_to_keep":
        return model(input_ids=ids, use_cache=False, num_logits_to_keep=1)
    return model(input_ids=ids, use_cache=False)


# ---------------------------------------------------------------- workloads

def bench_decode(model, vocab, B, args):
    row = {"workload": "decode", "batch": B, "prompt": args.prompt, "gen": args.gen}
    dev = args.device
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(dev)
    ids = torch.randint(0, vocab, (B, args.prompt), device=dev, dtype=torch.long)
    mask = torch.ones_like(ids)
    try:
        # warm-up (shapes of this batch size; cuBLAS/SDPA kernel selection)
        run_generate(model, ids, mask, max(1, min(args.warmup_tokens, args.gen)), args)
        # prefill + first token only
        pf = [run_generate(model, ids, mask, 1, args)[0] for _ in range(max(3, args.repeats))]
        t_pf = statistics.median(pf)
        # the whole thing
        runs = []
        for _ in range(args.repeats):
            t, n = run_generate(model, ids, mask, args.gen, args)
            if n != args.gen:
                row["warning"] = f"generated {n} tokens per sequence, not {args.gen}"
            runs.append((t, n))
        t_e2e = statistics.median(t for t, _ in runs)
        n_new = runs[0][1]
        row.update(
            status="ok",
            e2e_s=t_e2e,
            prefill_gen1_s=t_pf,
            e2e_tok_s=B * n_new / t_e2e,
            e2e_ms_per_step=1e3 * t_e2e / n_new,
        )
        t_dec = t_e2e - t_pf
        if n_new > 1 and t_dec > 0:
            row.update(decode_tok_s=B * (n_new - 1) / t_dec,
                       decode_ms_per_step=1e3 * t_dec / (n_new - 1))
        else:
            row.update(decode_tok_s=None, decode_ms_per_step=None)
    finally:
        del ids, mask
    if dev.startswith("cuda"):
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return row


def bench_prefill(model, vocab, n, args):
    row = {"workload": "prefill", "tokens": n}
    dev = args.device
    cuda = dev.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    ids = torch.randint(0, vocab, (1, n), device=dev, dtype=torch.long)
    try:
        with torch.inference_mode():
            mode, errors = None, []
            for m in ("logits_to_keep", "num_logits_to_keep", "full"):
                try:
                    out = forward_prefill(model, ids, m)  # warm-up
                except OOM_ERRORS:
                    raise
                except TypeError as e:
                    errors.append(f"{m}: {e!r}")
                    continue
                mode = m
                kept = out.logits.shape[1]
                del out
                break
            if mode is None:
                raise RuntimeError("; ".join(errors))
            if mode != "full" and kept != 1:
                mode = f"full ({mode} ignored)"
            times = []
            for _ in range(args.prefill_iters):
                if cuda:
                    s = torch.cuda.Event(enable_timing=True)
                    e = torch.cuda.Event(enable_timing=True)
                    s.record()
                    out = forward_prefill(model, ids, mode.split()[0])
                    e.record()
                    torch.cuda.synchronize(dev)
                    times.append(s.elapsed_time(e) / 1e3)
                else:
                    t0 = time.perf_counter()
                    out = forward_prefill(model, ids, mode.split()[0])
                    times.append(time.perf_counter() - t0)
                del out
    finally:
        del ids
    t = statistics.median(times)
    row.update(status="ok", logits=mode, median_s=t, times_s=times, tok_s=n / t)
    if cuda:
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return row


def guarded(fn, label, args, *a):
    """Run one row: time guard, OOM and any other exception become the row's status."""
    if elapsed() > args.max_seconds:
        log(f"{label}: skipped (time: {elapsed():.0f} s > --max-seconds {args.max_seconds:.0f})")
        return {"status": "skipped (time)"}
    oom = False
    try:
        row = fn(*a)
    except OOM_ERRORS as e:
        oom = True
        row = {"status": "OOM", "error": str(e).splitlines()[0] if str(e) else "OOM"}
    except Exception as e:
        row = {"status": f"error: {type(e).__name__}", "error": repr(e)}
        traceback.print_exc()
    free_memory(args.device)  # outside the except block: the traceback is gone
    if oom:
        log(f"{label}: OOM")
    return row


# ---------------------------------------------------------------- report

def fmt(v, nd=1):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.{nd}f}"


def cell(row, key, nd=1):
    st = row.get("status", "")
    if st != "ok":
        return st
    return fmt(row.get(key), nd)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    try:
        import transformers.utils.logging as tl
        tl.set_verbosity_error()
    except Exception:
        pass

    cfg_path = resolve_config_path(args.config)
    cfg_name = os.path.splitext(os.path.basename(cfg_path))[0]
    dtype = DTYPES[args.dtype]
    dtype_name = str(dtype).replace("torch.", "")

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            log("hf_peer: CUDA is not available (use --device cpu for a dry run)")
            return 2
        dev_index = torch.device(args.device).index or 0
        torch.cuda.set_device(dev_index)
        gpu = torch.cuda.get_device_name(dev_index)
        total_gib = torch.cuda.get_device_properties(dev_index).total_memory / 2**30
        gpu_desc = f"{gpu} ({total_gib:.0f} GiB)"
    else:
        gpu_desc = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"

    raw, config = load_config(cfg_path)
    vocab = int(config.vocab_size)
    t0 = time.perf_counter()
    model = build_model(config, dtype, args.device, args.attn)
    sync(args.device)
    t_build = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    attn_impl = getattr(model.config, "_attn_implementation", None) or "?"

    header = (f"config {cfg_name} ({n_params / 1e9:.2f} B params, vocab {vocab}), "
              f"dtype {dtype_name}, torch {torch.__version__}, "
              f"transformers {transformers.__version__}, attn {attn_impl}, "
              f"cache {args.cache_implementation or 'dynamic'}, device {gpu_desc}")
    log(header)
    log(f"model built in {t_build:.1f} s; prompt {args.prompt}, gen {args.gen}, "
        f"batches {args.batches}, prefill {args.prefills}, max {args.max_seconds:.0f} s")

    results = {"prefill": [], "decode": []}
    # prefill first: it is cheap, and the decode rows are what the time guard cuts
    for n in args.prefills:
        label = f"prefill {n}"
        row = guarded(bench_prefill, label, args, model, vocab, n, args)
        row.setdefault("workload", "prefill")
        row["tokens"] = n
        results["prefill"].append(row)
        if row.get("status") == "ok":
            log(f"{label}: {row['tok_s']:,.0f} tok/s (median {1e3 * row['median_s']:.2f} ms "
                f"of {len(row['times_s'])}, logits: {row['logits']}"
                + (f", peak {row['peak_mem_gib']:.1f} GiB" if "peak_mem_gib" in row else "") + ")")
        elif row.get("status") not in ("OOM",) and not row["status"].startswith("skipped"):
            log(f"{label}: {row['status']} {row.get('error', '')}")

    for B in args.batches:
        label = f"decode B={B}"
        row = guarded(bench_decode, label, args, model, vocab, B, args)
        row.setdefault("workload", "decode")
        row["batch"] = B
        results["decode"].append(row)
        if row.get("status") == "ok":
            log(f"{label}: e2e {row['e2e_tok_s']:,.1f} tok/s ({row['e2e_ms_per_step']:.2f} ms/step), "
                f"decode {fmt(row['decode_tok_s'])} tok/s ({fmt(row['decode_ms_per_step'], 2)} ms/step), "
                f"prefill+1 {1e3 * row['prefill_gen1_s']:.1f} ms, e2e {row['e2e_s']:.2f} s"
                + (f", peak {row['peak_mem_gib']:.1f} GiB" if "peak_mem_gib" in row else "")
                + (f"  WARNING: {row['warning']}" if "warning" in row else ""))
        elif row.get("status") not in ("OOM",) and not row["status"].startswith("skipped"):
            log(f"{label}: {row['status']} {row.get('error', '')}")

    # ---- tables
    log("")
    log(f"HF transformers peer: {header}")
    log(f"decode: {args.prompt}-token random prompts, {args.gen} generated tokens each, greedy, "
        f"no EOS; tok/s summed over sequences")
    log("")
    if results["decode"]:
        log("| B | e2e tok/s | decode tok/s | e2e ms/step | decode ms/step | prefill+1 tok ms | peak GiB |")
        log("|---|---|---|---|---|---|---|")
        for r in results["decode"]:
            if r.get("status") == "ok":
                log(f"| {r['batch']} | {cell(r, 'e2e_tok_s')} | {cell(r, 'decode_tok_s')} | "
                    f"{cell(r, 'e2e_ms_per_step', 2)} | {cell(r, 'decode_ms_per_step', 2)} | "
                    f"{fmt(1e3 * r['prefill_gen1_s'], 1)} | {fmt(r.get('peak_mem_gib'), 1)} |")
            else:
                log(f"| {r['batch']} | {r['status']} | | | | | |")
        log("")
    log("| workload | HF transformers |")
    log("|---|---|")
    for r in results["decode"]:
        B = r["batch"]
        log(f"| decode B={B} (e2e tok/s) | {cell(r, 'e2e_tok_s')} |")
        log(f"| decode B={B} (decode tok/s) | {cell(r, 'decode_tok_s')} |")
    for r in results["prefill"]:
        log(f"| prefill {r['tokens']} (tok/s) | {cell(r, 'tok_s', 0)} |")
    log("")
    log(f"total {elapsed():.1f} s")

    if args.json:
        meta = {
            "config": cfg_name, "config_path": cfg_path, "params": n_params, "vocab": vocab,
            "dtype": dtype_name, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cuda": getattr(torch.version, "cuda", None), "device": gpu_desc,
            "attn_implementation": attn_impl,
            "cache_implementation": args.cache_implementation or "dynamic",
            "prompt": args.prompt, "gen": args.gen, "seed": args.seed,
            "model_build_s": t_build, "total_s": elapsed(),
        }
        out_dir = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(out_dir, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, **results}, f, indent=2)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
