"""``greenctl variants generate``: make, evaluate, profile and store variants of one model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Annotated, Any

import typer
from greenctl.cli.common import (
    DbOpt,
    JsonOpt,
    check_writable_folder,
    err_console,
    print_json,
    render_table,
    say,
    store_for,
    undone_on_failure,
)
from greenctl.cli.profile import (
    BatchOpt,
    CpusOpt,
    DurationOpt,
    GpusOpt,
    InputShapeOpt,
    RequestsOpt,
    WarmupOpt,
    WeightsOpt,
    render_profiles,
)
from greenctl.profiler.options import parse_profile_options

variants_app = typer.Typer(
    no_args_is_help=True,
    help="Generate variants of your own model (ONNX Runtime, int8, half precision), each "
    "with its accuracy measured and its profile stored.",
)


@contextmanager
def _status() -> Iterator[Callable[[str, float], None]]:
    """A transient status line on stderr, as the ``progress(message, fraction)`` callback."""
    with err_console.status("generating") as status:

        def progress(message: str, fraction: float) -> None:
            status.update(f"{message} ({fraction:.0%})")

        yield progress


@variants_app.command("generate")
def variants_generate(
    model_path: Annotated[
        str,
        typer.Option(
            "--model-path",
            help="Your model: module:callable returning an nn.Module, or a TorchScript file.",
        ),
    ],
    name: Annotated[
        str, typer.Option("--name", help="Family name; variants are NAME-torch, NAME-onnx, ...")
    ],
    eval_spec: Annotated[
        str,
        typer.Option(
            "--eval",
            help="MOD:eval returning an iterable of (inputs, labels) batches (tensors or "
            "arrays) to measure accuracy on.",
        ),
    ],
    input_shape: InputShapeOpt = None,
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            help="MOD:fn(outputs, labels) -> accuracy in 0..1 (default: share of "
            "argmax(outputs) == labels).",
        ),
    ] = None,
    formats: Annotated[
        str | None,
        typer.Option(
            "--formats",
            help="Formats to make, of torch, onnx, int8, fp16, bf16 (default: every one this "
            "machine runs; fp16/bf16 with --gpus).",
        ),
    ] = None,
    weights: WeightsOpt = None,
    cpus: CpusOpt = "1",
    gpus: GpusOpt = False,
    batch: BatchOpt = "1,2,4,8",
    duration: DurationOpt = None,
    requests: RequestsOpt = None,
    warmup: WarmupOpt = 3,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Make NAME-torch, NAME-onnx, NAME-int8 (and NAME-fp16/bf16 on a GPU) from your model,
    measure each one's accuracy on --eval, profile each like `greenctl profile` and store
    them; generated files live beside the store. A format that fails is skipped with its
    reason."""
    from greenctl.profiler.variants_gen import generate, models_dir, prepare_generate

    options = parse_profile_options(
        cpus=cpus, gpus=gpus, batch=batch, duration=duration, requests=requests, warmup=warmup
    )
    # the store and its models folder are checked first: a refusal comes before any work
    with store_for(db) as store:
        folder = check_writable_folder(models_dir(store.path), option="--db (its models folder)")
        plan = prepare_generate(
            name=name, model_path=model_path, input_shape=input_shape, eval_spec=eval_spec,
            options=options, metric=metric, formats=formats, weights=weights,
        )  # fmt: skip
        with undone_on_failure(folder), _status() as progress:
            result = generate(store, plan, folder=folder, progress=progress)
    if json_out:
        print_json(
            {
                "variants": [_made_doc(g) for g in result.made],
                "skipped": [{"variant": n, "reason": why} for n, why in result.skipped],
                "profiles": [asdict(p) for p in result.profiles],
                "notes": result.notes,
            }
        )
        return
    _render(result)


def _made_doc(made: Any) -> dict[str, Any]:
    """One generated variant as JSON: its record, format, file and the file's size."""
    return {**asdict(made.variant), "format": made.format, "file": made.file,
            "size_bytes": made.size_bytes}  # fmt: skip


def _render(result: Any) -> None:
    render_table(
        f"Generated {len(result.made)} variant(s) (stored)",
        ["variant", "format", "accuracy", "metric", "size MB", "file"],
        [
            [
                g.variant.name,
                g.format,
                g.variant.accuracy,
                g.variant.accuracy_metric,
                None if g.size_bytes is None else g.size_bytes / 2**20,
                g.file or g.variant.source,
            ]
            for g in result.made
        ],
    )
    render_profiles(result.profiles, "Their profiles")
    for name, why in result.skipped:
        say(("skipped", "yellow"), f" {name}: {why}", err=True, highlight=False, soft_wrap=True)
    for note in result.notes:
        err_console.print(note, markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(variants_app, name="variants")
