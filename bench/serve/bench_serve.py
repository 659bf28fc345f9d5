#!/usr/bin/env python3
"""bench_serve.py - load generator for `quire serve` (like vLLM's
benchmark_serving): requests arrive as a Poisson process (or all at once),
stream over HTTP/SSE (the openai SDK) or over the WebSocket protocol, and the
script reports throughput, time to first token (TTFT), inter-token latency
(ITL) and request latency percentiles.  With --burst it also runs the same
requests through the engine alone (`quire generate --batch`) and prints the
server path's overhead per streamed token.

    python3 bench/serve/bench_serve.py [--quire build/quire] [--model models/stories260K.gguf]
        [--requests 200] [--rate 50] [--max-tokens 64] [--protocol http|ws|both] [--burst]

It starts its own `quire serve` on a free port (--url to use a running one).
Needs the packages of tests/e2e/requirements.txt (openai, websockets)."""
import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai
import websockets

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "A big red ball",
           "One day, a cat", "Tom had a toy car", "The sun was hot", "Sara saw a bird"]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def one_http(client, prompt, n, rec):
    t0 = time.perf_counter()
    stream = await client.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})
    times = []
    async for c in stream:
        if c.choices and c.choices[0].text:
            times.append(time.perf_counter())
    rec.append((t0, times, time.perf_counter()))


async def one_ws(url, prompt, n, rec):
    t0 = time.perf_counter()
    async with websockets.connect(url.replace("http", "ws", 1) + "/v1/ws") as ws:
        await ws.send(json.dumps({"type": "chat", "id": "r", "prompt": prompt, "max_tokens": n, "temperature": 0,
                                  "ignore_eos": True}))
        times = []
        while True:
            m = json.loads(await ws.recv())
            if m["type"] == "delta" and m["text"]:
                times.append(time.perf_counter())
            elif m["type"] in ("done", "error"):
                break
    rec.append((t0, times, time.perf_counter()))


async def run_load(url, protocol, prompts, n, rate, seed):
    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    rec, tasks = [], []
    t_start = time.perf_counter()
    for p in prompts:
        tasks.append(asyncio.create_task(one_http(client, p, n, rec) if protocol == "http" else one_ws(url, p, n, rec)))
        if rate > 0:
            await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t_start
    ttft = [times[0] - t0 for t0, times, _ in rec if times]
    itl = [b - a for _, times, _ in rec for a, b in zip(times, times[1:])]
    lat = [t1 - t0 for t0, _, t1 in rec]
    toks = sum(len(times) for _, times, _ in rec)
    return {"wall": wall, "tokens": toks, "ttft": ttft, "itl": itl, "lat": lat}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_alone(quire, model, prompts, n):
    """The same requests through `quire generate --batch`: wall seconds."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True}) + "\n")
    t0 = time.perf_counter()
    subprocess.run([quire, "generate", "-m", model, "--batch", f.name, "--kv-mem", "256"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    os.unlink(f.name)
    return wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quire", default=os.path.join(ROOT, "build", "quire"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "stories260K.gguf"))
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=50.0, help="mean arrivals a second (Poisson); 0: all at once")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--protocol", choices=["http", "ws", "both"], default="both")
    ap.add_argument("--burst", action="store_true", help="also all at once, against the engine alone")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    proc = None
    url = a.url
    if not url:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([a.quire, "serve", "-m", a.model, "--port", str(port), "--kv-mem", "256",
                                 "--max-requests", str(max(256, a.requests))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
    rng = random.Random(a.seed)
    prompts = [rng.choice(PROMPTS) for _ in range(a.requests)]
    protos = ["http", "ws"] if a.protocol == "both" else [a.protocol]
    print(f"model: {os.path.basename(a.model)}, {a.requests} requests of {a.max_tokens} tokens, "
          f"arrivals {'all at once' if a.rate <= 0 else f'Poisson at {a.rate:g}/s'}\n")
    print("| protocol | arrivals | tok/s | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) | latency p50 / p99 (s) |")
    print("|---|---|---|---|---|---|")
    runs = [(p, a.rate) for p in protos] + ([(p, 0.0) for p in protos] if a.burst else [])
    res = {}
    try:
        for proto, rate in runs:
            asyncio.run(run_load(url, proto, prompts[:8], 4, 0, a.seed))  # warm-up
            r = asyncio.run(run_load(url, proto, prompts, a.max_tokens, rate, a.seed))
            res[(proto, rate)] = r
            ms = lambda xs, p: pct(xs, p) * 1000
            print(f"| {proto} | {'burst' if rate <= 0 else f'{rate:g}/s'} | {r['tokens'] / r['wall']:,.0f} | "
                  f"{ms(r['ttft'], 50):.1f} / {ms(r['ttft'], 90):.1f} / {ms(r['ttft'], 99):.1f} | "
                  f"{ms(r['itl'], 50):.2f} / {ms(r['itl'], 90):.2f} / {ms(r['itl'], 99):.2f} | "
                  f"{pct(r['lat'], 50):.2f} / {pct(r['lat'], 99):.2f} |")
    finally:
        if proc:
            proc.terminate()
            proc.wait()
    if a.burst:
        wall = engine_alone(a.quire, a.model, prompts, a.max_tokens)
        toks = a.requests * a.max_tokens
        print(f"\nengine alone (`quire generate --batch`, same requests): {toks / wall:,.0f} tok/s, {wall:.2f} s")
        print("\n| protocol | server, all at once (s) | engine alone (s) | overhead per streamed token (us) |")
        print("|---|---|---|---|")
        for proto in protos:
            r = res[(proto, 0.0)]
            print(f"| {proto} | {r['wall']:.2f} | {wall:.2f} | {(r['wall'] - wall) / r['tokens'] * 1e6:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
