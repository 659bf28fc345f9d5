#!/usr/bin/env python3
"""Writes tests/fixtures/schema_suite/suite.json: (schema, valid instances)
pairs for test_schema_suite.c, which checks that every instance of a schema
quire compiles is accepted by its grammar (full mode, and strict mode for the
instances marked strict).

Sources:
  - the JSON-Schema-Test-Suite's valid cases (the copy that the `jsonschema`
    sdist bundles under json/tests/), drafts 4, 7 and 2020-12, required and
    optional tests;
  - instances that hypothesis-jsonschema generates for the same schemas
    (derandomized: the same versions give the same instances), kept when
    jsonschema (with its format checker) says they are valid.

An instance is marked strict when it is also valid under the schema with
every listing schema closed (additionalProperties false beside properties /
patternProperties, no items past a tuple), outside not / if / propertyNames /
contains: a stricter reading than quire's strict mode (schema.h), which
closes objects as merged, so every instance marked strict must be taken.

  python3 -m venv build/venv && build/venv/bin/pip install "jsonschema[format]==4.26.0" hypothesis-jsonschema==0.23.1
  build/venv/bin/pip download --no-binary :all: --no-deps jsonschema==4.26.0 -d build/sdist
  tar xzf build/sdist/jsonschema-4.26.0.tar.gz -C build/sdist
  build/venv/bin/python scripts/gen_schema_suite.py build/sdist/jsonschema-4.26.0/json/tests
"""
import argparse
import copy
import json
import re
import math
import os
import sys
import warnings
from importlib import metadata

import hypothesis
import jsonschema
from hypothesis import HealthCheck, given, settings

import hypothesis_jsonschema

DRAFTS = {
    "draft4": "http://json-schema.org/draft-04/schema#",
    "draft7": "http://json-schema.org/draft-07/schema#",
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
}
TESTS = ("not", "if", "propertyNames", "contains")  # subschemas that only test an instance
MAPS = ("properties", "patternProperties", "definitions", "$defs", "dependencies", "dependentSchemas")
LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
ONE = ("additionalItems", "additionalProperties", "then", "else", "unevaluatedItems", "unevaluatedProperties")


def normal(v):
    """Integral floats as integers (JSON Schema's 1.0 is the integer 1; past
    2**53 storable() drops them: drafts differ on whether they are)."""
    if isinstance(v, float) and math.isfinite(v) and v == math.floor(v) and abs(v) < 2**53:
        return int(v)
    if isinstance(v, list):
        return [normal(x) for x in v]
    if isinstance(v, dict):
        return {k: normal(x) for k, x in v.items()}
    return v


def storable(v):
    """What jansson reads back as it is: UTF-8 strings, integers in int64, finite numbers."""
    if isinstance(v, bool) or v is None:
        return True
    if isinstance(v, int):
        return -(2**63) <= v < 2**63
    if isinstance(v, float):
        return math.isfinite(v) and not (v == math.floor(v) and abs(v) >= 2**53)
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return "\0" not in v
    if isinstance(v, list):
        return all(storable(x) for x in v)
    if isinstance(v, dict):
        return all(storable(k) and storable(x) for k, x in v.items())
    return False


def local_refs_only(s):
    if isinstance(s, dict):
        for k, v in s.items():
            if k in ("$ref", "$dynamicRef", "$recursiveRef") and (not isinstance(v, str) or not v.startswith("#")):
                return False
            if not local_refs_only(v):
                return False
    elif isinstance(s, list):
        return all(local_refs_only(x) for x in s)
    return True


def class_escapes(s):
    """Whether a pattern of s uses \\d \\w \\s \\b (or their negations): Python's
    re, which jsonschema uses, reads them over Unicode, ECMA 262 (JSON
    Schema's, quire's) does not (\\s differs in \\x1c-\\x1f and \\x85)."""
    pats = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "pattern" and isinstance(v, str):
                    pats.append(v)
                if k == "patternProperties" and isinstance(v, dict):
                    pats.extend(v.keys())
                if k not in ("enum", "const"):
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(s)
    return any(re.search(r"\\[dDwWsSbB]", p) for p in pats)


def plain_ascii(v):
    """Whether every string and key of v is printable ASCII."""
    if isinstance(v, str):
        return all(" " <= ch <= "~" for ch in v)
    if isinstance(v, list):
        return all(plain_ascii(x) for x in v)
    if isinstance(v, dict):
        return all(plain_ascii(k) and plain_ascii(x) for k, x in v.items())
    return True


def refs_under_tests(s, under=False):
    """Whether a $ref sits under not / if / propertyNames / contains."""
    if isinstance(s, dict):
        for k, v in s.items():
            if under and k == "$ref":
                return True
            if refs_under_tests(v, under or k in TESTS):
                return True
    elif isinstance(s, list):
        return any(refs_under_tests(x, under) for x in s)
    return False


def closed(s, draft):
    """s with every listing schema closed (see the module's comment)."""
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k in TESTS or k in ("enum", "const"):
            out[k] = v
        elif k in MAPS and isinstance(v, dict):
            out[k] = {n: closed(x, draft) for n, x in v.items()}
        elif k in LISTS and isinstance(v, list):
            out[k] = [closed(x, draft) for x in v]
        elif k in ONE or (k == "items" and isinstance(v, dict)):
            out[k] = closed(v, draft)
        elif k == "items" and isinstance(v, list):
            out[k] = [closed(x, draft) for x in v]
        else:
            out[k] = v
    if (isinstance(out.get("properties"), dict) or isinstance(out.get("patternProperties"), dict)) and not (
        "additionalProperties" in out or "unevaluatedProperties" in out
    ):
        out["additionalProperties"] = False
    if draft == "draft2020-12" and isinstance(out.get("prefixItems"), list) and "items" not in out:
        out["items"] = False
    if draft != "draft2020-12" and isinstance(out.get("items"), list) and "additionalItems" not in out:
        out["additionalItems"] = False
    return out


def validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def generated(schema, n):
    """Up to n distinct valid instances from hypothesis-jsonschema (derandomized)."""
    try:
        strategy = hypothesis_jsonschema.from_schema(copy.deepcopy(schema))  # it changes what it is given
    except Exception:
        return []
    found = []

    @settings(max_examples=n * 4, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x):
        if len(found) < n and x not in found:
            found.append(x)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            collect()
    except Exception:
        pass
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", help="the test suite's tests/ folder (jsonschema's sdist: json/tests)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "schema_suite",
                                                   "suite.json"))
    ap.add_argument("--generate", type=int, default=3, help="instances generated a schema (default 3)")
    a = ap.parse_args()
    cases, seen = [], set()
    counts = {"schemas": 0, "suite": 0, "generated": 0, "strict": 0, "skipped": 0}
    for draft, uri in DRAFTS.items():
        root = os.path.join(a.tests, draft)
        files = []
        for d, _, fs in os.walk(root):
            files += [os.path.join(d, f) for f in fs if f.endswith(".json")]
        for path in sorted(files):
            name = os.path.relpath(path, a.tests)
            with open(path, encoding="utf-8") as f:
                groups = json.load(f)
            for gi, group in enumerate(groups):
                schema = group["schema"]
                if isinstance(schema, dict) and "$schema" not in schema:
                    schema = dict(schema, **{"$schema": uri})
                if not local_refs_only(schema) or not storable(schema) or (isinstance(schema, dict) and schema.get("$schema") != uri):
                    counts["skipped"] += 1
                    continue
                # quire asserts formats (schema.h): the suite's instances valid
                # only because draft 2019-09 on take format as an annotation
                # are left out, as are generated ones jsonschema refuses.
                try:
                    v = validator(schema)
                    insts = [t["data"] for t in group["tests"] if t["valid"] and v.is_valid(t["data"])]
                    nsuite = len(insts)
                    ecma = class_escapes(schema)
                    insts += [x for x in generated(schema, a.generate) if v.is_valid(x) and (not ecma or plain_ascii(x))]
                except Exception:
                    continue
                try:
                    sv = None if refs_under_tests(schema) else validator(closed(schema, draft))
                except Exception:
                    sv = None
                valid, strict = [], []
                for i, x in enumerate(insts):
                    x = normal(x)
                    if not storable(x):
                        continue
                    key = json.dumps([schema, x], sort_keys=True)
                    if key in seen:
                        continue
                    seen.add(key)
                    try:
                        ok = sv is not None and sv.is_valid(x)
                    except Exception:
                        ok = False
                    if ok:
                        strict.append(len(valid))
                    valid.append(x)
                    counts["suite" if i < nsuite else "generated"] += 1
                if not valid:
                    continue
                counts["schemas"] += 1
                counts["strict"] += len(strict)
                cases.append({"id": "%s#%d" % (name, gi), "schema": schema, "valid": valid, "strict": strict})
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("%s: %d schemas, %d suite instances, %d generated, %d marked strict; %d schemas left out (remote refs, numbers past int64)"
          % (a.out, counts["schemas"], counts["suite"], counts["generated"], counts["strict"], counts["skipped"]),
          file=sys.stderr)
    print("jsonschema %s, hypothesis %s, hypothesis-jsonschema %s" % (
        metadata.version("jsonschema"), metadata.version("hypothesis"), metadata.version("hypothesis-jsonschema")),
        file=sys.stderr)


if __name__ == "__main__":
    main()
