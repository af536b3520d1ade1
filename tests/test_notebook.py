"""docs/tour.ipynb runs top to bottom through a real Jupyter kernel (nbclient, ipykernel), as a
learner would run it: a failing cell fails the suite. Its outputs are read for what each part of
the tour promises: a sample, a trace, the change an intervention makes, attention maps drawn inline."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import need

TOUR = Path(__file__).resolve().parents[1] / "docs" / "tour.ipynb"


@pytest.mark.slow
def test_the_tour_runs_top_to_bottom_in_a_real_kernel(tmp_path):
    nbformat, nbclient = need("nbformat"), need("nbclient")
    need("ipykernel")
    need("matplotlib")
    notebook = nbformat.read(TOUR, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    text = ["".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in c.outputs) for c in code]
    assert any("ROMEO:" in t and "Run(" in t for t in text)  # the sample, under the loaded run
    assert any("tensor(0.)" in t for t in text)  # residual1 = input + attention, exactly
    assert any("KL(before || after)" in t for t in text)
    assert any("= the sum of" in t and "error" in t for t in text)  # the attribution
    assert any("last block's output at the last position restores 1.0" in t for t in text)  # patching, exactly
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs)  # the attention maps
    assert (tmp_path / "runs" / "tour" / "checkpoint.pt").is_file()
    # Remove it and watch: each experiment printed its measurement
    moved = next(t for t in text if "block 0's output at the last token moves by" in t)
    assert float(moved.rsplit("moves by", 1)[1].split()[0]) < 1e-5  # the same set, in another order
    assert "positions = 'none': reverse Accuracy(" in moved and "positions = 'learned': reverse Accuracy(" in moved
    assert any("ffn_hidden = 0: add Accuracy(" in t for t in text)
    depth = next(t for t in text if "residual = False: block 0 / block 5 gradient norm" in t)
    assert "residual = True: block 0 / block 5 gradient norm" in depth
    assert any("norm = 'none': residual stream norm" in t for t in text)
