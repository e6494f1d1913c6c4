"""The learner's notebook: stored without outputs, and every cell runs (with 2 epochs)."""

import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook extra: pip install -e '.[notebook]'")
NotebookClient = pytest.importorskip(
    "nbclient", reason="the notebook extra: pip install -e '.[notebook]'").NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "transformer.ipynb")


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


def test_notebook_calls_the_package_instead_of_redefining_it():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "import d2l_transformer as d2t" in code
    assert "class " not in code and "\ndef " not in code


@pytest.mark.slow
def test_notebook_executes(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # an extra last cell, in memory only: which Python did the kernel run?
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.prefix)"))
    monkeypatch.setenv("D2L_TRANSFORMER_EPOCHS", "2")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError if any cell fails
    prefix = nb.cells[-1].outputs[0]["text"].strip()
    assert os.path.realpath(prefix) == os.path.realpath(sys.prefix)  # this venv, not another
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.outputs)
    assert "(2, 4, 100)" in repr(nb.cells[3].outputs) and "Go . => " in outputs
    assert (tmp_path / "notebook_out" / "positional_encoding.png").exists()
