"""notebooks/advantage_collapse.ipynb executes headless (its own cells assert Proposition 1 and the toy result)."""

import os
import pathlib

import nbclient  # the [test] extra installs nbformat, nbclient and ipykernel; a missing one is a failure
import nbformat
import pytest

pytestmark = pytest.mark.slow  # executes the notebook in a kernel subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "advantage_collapse.ipynb"


def test_advantage_collapse_notebook_runs(monkeypatch):
  # The kernel is a subprocess: it inherits these, so it imports this checkout and draws without a display.
  monkeypatch.setenv("MPLBACKEND", "Agg")
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  for cell in nb.cells:
    if cell.cell_type == "code":
      cell.outputs = []  # stale committed outputs must not satisfy the checks below
  client = nbclient.NotebookClient(
    nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
  )
  client.execute()  # raises CellExecutionError if any cell (including its asserts) fails
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  figures = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(figures) == 2, "expected the Proposition 1 plot and the training plot"
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "top style=balanced" in text and "top style=verbose" in text
