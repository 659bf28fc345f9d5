"""`quire serve` driven by the official openai SDK and by raw HTTP, on the
bundled stories260K model: completions and chat, whole and streamed, n,
seed, stop, logprobs, consistency with `quire generate`, the documented
errors, cancel on disconnect (visible in /metrics) and a clean exit on
SIGTERM."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import ROOT

MODEL = str(ROOT / "models" / "stories260K.gguf")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, quire, *extra, db=None, port=None, model=MODEL, env=None, log=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A database of its own (a fresh one unless db names one), so that
        # tests never share or leave quire.db behind.
        self.db = None
        if "--db" not in extra and "--no-persist" not in extra:
            self.db = db or os.path.join(tempfile.mkdtemp(prefix="quire-e2e-"), "quire.db")
            extra = (*extra, "--db", self.db)
        # The log in a file (a pipe nobody reads would fill with the
        # per-request lines and stall the server).
        if log is None:
            log = os.path.join(tempfile.mkdtemp(prefix="quire-log-"), "serve.log")
        self.proc = subprocess.Popen(
            [quire, "serve", "-m", model, "--port", str(self.port), "--kv-mem", "64", *extra],
            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True,
            env={**os.environ, **(env or {})})
        self.log = log
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("quire serve exited: " + open(log).read())
            time.sleep(0.05)
        raise RuntimeError("quire serve did not come up")

    def get(self, path, headers=None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body, headers=None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def request(self, method, path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read().decode() or "null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "null")

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def metric(self, name):
        _, text = self.get("/metrics")
        m = re.search("^" + re.escape(name) + r" ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else None

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M).group(1))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(quire):
    s = Server(quire)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def generate(quire, prompt, n):
    out = subprocess.run([quire, "generate", "-m", MODEL, "-p", prompt, "--temp", "0", "-n", str(n)],
                         capture_output=True, text=True, check=True).stdout
    return out[:-1] if out.endswith("\n") else out


def test_completion_matches_generate(quire, client):
    r = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=24, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].text == generate(quire, "Once upon a time", 24)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24


def test_seeded_sampling_matches_generate(quire, client):
    outs = []
    for seed in (5, 9):
        r = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=24, temperature=1.2, seed=seed)
        want = subprocess.run([quire, "generate", "-m", MODEL, "-p", "Once upon a time", "--temp", "1.2", "--seed",
                               str(seed), "-n", "24"], capture_output=True, text=True, check=True).stdout
        assert r.choices[0].text == (want[:-1] if want.endswith("\n") else want)
        outs.append(r.choices[0].text)
    assert outs[0] != outs[1]


def test_completion_stream_equals_whole(client):
    whole = client.completions.create(model="stories260K", prompt="The cat", max_tokens=30, temperature=0)
    chunks = list(client.completions.create(model="stories260K", prompt="The cat", max_tokens=30, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_whole_and_stream(client):
    msgs = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Lily had a dog."}]
    whole = client.chat.completions.create(model="stories260K", messages=msgs, max_tokens=20, temperature=0)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    text = whole.choices[0].message.content
    assert len(text) > 0
    stream = client.chat.completions.create(model="stories260K", messages=msgs, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_n_seed_and_stop(client):
    a = client.completions.create(model="stories260K", prompt="Once", max_tokens=16, temperature=1.0, seed=7, n=3)
    b = client.completions.create(model="stories260K", prompt="Once", max_tokens=16, temperature=1.0, seed=7, n=3)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]   # the same seed, the same samples
    assert len({c.text for c in a.choices}) > 1                          # sample i draws with seed + i
    r = client.completions.create(model="stories260K", prompt="Once upon a time", max_tokens=60, temperature=0, stop=["."])
    assert "." not in r.choices[0].text and r.choices[0].finish_reason == "stop"


def test_logprobs(client):
    r = client.chat.completions.create(model="stories260K", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.token == e.top_logprobs[0].token       # greedy: the likeliest
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    c = client.completions.create(model="stories260K", prompt="Once", max_tokens=5, temperature=0, logprobs=3)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text
    assert len(lp.token_logprobs) == 5 and all(len(t) >= 1 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0


def test_errors(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="stories260K", prompt="x", temperature=-1)
    assert e.value.status_code == 400 and "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="stories260K", messages=[])
    status, body = server.post("/v1/chat/completions", b"{not json")
    err = json.loads(body)["error"]
    assert status == 400 and "not valid JSON" in err["message"] and err["type"] == "invalid_request_error"
    status, body = server.post("/v1/completions", b'{"prompt": "\xff"}')
    assert status == 400
    status, body = server.post("/v1/completions", {"prompt": [1] * 3000, "max_tokens": 1})
    assert status == 400 and json.loads(body)["error"]["code"] == "context_length_exceeded"
    status, body = server.get("/nope")
    assert status == 404 and "no such endpoint" in json.loads(body)["error"]["message"]
    status, body = server.post("/v1/completions", {"prompt": "x" * (2 << 20)})
    assert status == 413
    # The server keeps serving.
    assert server.get("/health")[0] == 200
    r = client.completions.create(model="stories260K", prompt="Once", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_disconnect_frees_blocks(server):
    # 50 HTTP clients that vanish mid-stream (test_serve_ws.py: 50 more over WebSocket).
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", server.port))
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0,
                           "stream": True, "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(65536)
        s.close()
    deadline = time.time() + 5
    while time.time() < deadline:
        if server.metric("quire_requests_running") == 0 and server.metric('quire_kv_blocks{state="used"}') == 0:
            break
        time.sleep(0.05)
    assert server.metric("quire_requests_running") == 0
    assert server.metric('quire_kv_blocks{state="used"}') == 0
    assert server.metric("quire_generation_tokens_total") is not None


def test_metrics_and_models(server):
    status, body = server.get("/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "stories260K.gguf"
    status, text = server.get("/metrics")
    assert status == 200
    assert re.search(r'^quire_requests_total\{endpoint="completions",status="200"\} [1-9]', text, re.M)
    assert re.search(r"^quire_time_to_first_token_seconds_count [1-9]", text, re.M)


def test_api_key_and_sigterm_mid_stream(quire, tmp_path):
    keyfile = tmp_path / "key"
    keyfile.write_text("sekret\n")
    s = Server(quire, "--api-key-file", str(keyfile), "--shutdown-grace", "0", "--log-level", "warn")
    try:
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="stories260K", prompt="x", max_tokens=1)
        assert s.get("/v1/models")[0] == 401
        assert s.get("/health")[0] == 200
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model="stories260K", prompt="x", max_tokens=2).usage.completion_tokens == 2
        # SIGTERM while a stream runs (no grace): the stream gets its final
        # event (finish_reason abort, then [DONE]) and the process exits 0.
        stream = good.completions.create(model="stories260K", prompt="Once", max_tokens=1500, stream=True,
                                         extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)
        s.proc.send_signal(signal.SIGTERM)
        rest = list(it)
        finals = [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason]
        assert finals in (["abort"], ["length"])
    finally:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0


def test_bad_start(quire, tmp_path):
    """A model that cannot load: a message and exit status 1; bad flags: 2."""
    port = free_port()
    r = subprocess.run([quire, "serve", "-m", str(tmp_path / "missing.gguf"), "--port", str(port), "--no-persist"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "missing.gguf" in r.stderr
    r = subprocess.run([quire, "serve", "-m", MODEL, "--log-level", "loud"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--log-level" in r.stderr
    r = subprocess.run([quire, "serve", "-m", MODEL, "--api-key-file", str(tmp_path / "nokey")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--api-key-file" in r.stderr


def test_max_requests_429(quire):
    """Beyond --max-requests requests in flight: 429 with a clear message;
    once they finish, requests are served again."""
    s = Server(quire, "--max-requests", "2")
    try:
        # Three long streams sent back to back: two run, the third is refused.
        body = json.dumps({"prompt": "Once", "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        conns = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(3)]
        for c in conns:
            c.sendall(req)
        heads = [c.recv(65536).split(b"\r\n", 1)[0] for c in conns]
        assert sorted(h.split(b" ")[1] for h in heads) == [b"200", b"200", b"429"], heads
        for c in conns:
            c.close()
        deadline = time.time() + 10
        while time.time() < deadline and s.post("/v1/completions", {"prompt": "x", "max_tokens": 1})[0] != 200:
            time.sleep(0.05)
        status, body = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 200
    finally:
        assert s.stop() == 0


def test_429_message(quire):
    s = Server(quire, "--max-requests", "1")
    try:
        body = json.dumps({"prompt": "Once", "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode()
        c = socket.create_connection(("127.0.0.1", s.port))
        c2 = socket.create_connection(("127.0.0.1", s.port))
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        c.sendall(req)
        c2.sendall(req)
        r1, r2 = c.recv(65536), c2.recv(65536)
        refused = r2 if b" 429 " in r2.split(b"\r\n", 1)[0] else r1
        while refused.count(b"}") < 2:
            more = (c2 if refused is r2 else c).recv(65536)
            if not more:
                break
            refused += more
        err = json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]
        assert err["type"] == "rate_limit_error" and "limit of 1 requests in flight" in err["message"]
        c.close()
        c2.close()
    finally:
        assert s.stop() == 0


def test_tensor_parallel(quire):
    """--tensor-parallel 2 on the CPU (the model split in two, as on two
    GPUs): the same greedy text as quire generate on the whole model.  Then
    a split whose rank 1 fails a decode step (QUIRE_TP_FAIL, the test hook):
    that request ends within seconds (finish_reason "abort") instead of
    hanging,
    /health says 503 with the reason, new requests are refused with 503,
    and the server still stops cleanly."""
    s = Server(quire, "--device", "cpu", "--tensor-parallel", "2", "--no-persist")
    try:
        status, body = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0})
        assert status == 200, body
        assert json.loads(body)["choices"][0]["text"] == generate(quire, "Once upon a time", 40)
    finally:
        assert s.stop() == 0
    s = Server(quire, "--device", "cpu", "--tensor-parallel", "2", "--no-persist", env={"QUIRE_TP_FAIL": "1,3"})
    try:
        t0 = time.time()
        status, body = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0})
        # The request's tokens so far, ended as aborted (vLLM's finish reason for an engine error).
        assert status == 200 and time.time() - t0 < 20, (status, body)
        assert json.loads(body)["choices"][0]["finish_reason"] == "abort", body
        status, body = s.get("/health")
        assert status == 503 and json.loads(body)["status"] == "error", body
        status, body = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 4})
        assert status == 503 and "restart the server" in json.loads(body)["error"]["message"], body
    finally:
        assert s.stop() == 0
