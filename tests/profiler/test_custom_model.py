"""``greenctl profile --model-path``: a user's model that fails is refused in one line."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

CONV_MODEL = """
import torch


def build():
    # expects 3x32x32 inputs: the Linear layer is sized for a 30x30 feature map
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 30 * 30, 10)
    )


def broken():
    raise ValueError("no weights file here")
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module of user models in a folder on sys.path (as PYTHONPATH would put it)."""
    (tmp_path / "greenctl_test_user_models.py").write_text(CONV_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "greenctl_test_user_models"


def _store_rows(store) -> tuple[int, int]:
    return store.db.table("variants").count, store.profile_count()


def test_input_shape_that_does_not_fit_the_model_is_one_line(cli, store, user_module):
    before = _store_rows(store)
    r = cli(
        "profile",
        "--model-path",
        f"{user_module}:build",
        "--input-shape",
        "3,9,9",
        "--requests",
        "3",
        "--batch",
        "1",
    )
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    (line,) = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert "--input-shape 3,9,9" in line and "build" in line
    assert "RuntimeError" in line and "mat1 and mat2" in line  # the model's own error
    assert "hint:" in r.output
    assert _store_rows(store) == before


def test_the_right_shape_still_measures(cli, store, user_module):
    r = cli(
        "profile",
        "--model-path",
        f"{user_module}:build",
        "--input-shape",
        "3,32,32",
        "--requests",
        "3",
        "--batch",
        "1",
        "--name",
        "conv32",
    )
    assert r.exit_code == 0, r.output
    assert [p.batch for p in store.latest_profiles(variant="conv32")] == [1]


def test_a_builder_that_raises_is_an_input_error(cli, store, user_module):
    before = _store_rows(store)
    r = cli("profile", "--model-path", f"{user_module}:broken", "--input-shape", "3,32,32")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert "ValueError: no weights file here" in r.output and f"{user_module}:broken" in r.output
    assert _store_rows(store) == before


def test_a_module_that_does_not_import_is_an_input_error(cli, store, tmp_path, monkeypatch):
    (tmp_path / "greenctl_test_syntax_error.py").write_text("def build(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cli("profile", "--model-path", "greenctl_test_syntax_error:build", "--input-shape", "3")
    assert r.exit_code == 2, r.output
    assert "SyntaxError" in r.output and "greenctl_test_syntax_error" in r.output


def test_check_first_run_maps_the_models_error():
    import torch
    from greenctl.data.errors import InputError
    from greenctl.data.records import Variant
    from greenctl.profiler.harness import check_first_run
    from greenctl.profiler.models import LoadedModel

    module = torch.nn.Linear(5, 2).eval()
    check_first_run(LoadedModel(Variant("ok", "custom"), module, (5,)))
    with pytest.raises(InputError, match=r"--input-shape 7: RuntimeError"):
        check_first_run(LoadedModel(Variant("lin", "custom"), module, (7,)))
