"""Every notebook in notebooks/ executes without error (CI runs this)."""
import os
import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.stem for p in NOTEBOOKS] == ["01_quickstart", "02_backward_graph", "03_checkpointing", "04_resnet", "05_char_gpt",
                                          "06_from_torch"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, monkeypatch):
    # the kernel is a subprocess: let it import this checkout's jitgraph even when it is not installed
    root = str(path.parent.parent)
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()   # raises on any cell error
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any(o.output_type in ("display_data", "execute_result")
               for c in nb.cells if c.cell_type == "code" for o in c.outputs)
