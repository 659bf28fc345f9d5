"""Shared fixtures for the end-to-end tests: the quire binary and data paths."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def quire_bin():
    b = os.environ.get("QUIRE_BIN", str(ROOT / "build" / "quire"))
    p = pathlib.Path(b)
    return str(p if p.is_absolute() else ROOT / p)


def shared_dir():
    s = os.environ.get("QUIRE_SHARED", str(ROOT.parent / "shared"))
    return pathlib.Path(s)


@pytest.fixture(scope="session")
def quire():
    b = quire_bin()
    if not os.access(b, os.X_OK):
        pytest.fail(f"quire binary not found at {b} (set QUIRE_BIN)")
    return b
