"""The README's tour is a working, type-checked script, and the package type-checks."""
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tour_source():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("## A tour"):text.index("## How it works")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 5
    return "\n".join(blocks)


def mypy(*args, cwd=ROOT):
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
                          *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return out.stdout


def test_readme_tour_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                  # the tour saves model.npz
    namespace = {"__name__": "tour"}
    np.random.seed(0)                            # the tour draws its data with np.random.randn
    exec(compile(tour_source(), "README-tour", "exec"), namespace)
    assert os.path.exists(tmp_path / "model.npz")
    losses = np.asarray(namespace["losses"])     # 10 epochs of 10 steps: compare epochs, not single batches
    assert losses[-10:].mean() < losses[:10].mean()


def test_readme_tour_type_checks(tmp_path):
    path = tmp_path / "tour.py"
    path.write_text(tour_source())
    assert "Success" in mypy(str(path))


def test_package_type_checks():
    assert "Success" in mypy("-p", "jitgraph")
