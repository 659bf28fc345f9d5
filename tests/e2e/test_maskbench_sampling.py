"""Guided decoding on real schemas (optional: needs MaskBench, found at
$QUIRE_MASKBENCH or ../shared/schemas/maskbench, skipped otherwise).

300 schemas that quire compiles, drawn across MaskBench's subsets (each
subset its share, at least one), are sampled at temperature 1.0 with three
seeds from the bundled model and from the two random-weight models
(tests/fixtures/models): every output that finishes with "stop" must parse
and validate against its schema with Python jsonschema (formats checked
where jsonschema can).  oneOf is checked as anyOf, as quire documents that
it generates it (an output may satisfy two branches); how many outputs that
leaves short of strict oneOf is printed.  A refused schema is skipped over,
never counted."""
import collections
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest

from conftest import ROOT
from test_serve_openai import MODEL, Server

CORPUS = Path(os.environ.get("QUIRE_MASKBENCH", ROOT.parent / "shared" / "schemas" / "maskbench"))
N_SCHEMAS = 300
SEEDS = (1, 2, 3)
MODELS = {
    "stories260K": MODEL,
    "tiny-llama3-random": str(ROOT / "tests" / "fixtures" / "models" / "tiny-llama3-random"),
    "tiny-qwen2-random": str(ROOT / "tests" / "fixtures" / "models" / "tiny-qwen2-random"),
}

pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"MaskBench not found at {CORPUS}")


def subset_of(name):
    """As bench/grammar: the file name up to "---", else up to its last '_'."""
    stem = name[:-5] if name.endswith(".json") else name
    return stem.split("---")[0] if "---" in stem else stem.rsplit("_", 1)[0]


def draw_order():
    """Every schema, subset by subset in a fixed shuffled order, with each
    subset's quota of the 300."""
    by_sub = collections.defaultdict(list)
    for f in sorted(CORPUS.glob("*.json")):
        by_sub[subset_of(f.name)].append(f)
    total = sum(len(v) for v in by_sub.values())
    rng = random.Random(8)
    plan = []
    for sub in sorted(by_sub):
        files = by_sub[sub]
        rng.shuffle(files)
        plan.append((sub, max(1, round(N_SCHEMAS * len(files) / total)), files))
    return plan


def as_documented(s):
    """The schema with oneOf read as anyOf (lists of schemas only)."""
    if isinstance(s, dict):
        return {("anyOf" if k == "oneOf" and isinstance(v, list) else k): as_documented(v) for k, v in s.items()}
    if isinstance(s, list):
        return [as_documented(v) for v in s]
    return s


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def ask(server, schema, seed):
    return server.post("/v1/completions", {"prompt": "The JSON:", "max_tokens": 384, "temperature": 1.0,
                                           "seed": seed, "guided_json": schema})


@pytest.fixture(scope="module")
def servers(quire):
    s = {name: Server(quire, "--no-persist", model=path) for name, path in MODELS.items()}
    yield s
    for v in s.values():
        assert v.stop() == 0


@pytest.fixture(scope="module")
def drawn(servers):
    """The 300: per subset, the first ones in its order that compile."""
    srv = servers["stories260K"]
    out, refused = [], 0
    plan = draw_order()
    pos = {sub: 0 for sub, _, _ in plan}

    def take(sub, files):
        """The subset's next schema that compiles, or None when none is left."""
        nonlocal refused
        while pos[sub] < len(files):
            f = files[pos[sub]]
            pos[sub] += 1
            schema = json.loads(f.read_text())["schema"]
            status, body = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "guided_json": schema})
            if status == 400:
                refused += 1
                continue
            assert status == 200, body
            return (sub, f.name, schema)
        return None

    for sub, quota, files in plan:
        for _ in range(quota):
            got = take(sub, files) if len(out) < N_SCHEMAS else None
            if got:
                out.append(got)
    # Rounding left some over: one more from each subset in turn.
    while len(out) < N_SCHEMAS:
        more = [g for g in (take(sub, files) for sub, _, files in plan if len(out) < N_SCHEMAS) if g]
        if not more:
            break
        out.extend(more[:N_SCHEMAS - len(out)])
    print(f"\n{len(out)} schemas from {len({s for s, _, _ in out})} subsets ({refused} refused on the way)")
    assert len(out) == N_SCHEMAS
    return out


@pytest.mark.parametrize("model", list(MODELS))
def test_sampled_outputs_validate(servers, drawn, model):
    srv = servers[model]
    jobs = [(sub, name, schema, seed) for sub, name, schema in drawn for seed in SEEDS]

    def run(job):
        sub, name, schema, seed = job
        status, body = ask(srv, schema, seed)
        assert status == 200, f"{name}: {body}"
        c = json.loads(body)["choices"][0]
        return job, c["text"], c["finish_reason"]

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(run, jobs))
    stops, bad, strict_only = 0, [], 0
    for (sub, name, schema, seed), text, finish in results:
        assert finish in ("stop", "length"), f"{name} seed {seed}: {finish} after {text!r}"
        if finish != "stop":
            continue
        stops += 1
        try:
            value = json.loads(text)
            errors = [e.message for e in validator(as_documented(schema)).iter_errors(value)]
            strict_only += not errors and not validator(schema).is_valid(value)
        except json.JSONDecodeError as e:
            errors = [f"not JSON: {e}"]
        if errors:
            bad.append(f"{name} seed {seed}: {text[:200]!r}: {errors[0][:200]}")
    print(f"\n{model}: {len(results)} samples, {stops} finished with stop, all of those valid: {not bad} "
          f"({strict_only} satisfy more than one oneOf branch)")
    assert not bad, "\n".join(bad[:20])
    assert stops >= len(results) // 10
