"""Every case of the bad-input catalogue raises a clear exception -- in a child
process, so that a crash in compiled code would fail this test, not end pytest."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from .bad_inputs import CASES

ROOT = pathlib.Path(__file__).parent.parent


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "tests.bad_inputs"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"the catalogue's process died (status {proc.returncode}):\n{proc.stderr[-3000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in rows}


def test_the_catalogue_is_large_and_complete(results):
    assert len(CASES) >= 30
    assert set(results) == {name for name, *_ in CASES}


@pytest.mark.parametrize("name,kind,pattern", [(c[0], c[2], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_case(results, name, kind, pattern):
    r = results[name]
    assert r["raised"] == kind, f"{name}: expected {kind}, got {r['raised']}: {r.get('message')}"
    assert r["is_value_error"]                       # GraphError is a ValueError
    assert re.search(pattern, r["message"]), f"{name}: message {r['message']!r} does not match {pattern!r}"
