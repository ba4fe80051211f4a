"""CLI: `interference fit` and `interference show` print a fitted model readably: gpulet's
five coefficients, the modeled self term of each measured point as a grid (model and batch
by partition) and the held-out error beside gpulet's form and no model, each labelled."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from greenctl.data.bundled import path_of


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    """A store with the gpulet reference imported (no model fitted yet)."""
    from greenctl.data.gpulet_import import import_gpulet
    from greenctl.data.store import open_store

    path = tmp_path_factory.mktemp("interference") / "g.db"
    with open_store(path) as store:
        import_gpulet(store, path_of("gpulet"))
    return str(path)


def _grid_rows(output: str) -> dict[tuple[str, int], list[str]]:
    """The self-term grid's rows: (model, batch) -> the cells, as printed."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 7 and cells[1].isdigit():
            rows[(cells[0], int(cells[1]))] = cells[2:]
    return rows


def test_show_prints_every_point_in_one_grid_labelled_modeled(cli, db):
    fit = cli("interference", "fit", "--db", db)
    assert fit.exit_code == 0, fit.output
    r = cli("interference", "show", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    r = cli("interference", "show", "--db", db)
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    out = r.output
    flat = " ".join(out.split())  # titles and captions wrap at the terminal's width
    assert "modeled factor = s(point) + c2 L2_other + c4 DRAM_other" in flat
    assert "modeled self term s of 105 measured points" in flat
    assert len(out.splitlines()) < 80  # 105 points x 3 numbers would be 320 rows
    # every measured point's term, in its model/batch row and partition column
    names, coef = doc["features"], doc["coefficients"]
    grid = _grid_rows(out)
    header = re.search(r"┃ model\s*┃ batch\s*┃(.*)┃", out)
    assert header is not None
    parts = [int(h.strip().removesuffix(" %")) for h in header.group(1).split("┃")]
    assert parts == [20, 40, 50, 60, 80]
    for i in range(5, len(coef), 3):
        model, b, p = names[i].removesuffix(" l2_self").rsplit(":", 2)
        assert grid[(model, int(b[1:]))][parts.index(int(p[1:]))] == f"{coef[i + 2]:.3f}"
    assert len(grid) == 21 and sum(len(v) for v in grid.values()) == 105
    # gpulet's coefficients with what each multiplies, the errors as percentages
    for n, c in enumerate(coef[:5], start=1):
        assert re.search(rf"│ c{n} │ .* │ {re.escape(f'{c:+.4f}')} │", out)
    err = doc["errors"]
    within = [err["within_gpulet_10_26pct"], err["linear_within_gpulet_10_26pct"]]
    assert re.search(
        rf"share within 10\.26 % │ {within[0] * 100:.1f} %\s*│ {within[1] * 100:.1f} %", out
    )
    assert f"{err['no_model_p90'] * 100:.1f} %" in out
    assert "held-out error of the modeled latency: 735 of 3,675 measured" in flat
    assert within[0] >= 0.9


def test_fit_prints_what_show_prints_for_its_model(cli, db):
    fit = cli("interference", "fit", "--db", db, "--seed", "3")
    assert fit.exit_code == 0, fit.output
    model_id = re.search(r"interference model (\d+) \(self-point", fit.output)
    assert model_id is not None
    show = cli("interference", "show", model_id.group(1), "--db", db)
    assert show.exit_code == 0
    assert _grid_rows(fit.output) == _grid_rows(show.output) != {}
    tail = show.output[show.output.index("held-out error") :]
    assert tail in fit.output


def test_a_five_coefficient_model_prints_gpulets_form_alone(cli, db, tmp_path):
    import shutil

    from greenctl.data.gpulet_import import save_interference_model
    from greenctl.data.store import open_store

    path = Path(tmp_path) / "linear.db"
    shutil.copy(db, path)
    with open_store(path) as store:
        model_id = save_interference_model(
            store,
            coefficients=[0.5, 0.4, 0.3, 0.2, 1.0],
            features=["l2_self", "l2_other", "dram_self", "dram_other", "intercept"],
            n_train=80,
            n_test=20,
            errors={"p90": 0.3, "within_gpulet_10_26pct": 0.5},
            source="test",
        )
    r = cli("interference", "show", str(model_id), "--db", str(path))
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    flat = " ".join(r.output.split())
    assert "modeled factor = c1 L2_self + c2 L2_other + c3 DRAM_self" in flat
    assert "self term" not in r.output and _grid_rows(r.output) == {}
    assert re.search(r"share within 10\.26 % │ 50\.0 %\s*│ -\s*│ -", r.output)
