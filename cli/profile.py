"""``greenctl profile``: measure variants, list/show profiles, import/export them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Annotated, Any

import typer
from greenctl.cli.common import err_console, print_json, render_table, store_for
from greenctl.cli.options import DbOpt, JsonOpt, ModelFilterOpt, VariantFilterOpt
from greenctl.cli.profile_llm import register as register_llm
from greenctl.data.emulation import compare_emulated
from greenctl.data.errors import InputError
from greenctl.data.records import MPS_EMULATED, estimate_caption, is_estimate
from greenctl.profiler.energy import model_caption
from greenctl.profiler.models import model_file
from greenctl.profiler.options import UserModelSpec, parse_profile_options
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

profile_app = typer.Typer(
    help="Measure variants on this machine's CPUs/GPUs/MIG/MPS (no command: measure, by "
    "default the tiny family on cpu:1, store and list); list, show, import, export profiles.",
    invoke_without_command=True,
)


MeasureVariantOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--variant", help="Variant(s) to measure (repeat or comma-separate), e.g. resnet18."
    ),
]
FamilyOpt = Annotated[
    str | None,
    typer.Option("--model", help="Measure a whole family (resnet, tiny, or a stored one)."),
]
CpusOpt = Annotated[
    str,
    typer.Option(
        "--cpus",
        help="CPU core counts, each a cpu:N resource; 'none' for no CPU points (with --gpus).",
    ),
]
GpusOpt = Annotated[
    bool, typer.Option("--gpus", help="Also every GPU, MIG instance and MPS share (NVML).")
]
BatchOpt = Annotated[str, typer.Option("--batch", help="Batch sizes.")]
DurationOpt = Annotated[
    float | None,
    typer.Option("--duration", help="Seconds to measure each point (default 1).", min=0.0),
]
RequestsOpt = Annotated[
    int | None, typer.Option("--requests", help="Requests to measure each point instead.")
]
WarmupOpt = Annotated[
    int, typer.Option("--warmup", help="Un-timed warm-up batches per point.", min=0)
]
MpsOpt = Annotated[
    str | None,
    typer.Option(
        "--mps",
        help="MPS active-thread percentages (default 25,50,100 when an MPS daemon runs "
        "already; on the daemon --emulate-mig starts, only those given).",
    ),
]
EmulateMigOpt = Annotated[
    bool,
    typer.Option(
        "--emulate-mig",
        help="With --gpus: also emulate every MIG slice of each whole GPU as an MPS "
        "share (1g of 7 = 14 %), stored as mig:PROFILE labelled mps-emulated; starts "
        "an MPS control daemon for the run unless one runs.",
    ),
]
ModelPathOpt = Annotated[
    str | None,
    typer.Option(
        "--model-path",
        help="Your model: module:callable returning an nn.Module, or a TorchScript file.",
    ),
]
InputShapeOpt = Annotated[
    str | None,
    typer.Option("--input-shape", help="Input of one request for --model-path, e.g. 3,224,224."),
]
AccuracyOpt = Annotated[
    float | None, typer.Option("--accuracy", help="Accuracy of --model-path (0..1).")
]
NameOpt = Annotated[str | None, typer.Option("--name", help="Variant name for --model-path.")]
WeightsOpt = Annotated[
    str | None,
    typer.Option("--weights", help="State dict for a module:callable model (weights only)."),
]


@profile_app.callback(invoke_without_command=True)
def profile_measure(
    ctx: typer.Context,
    variant: MeasureVariantOpt = None,
    model: FamilyOpt = None,
    cpus: CpusOpt = "1",
    gpus: GpusOpt = False,
    batch: BatchOpt = "1,2,4,8",
    duration: DurationOpt = None,
    requests: RequestsOpt = None,
    warmup: WarmupOpt = 3,
    mps: MpsOpt = None,
    emulate_mig: EmulateMigOpt = False,
    model_path: ModelPathOpt = None,
    input_shape: InputShapeOpt = None,
    accuracy: AccuracyOpt = None,
    name: NameOpt = None,
    weights: WeightsOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure variants on this machine (default: the tiny family on cpu:1), store, list."""
    if ctx.invoked_subcommand is not None:
        _hand_down(ctx, ctx.invoked_subcommand)
        return
    from greenctl.profiler.harness import prepare_profile, profile  # numpy: not for `--help`

    user = UserModelSpec(model_path, input_shape, accuracy, name, weights)
    options = parse_profile_options(
        variants=variant or [], model=model, cpus=cpus, gpus=gpus, batch=batch,
        duration=duration, requests=requests, warmup=warmup, mps=mps,
        emulate_mig=emulate_mig, user=user,
    )  # fmt: skip
    # checked against the store as it is (nothing written), so a refused run leaves no trace
    with store_for(db, create=False, missing_ok=True) as store:
        prepared = prepare_profile(store, options)
    with store_for(db) as store, _progress_bar() as progress:
        result = profile(store, prepared=prepared, progress=progress)
    profiles = [p for p, _hw in result.profiles]
    if json_out:
        print_json(
            {
                "variants": [asdict(v) for v in result.variants],
                "profiles": [asdict(p) for p in profiles],
                "wall_s": result.wall_s,
                "notes": result.notes,
            }
        )
        return
    render_profiles(
        profiles, f"Measured {len(profiles)} point(s) in {result.wall_s:.1f} s (stored)"
    )
    for note in result.notes:
        err_console.print(note, markup=False, highlight=False)


@contextmanager
def _progress_bar() -> Iterator[Callable[[str, float], None]]:
    """A transient progress bar on stderr, as the ``progress(message, fraction)`` callback
    the profiler reports to."""
    with Progress(
        TextColumn("{task.description}", style="progress.description", markup=False),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("profiling", total=1.0)

        def progress(message: str, fraction: float) -> None:
            bar.update(task, completed=fraction, description=message)

        yield progress


# Options of `profile` that also mean something to a subcommand that has an option of the same
# name: `profile --json list` is `profile list --json`, `profile --model resnet export` filters.
_HANDED_DOWN = ("db", "json_out", "model", "variant")


def _hand_down(ctx: typer.Context, name: str) -> None:
    """Apply the `profile` options given before subcommand ``name`` to it, or refuse them.

    --db, --json, --model and --variant become the subcommand's own option of that name
    (its own flag, given after it, still wins); the options that only measure, and any
    option the subcommand lacks, are an error (exit 2) rather than silently ignored.
    """
    sub = ctx.command.get_command(ctx, name)  # type: ignore[attr-defined]
    own = {p.name: p for p in sub.params if p.param_type_name == "option"} if sub else {}
    # compared by name: typer >= 0.24 vendors click, so click's own enum is another class
    given = {
        p.name: p
        for p in ctx.command.params
        if p.name and getattr(ctx.get_parameter_source(p.name), "name", "") == "COMMANDLINE"
    }
    handed: dict[str, Any] = {}
    for key, param in given.items():
        flag = param.opts[0]
        value = ctx.params[key]
        if (
            key in _HANDED_DOWN
            and key in own
            and not (isinstance(value, list) and len(value) != 1 and not own[key].multiple)
        ):
            if isinstance(value, list) and not own[key].multiple:
                value = value[0]
            handed[key] = value
            continue
        raise InputError(
            f"`greenctl profile {flag}` does not apply to `profile {name}`"
            + ("" if key in _HANDED_DOWN else f": {flag} is an option of measuring"),
            hint=f"put options after the subcommand (`greenctl profile {name} --help` lists "
            f"them), or leave out `{name}` to measure",
        )
    if handed:
        ctx.default_map = {**(ctx.default_map or {}), name: handed}


@profile_app.command("list")
def profile_list(
    model: ModelFilterOpt = None,
    variant: VariantFilterOpt = None,
    resource: Annotated[
        str | None, typer.Option("--resource", help="Only this resource label.")
    ] = None,
    all_rows: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Every stored row (older and lower-ranked ones too), the one the planners "
            "use marked.",
        ),
    ] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List the profile the planners use of every (variant, resource, batch) point.

    That is the newest row of the point's best source: real measurements and imports,
    then MPS-emulated, then synthetic rows (a synthetic or emulated row stored after a
    real measurement does not replace it). --all lists every row.
    """
    with store_for(db, create=False) as store:
        if model is not None:
            store.require_family(model)
        if variant is not None:
            store.get_variant(variant)  # NotFoundError naming the known variants
        profiles = store.latest_profiles(family=model, variant=variant, resource=resource)
        history = (
            store.profile_history(family=model, variant=variant, resource=resource)
            if all_rows
            else None
        )
    if history is not None:
        used = {p.id for p in profiles}
        if json_out:
            print_json([{**asdict(p), "used": p.id in used} for p in history])
            return
        render_profiles(
            history,
            "Profiles (every row; used: the row of its point the planners use)",
            used=used,
        )
        return
    if json_out:
        print_json([asdict(p) for p in profiles])
        return
    render_profiles(profiles, "Profiles (the row of each point the planners use)")


def _modeled_caption() -> str:

    return model_caption()


def render_profiles(profiles: list[Any], title: str, *, used: set[Any] | None = None) -> None:
    """The profile table of `profile list` (also shown after measuring).

    Load-tested points add their capacity and its SLO: without them rows of one point tested
    at several SLOs would look like duplicates. With ``used`` (the ids of the rows the
    planners use; `profile list --all`) every row shows its source, time and whether it is
    used.
    """
    capacity = any(p.capacity_slo_ms is not None for p in profiles)
    history = used is not None
    estimates = history or any(is_estimate(p.source) for p in profiles)  # a source column
    headers = [
        "variant",
        "resource",
        "batch",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "req/s",
        *(["cap req/s", "cap SLO ms"] if capacity else []),
        "power W",
        "J/req",
        "energy",
        "hardware",
        *(["source"] if estimates else []),
        *(["created_at", "used"] if history else []),
    ]
    render_table(
        title,
        headers,
        _profile_cells(profiles, headers, used=used or set()),
        caption=_captions(profiles),
    )


# Each column of a profile table, defined once: its header and the value it shows. The
# tables pick their headers and take the cells from here, so a value cannot land under
# another column's header.
_PROFILE_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "variant": lambda p: p.variant,
    "resource": lambda p: p.resource,
    "batch": lambda p: p.batch,
    "p50 ms": lambda p: p.latency_p50_ms,
    "p95 ms": lambda p: p.latency_p95_ms,
    "p99 ms": lambda p: p.latency_p99_ms,
    "req/s": lambda p: p.throughput_rps,
    "cap req/s": lambda p: p.capacity_rps,
    "cap SLO ms": lambda p: p.capacity_slo_ms,
    "power W": lambda p: p.power_w,
    "J/req": lambda p: p.energy_j,
    "energy": lambda p: p.energy_method,
    "hardware": lambda p: p.hardware,
    "samples": lambda p: p.samples,
    "source": lambda p: p.source,
    "created_at": lambda p: p.created_at,
}


def _profile_cells(profiles: list[Any], headers: list[str], *, used: set[Any]) -> list[list[Any]]:
    """The rows of a profile table with these headers (``used``: the ids marked "yes")."""
    columns = {**_PROFILE_COLUMNS, "used": lambda p: "yes" if p.id in used else ""}
    return [[columns[h](p) for h in headers] for p in profiles]


def _captions(profiles: list[Any]) -> str | None:
    """What a profile table's caption says: modeled energy, and rows that are estimates
    (MPS-emulated or synthetic slices; the rule and its words live in data.records)."""
    lines = [
        _modeled_caption() if any(p.energy_method == "modeled" for p in profiles) else None,
        estimate_caption(p.source for p in profiles),
    ]
    return "\n".join(line for line in lines if line) or None


@profile_app.command("show")
def profile_show(
    variant: Annotated[str, typer.Argument(help="Variant name, for example resnet50.")],
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show one variant and its latest profiles."""
    with store_for(db, create=False) as store:
        v = store.get_variant(variant)
        profiles = store.latest_profiles(variant=variant)
    file = model_file(v)  # the ONNX, TorchScript or weights file it runs
    if json_out:
        print_json({"variant": asdict(v), "file": file, "profiles": [asdict(p) for p in profiles]})
        return
    estimates = any(is_estimate(p.source) for p in profiles)
    facts = [v.accuracy, v.accuracy_metric, v.accuracy_source, v.params, v.memory_mb]
    render_table(
        f"{v.name} ({v.family})",
        ["accuracy", "metric", "source", "params", "memory MB", "load s", "file"],
        [[*facts, v.load_time_s, file]],
    )
    headers = [
        "resource",
        "batch",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "req/s",
        "power W",
        "J/req",
        "energy",
        "cap req/s",
        "cap SLO ms",
        "samples",
        "created_at",
        *(["source"] if estimates else []),
    ]
    render_table(
        None,
        headers,
        _profile_cells(profiles, headers, used=set()),
        caption=_captions(profiles),
    )


@profile_app.command("compare-emulated")
def profile_compare_emulated(
    model: ModelFilterOpt = None,
    variant: VariantFilterOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Compare MPS-emulated MIG slices with measurements of the same GPU model.

    Each emulated slice (greenctl profile --gpus --emulate-mig) beside the whole GPU
    (gpu:MODEL), the measured MPS share at the nearest percentage (mps:PCT) and a measured
    MIG instance of the same profile: p50, throughput and energy ratios, emulated / measured.
    """
    with store_for(db, create=False) as store:
        if model is not None:
            store.require_family(model)
        if variant is not None:
            store.get_variant(variant)
        report = compare_emulated(store, family=model, variant=variant)
    if json_out:
        print_json(report.to_dict())
        return

    def pair(ref: Any) -> list[Any]:
        if ref is None:
            return [None, None]
        return [ref.p50_ratio, ref.throughput_ratio]

    render_table(
        "MPS-emulated MIG slices against measurements (ratios: emulated / measured)",
        [
            "variant",
            "batch",
            "slice",
            "MPS %",
            "p50 ms",
            "req/s",
            "gpu p50 x",
            "gpu req/s x",
            "mps share",
            "mps p50 x",
            "mps req/s x",
            "mig p50 x",
            "mig req/s x",
            "hardware",
        ],
        [
            [
                r.variant,
                r.batch,
                r.resource,
                r.mps_percentage,
                r.latency_p50_ms,
                r.throughput_rps,
                *pair(r.whole_gpu),
                r.mps.resource if r.mps else None,
                *pair(r.mps),
                *pair(r.mig),
                r.hardware,
            ]
            for r in report.rows
        ],
        caption="p50 x above 1: the emulated slice is slower; req/s x below 1: it serves "
        "less. gpu: the whole GPU without MPS; mps: a measured MPS share at the nearest "
        "percentage; mig: a measured MIG instance of the same profile.\n"
        + (estimate_caption([MPS_EMULATED]) or ""),
    )

    def spread(stats: dict[str, float] | None) -> str | None:
        if stats is None:
            return None
        return f"{stats['median']:.3g} ({stats['min']:.3g}-{stats['max']:.3g})"

    render_table(
        "Summary: median (min-max) of the ratios",
        ["against", "pairs", "p50 x", "req/s x", "J/req x"],
        [
            [
                name,
                s["pairs"],
                spread(s["p50_ratio"]),
                spread(s["throughput_ratio"]),
                spread(s["energy_ratio"]),
            ]
            for name, s in report.summary.items()
        ],
    )
    for note in report.notes:
        err_console.print(f"note: {note}", markup=False, highlight=False)


register_llm(profile_app, _progress_bar)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
