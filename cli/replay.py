"""``greenctl replay mix|mig|glet|geo``: the control loop over a load trace and a carbon
signal, what-if, beside baselines.

``replay`` is a group: its callback takes the options every kind shares (the traces, the
window, replan's rules, the baselines, the output) and each kind's subcommand its own planning
inputs. :class:`ReplayGroup` takes the shared options before or after the subcommand's name,
reads ``--kind K`` as the subcommand ``K`` and runs ``mix`` when neither is given. An
installed kind that replays but has no subcommand here is replayed by one command for all
such kinds (``replay K --request FILE``), on the shared options alone.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from greenctl.cli.common import (
    check_writable_folder,
    console,
    input_path_str,
    print_json,
    render_table,
    say,
    store_for,
    undone_on_failure,
)
from greenctl.cli.options import DbOpt, JsonOpt, RateOpt, RegionOpt
from greenctl.cli.plan_glet import glet_request
from greenctl.cli.plan_mig import mig_request
from greenctl.cli.plan_mix import (
    AlphaOpt,
    BetaOpt,
    BudgetOpt,
    GammaOpt,
    HeadroomOpt,
    MinAccuracyOpt,
    ObjectiveOpt,
    PercentileOpt,
    SloMsOpt,
    StrategyOpt,
    mix_request,
)
from greenctl.data.errors import InputError, shown
from greenctl.data.loop_state import REPLAN_MARGIN, REPLAN_MIN_DWELL, REPLAN_THRESHOLD
from greenctl.executor.kinds import KINDS, read_request
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

#: the subcommand of ``greenctl replay`` given neither a subcommand nor ``--kind``
DEFAULT_KIND = "mix"


# -- the group: shared options on either side of the subcommand, --kind as its alias ---------
class ReplayGroup(TyperGroup):
    """``replay``'s group: one subcommand per plan kind, the shared options anywhere.

    Before click parses, the arguments are arranged as ``[shared options] KIND [KIND's
    options]``: ``--kind K`` names the subcommand (``replay --kind glet`` is ``replay glet``),
    an option of another kind's subcommand is refused naming that subcommand, and ``--help``
    goes to the subcommand when one is named (else the group's help lists them).

    So that what the group accepts is what it declares, the group carries every kind's options
    and each subcommand the shared ones as hidden aliases: they never take a value (the
    arrangement hands each option to its command) and the help lists each option once.
    """

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        shared = [p for p in self.params if p.expose_value]  # --kind is read by arrange
        #: the command that replays an installed kind without a subcommand of its own
        self.installed = typer.main.get_command(installed_app)
        #: the shared options and each kind's own (option name -> takes a value)
        self.shared = _value_options(shared)
        self.own = {name: _value_options(c.params) for name, c in self.commands.items()}
        self.own_installed = _value_options(self.installed.params)
        every = [p for c in (*self.commands.values(), self.installed) for p in c.params]
        for command in (*self.commands.values(), self.installed):
            command.params = [*command.params, *_aliases(shared, command.params)]
        self.params = [*self.params, *_aliases(every, self.params)]

    def installed_kinds(self) -> list[str]:
        """The registered kinds that replay and have no subcommand of their own."""
        return [k for k, r in KINDS.items() if r.replay is not None and k not in self.commands]

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *self.installed_kinds()]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in self.installed_kinds():
            command = copy.copy(self.installed)
            command.name = cmd_name
        return command

    def own_options(self, name: str) -> dict[str, bool]:
        """The options of the subcommand ``name`` (an installed kind's: the shared command's)."""
        return self.own.get(name, self.own_installed)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self.arrange(ctx, args))

    def arrange(self, ctx: Any, args: list[str]) -> list[str]:
        """``args`` as ``[shared options] KIND [KIND's options]`` (class docstring)."""
        helps = set(ctx.help_option_names)
        table = {name: v for own in self.own.values() for name, v in own.items()}
        table |= self.own_installed
        table |= {**self.shared, "--kind": True}
        front: list[str] = []
        rest: list[str] = []
        helped: list[str] = []
        name: str | None = None
        kind: str | None = None
        i = 0
        while i < len(args):
            if args[i] == "--":
                rest += args[i:]
                break
            tokens, i, flag = _take(args, i, table)
            if flag is None and name is None:
                name = tokens[0]
            elif flag == "--kind":
                kind = _value_of(ctx, tokens)
            elif flag in helps:
                helped += tokens
            elif flag in self.shared:
                front += tokens
            else:
                rest += tokens
        name = self._kind(ctx, name, kind)
        if name is None and helped:
            return [*front, *helped]  # the group's help, whatever else is given
        name = name or DEFAULT_KIND
        self._refuse_other_kinds(ctx, name, rest, table)
        return [*front, name, *rest, *helped]

    def _kind(self, ctx: Any, name: str | None, kind: str | None) -> str | None:
        """The subcommand named, by its name or by ``--kind``.

        Raises:
            InputError: a name that is no installed kind that replays (they are listed).
        """
        known = [*self.commands, *self.installed_kinds()]
        for given, how in ((kind, "--kind"), (name, "replay")):
            if given is not None and given not in known:
                raise InputError(
                    f"{how} {shown(given)}: replay takes {_one_of(known)} (the installed kinds "
                    "that replay)",
                    hint=f"for example greenctl replay {known[0]} --help",
                )
        if kind is None:
            return name
        if name is not None and name != kind:
            raise InputError(
                f"--kind {kind} and the subcommand {name} disagree",
                hint=f"give one: greenctl replay {name} ...",
            )
        return kind

    def _refuse_other_kinds(
        self, ctx: Any, name: str, rest: list[str], table: dict[str, bool]
    ) -> None:
        """An option of another kind's subcommand, given to ``name``'s, is refused naming the
        subcommands it belongs to."""
        own = self.own_options(name)
        i = 0
        while i < len(rest) and rest[i] != "--":
            _, i, flag = _take(rest, i, table)
            if flag is None or flag in own:
                continue
            owners = [n for n, other in self.own.items() if flag in other]
            if owners:
                raise InputError(
                    f"{flag} is an option of {_one_of(f'replay {n}' for n in owners)}, "
                    f"not of replay {name}",
                    hint=f"greenctl replay {owners[0]} {flag} ...",
                )


def _aliases(params: Iterable[Any], beside: Iterable[Any]) -> list[Any]:
    """Hidden copies of the options of ``params`` that ``beside`` does not declare, each
    once: they take no value and reach no callback."""
    taken = set(_value_options(beside))
    out = []
    for p in params:
        names = set(_value_options([p]))
        if names and not names & taken:
            alias = copy.copy(p)
            alias.hidden, alias.expose_value, alias.required = True, False, False
            out.append(alias)
            taken |= names
    return out


def _value_options(params: Iterable[Any]) -> dict[str, bool]:
    """The option names of click ``params`` -> whether the option takes a value."""
    out: dict[str, bool] = {}
    for p in params:
        if getattr(p, "param_type_name", None) == "option":
            takes = not (p.is_flag or p.count)
            out.update({name: takes for name in (*p.opts, *p.secondary_opts)})
    return out


def _take(args: list[str], i: int, table: dict[str, bool]) -> tuple[list[str], int, str | None]:
    """The tokens of the argument at ``args[i]`` (an option with its value, or one
    positional), the index after them and the option's name (None: a positional)."""
    token = args[i]
    if not token.startswith("-") or token == "-":
        return [token], i + 1, None
    if token.startswith("--") and "=" in token:
        return [token], i + 1, token.partition("=")[0]
    if token in table:
        end = min(i + (2 if table[token] else 1), len(args))
        return args[i:end], end, token
    if not token.startswith("--") and table.get(token[:2]):
        return [token], i + 1, token[:2]  # a short option with its value attached: -rCISO
    return [token], i + 1, token


def _value_of(ctx: Any, tokens: list[str]) -> str:
    """The value of an option given as ``--name VALUE`` or ``--name=VALUE``."""
    if len(tokens) == 2:
        return tokens[1]
    name, sep, value = tokens[0].partition("=")
    if not sep:
        ctx.fail(f"Option '{name}' requires an argument.")
    return value


def _one_of(names: Iterable[str]) -> str:
    items = list(names)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


replay_app = typer.Typer(cls=ReplayGroup)
#: the one command of the installed kinds without a subcommand (:meth:`ReplayGroup.get_command`)
installed_app = typer.Typer()


# -- the shared options (replay's own) --------------------------------------------------------
KindOpt = Annotated[
    str | None,
    typer.Option(
        "--kind",
        help="The subcommand K (replay --kind K is replay K): the kind to replay.",
        metavar="K",
        expose_value=False,  # ReplayGroup reads it before parsing
    ),
]

LoadTraceOpt = Annotated[
    str | None,
    typer.Option(
        "--load-trace",
        help="Requests per second, one value per second (gzip or not), or bundled:NAME; "
        "mix, mig, glet (geo reads --demand).",
        parser=input_path_str,
        metavar="FILE",
    ),
]

PlanOpt = Annotated[
    str | None,
    typer.Option("--plan", help="Start from this stored plan (id); its kind is replayed."),
]

CarbonIntensityOpt = Annotated[
    float | None,
    typer.Option(
        "--carbon-intensity",
        help="Constant gCO2/kWh when no --region or --carbon-trace (default 400).",
    ),
]

CarbonTraceOpt = Annotated[
    str | None,
    typer.Option(
        "--carbon-trace",
        help="Carbon signal file (any format carbon import reads), or bundled:NAME.",
        parser=input_path_str,
        metavar="FILE",
    ),
]

StartOpt = Annotated[
    str | None,
    typer.Option("--from", help="Offset into the traces (36h, 90m) or an ISO time."),
]

HoursOpt = Annotated[
    float | None, typer.Option("--hours", help="Hours to replay (default: the rest).")
]

EveryOpt = Annotated[str, typer.Option("--every", help="Replan interval (60s, 5m).")]

ThresholdOpt = Annotated[
    float, typer.Option("--threshold", help="As replan: carbon signal move that acts.")
]

MarginOpt = Annotated[float, typer.Option("--margin", help="As replan: objective gain that acts.")]

MinDwellOpt = Annotated[
    str,
    typer.Option(
        "--min-dwell",
        help="As replan: no change sooner than this, unless the running plan cannot "
        "carry the forecast load.",
    ),
]

ForecasterOpt = Annotated[
    str | None,
    typer.Option(
        "--forecaster",
        "-f",
        help="last | moving-max | seasonal-naive | a saved name (default: greenctl's "
        "default forecaster, named in the result).",
    ),
]

BaselineOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--baseline",
        help="base | co2opt | vpa | infaas | infadapter | msplus | none; repeatable (default base, "
        "co2opt, vpa); "
        "glet: base; geo: offline | nearest | glb-energy (default offline, nearest).",
    ),
]

WueOpt = Annotated[
    float | None, typer.Option("--wue", help="Direct water L/kWh (else water not modeled).")
]

EwifOpt = Annotated[
    float | None, typer.Option("--ewif", help="Indirect water L/kWh of electricity.")
]

OutputOpt = Annotated[
    str | None,
    typer.Option("-o", "--output", help="Folder for replay.json, CSVs and replay.png."),
]


@dataclass(frozen=True)
class ReplayCommon:
    """The options every kind's replay shares (``replay``'s own), handed to its subcommand."""

    load_trace: str | None = None
    plan: str | None = None
    carbon_intensity: float | None = None
    region: str | None = None
    carbon_trace: str | None = None
    start: str | None = None
    hours: float | None = None
    every: str = "60s"
    threshold: float = REPLAN_THRESHOLD
    margin: float = REPLAN_MARGIN
    min_dwell: str = REPLAN_MIN_DWELL
    forecaster: str | None = None
    baseline: tuple[str, ...] = ()
    wue: float | None = None
    ewif: float | None = None
    output: str | None = None
    json_out: bool = False
    db: str | None = None


@replay_app.callback()
def replay_group(
    ctx: typer.Context,
    kind: KindOpt = None,  # never given here: ReplayGroup turns it into the subcommand
    load_trace: LoadTraceOpt = None,
    plan: PlanOpt = None,
    carbon_intensity: CarbonIntensityOpt = None,
    region: RegionOpt = None,
    carbon_trace: CarbonTraceOpt = None,
    start: StartOpt = None,
    hours: HoursOpt = None,
    every: EveryOpt = "60s",
    threshold: ThresholdOpt = REPLAN_THRESHOLD,
    margin: MarginOpt = REPLAN_MARGIN,
    min_dwell: MinDwellOpt = REPLAN_MIN_DWELL,
    forecaster: ForecasterOpt = None,
    baseline: BaselineOpt = None,
    wue: WueOpt = None,
    ewif: EwifOpt = None,
    output: OutputOpt = None,
    json_out: JsonOpt = False,
    db: DbOpt = None,
) -> None:
    """Replay the replan loop over a load trace and a carbon signal, beside baselines.

    One subcommand per plan kind takes the kind's planning inputs (as plan KIND).

    The options below are every kind's, before or after the subcommand (none named: mix).
    """
    ctx.obj = ReplayCommon(
        load_trace=load_trace, plan=plan, carbon_intensity=carbon_intensity, region=region,
        carbon_trace=carbon_trace, start=start, hours=hours, every=every, threshold=threshold,
        margin=margin, min_dwell=min_dwell, forecaster=forecaster, baseline=tuple(baseline or ()),
        wue=wue, ewif=ewif, output=output, json_out=json_out, db=db,
    )  # fmt: skip


# -- the kinds' own options -------------------------------------------------------------------
FamilyOpt = Annotated[
    list[str] | None, typer.Option("--model", help="The model family, as plan mix and mig.")
]

MixSpecOpt = Annotated[
    str | None,
    typer.Option(
        "--spec", help="TOML/JSON spec, as plan mix.", parser=input_path_str, metavar="FILE"
    ),
]

VpaVariantOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--vpa-variant",
        help="VPA's one variant (default: the first plan's main); repeat for one VPA each.",
    ),
]

GpuOpt = Annotated[str | None, typer.Option("--gpu", help="GPU model (A100-40GB).")]

GpusOpt = Annotated[int | None, typer.Option("--gpus", help="Number of GPUs.")]

SlaMsOpt = Annotated[
    float | None,
    typer.Option("--sla-ms", help="p95 SLA in ms (default: the first plan's)."),
]

LamOpt = Annotated[float, typer.Option("--lambda", help="Weight of dCarbon vs dAccuracy.")]

BaseCarbonIntensityOpt = Annotated[
    float | None,
    typer.Option(
        "--base-carbon-intensity",
        help="Carbon intensity BASE is measured at in the objective, gCO2/kWh "
        "(default: each interval's own, under which the objective ignores the signal).",
    ),
]

GletModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="NAME:RATE:SLO_MS, repeatable (RATE: the model's share of --load-trace, as plan "
        "glet's rate).",
    ),
]

GletSpecOpt = Annotated[
    str | None,
    typer.Option(
        "--spec", help="TOML/JSON spec, as plan glet.", parser=input_path_str, metavar="FILE"
    ),
]

ModelTraceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model-trace",
        help="NAME=FILE, a model's own requests per second (repeatable; the others share "
        "--load-trace).",
    ),
]

PartitionsOpt = Annotated[
    str | None, typer.Option("--partitions", help="Partition sizes, as plan glet (20,40,...,100).")
]

MaxGpusOpt = Annotated[int | None, typer.Option("--max-gpus", help="GPUs available (default 8).")]

RatePercentileOpt = Annotated[
    float | None, typer.Option("--rate-percentile", help="As plan glet (default 99).")
]

GletAlgorithmOpt = Annotated[
    str | None,
    typer.Option("--algorithm", help="glet (default) | sbp | greedy | ideal."),
]

NoInterferenceOpt = Annotated[
    bool, typer.Option("--no-interference", help="Plan without interference.")
]

InterferenceModelOpt = Annotated[
    int | None, typer.Option("--interference-model", help="Stored interference model id.")
]

HardwareOpt = Annotated[
    str | None, typer.Option("--hardware", help="Only profiles of this hardware.")
]

GpuPowerWOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu-power-w",
        help="IDLE:BUSY watts of one GPU when the profiles hold no power (assumed 50:250).",
    ),
]

SitesOpt = Annotated[
    str | None,
    typer.Option("--sites", help="Sites CSV, as plan geo.", parser=input_path_str, metavar="FILE"),
]

DemandOpt = Annotated[
    str | None,
    typer.Option(
        "--demand", help="Demand CSV, as plan geo.", parser=input_path_str, metavar="FILE"
    ),
]

RoutesOpt = Annotated[
    str | None,
    typer.Option(
        "--routes", help="Routes CSV, as plan geo.", parser=input_path_str, metavar="FILE"
    ),
]

GeoAlgorithmOpt = Annotated[
    str | None,
    typer.Option(
        "--algorithm",
        help="eglb (default) | eglb-mpc (an offline algorithm replays eglb).",
    ),
]

MuCarbonOpt = Annotated[
    float, typer.Option("--mu-carbon", help="USD per kg of the largest site's carbon.")
]

MuWaterOpt = Annotated[
    float, typer.Option("--mu-water", help="USD per litre of the largest site's water.")
]

#: where each subcommand's help sends the reader for the options every kind shares
SHARED = "The options every kind shares are replay's own (greenctl replay --help)."


# -- the subcommands: parse the kind's inputs, replay, render ---------------------------------
@replay_app.command("mix", epilog=SHARED)
def replay_mix_cmd(
    ctx: typer.Context,
    model: FamilyOpt = None,
    rate: RateOpt = None,
    slo_ms: SloMsOpt = None,
    percentile: PercentileOpt = None,
    budget: BudgetOpt = None,
    objective: ObjectiveOpt = None,
    min_accuracy: MinAccuracyOpt = None,
    alpha: AlphaOpt = None,
    beta: BetaOpt = None,
    gamma: GammaOpt = None,
    headroom: HeadroomOpt = None,
    strategy: StrategyOpt = None,
    spec: MixSpecOpt = None,
    vpa_variant: VpaVariantOpt = None,
) -> None:
    """Replay a mix plan against BASE, CO2OPT, VPA, INFaaS and InfAdapter.

    The planning inputs are plan mix's; --plan ID starts from a stored plan instead.
    """
    common = _common(ctx, given=[model, spec])
    request = None
    if common.plan is None:
        request = mix_request(
            model=None if model is None else _one_model(model), rate=rate, slo_ms=slo_ms,
            percentile=percentile, budget=budget, objective=objective, min_accuracy=min_accuracy,
            alpha=alpha, beta=beta, gamma=gamma, carbon_intensity=common.carbon_intensity,
            headroom=headroom, strategy=strategy, spec=spec,
        )  # fmt: skip
    _replay(common, "mix", request, {"vpa_variant": vpa_variant})


@replay_app.command("mig", epilog=SHARED)
def replay_mig_cmd(
    ctx: typer.Context,
    model: FamilyOpt = None,
    rate: RateOpt = None,
    gpu: GpuOpt = None,
    gpus: GpusOpt = None,
    sla_ms: SlaMsOpt = None,
    lam: LamOpt = 0.5,
    base_carbon_intensity: BaseCarbonIntensityOpt = None,
) -> None:
    """Replay a MIG plan (Clover's GPU partitions) against Clover's baselines.

    The planning inputs are plan mig's; --plan ID starts from a stored plan instead.
    """
    common = _common(ctx, given=[model])
    request = None
    if common.plan is None:
        if gpu is None or gpus is None or model is None:
            raise InputError("replay mig needs --gpu, --gpus and --model", hint="as plan mig")
        request = mig_request(
            model=_one_model(model), gpu=gpu, gpus=gpus, rate=rate,
            carbon_intensity=common.carbon_intensity, sla_ms=sla_ms, lam=lam,
            base_carbon_intensity=base_carbon_intensity,
        )  # fmt: skip
    _replay(common, "mig", request, {})


@replay_app.command("glet", epilog=SHARED)
def replay_glet_cmd(
    ctx: typer.Context,
    model: GletModelOpt = None,
    spec: GletSpecOpt = None,
    model_trace: ModelTraceOpt = None,
    partitions: PartitionsOpt = None,
    max_gpus: MaxGpusOpt = None,
    rate_percentile: RatePercentileOpt = None,
    algorithm: GletAlgorithmOpt = None,
    no_interference: NoInterferenceOpt = False,
    interference_model: InterferenceModelOpt = None,
    hardware: HardwareOpt = None,
    gpu_power_w: GpuPowerWOpt = None,
) -> None:
    """Replay a glet plan (models sharing GPUs) against the plan sized for their peaks.

    The planning inputs are plan glet's; --plan ID starts from a stored plan instead.
    """
    common = _common(ctx, given=[model, spec])
    request = None
    options: dict[str, Any] = {}
    if common.plan is None:
        interference = (
            None
            if no_interference
            else "newest"
            if interference_model is None
            else interference_model
        )
        request = glet_request(
            None if spec is None else Path(spec), model or [], partitions=partitions,
            max_gpus=max_gpus, rate_percentile=rate_percentile, algorithm=algorithm,
            interference=interference, hardware=hardware, simulate_s=0.0, seed=0,
        )  # fmt: skip
        options["carbon_intensity"] = common.carbon_intensity
    if model_trace:
        options["model_traces"] = _name_files(model_trace)
    if gpu_power_w is not None:
        options["gpu_power_w"] = _idle_busy(gpu_power_w)
    _replay(common, "glet", request, options)


@replay_app.command("geo", epilog=SHARED)
def replay_geo_cmd(
    ctx: typer.Context,
    sites: SitesOpt = None,
    demand: DemandOpt = None,
    routes: RoutesOpt = None,
    algorithm: GeoAlgorithmOpt = None,
    mu_carbon: MuCarbonOpt = 1.5,
    mu_water: MuWaterOpt = 0.06,
) -> None:
    """Replay a geo plan's online step against the offline optimum and the nearest site.

    The planning inputs are plan geo's; --plan ID starts from a stored plan instead.
    """
    common = _common(ctx, given=[sites, demand, routes])
    request = None
    if common.plan is None:
        if sites is None or demand is None:
            raise InputError("replay geo needs --sites and --demand", hint="as plan geo")
        request = {
            "sites": sites, "demand": demand, "routes": routes,
            "algorithm": algorithm or "eglb",
            "mu_carbon_usd_per_kg": mu_carbon, "mu_water_usd_per_l": mu_water,
        }  # fmt: skip
    _replay(common, "geo", request, {})


RequestFileOpt = Annotated[
    str | None,
    typer.Option(
        "--request",
        help="JSON file of the kind's request fields, as plan run --request.",
        parser=input_path_str,
        metavar="FILE",
    ),
]


@installed_app.command(epilog=SHARED)
def replay_installed_cmd(ctx: typer.Context, request: RequestFileOpt = None) -> None:
    """Replay a plan of an installed kind through the kind's own replay step.

    The planning inputs are a request file, as plan run --kind K --request FILE takes it;
    --plan ID starts from a stored plan instead; --carbon-intensity is the request's.
    """
    kind = str(ctx.info_name)
    common = _common(ctx, given=[request])
    doc = None
    if common.plan is None:
        if request is None:
            raise InputError(
                f"replay {kind} needs --request FILE or --plan ID",
                hint=f"the request as `greenctl plan run --kind {kind} --request FILE` takes it",
            )
        doc = read_request(request)
        if common.carbon_intensity is not None:
            doc["carbon_intensity"] = common.carbon_intensity
    _replay(common, kind, doc, {})


def _common(ctx: typer.Context, *, given: list[Any]) -> ReplayCommon:
    """replay's shared options; the kind's inputs ``given`` are refused beside --plan."""
    common = ctx.find_object(ReplayCommon)
    assert common is not None, "replay's callback hands its options to the subcommand"
    if common.plan is not None and any(given):
        raise InputError("--plan cannot be combined with the kind's inputs", hint="give one")
    return common


def _replay(
    common: ReplayCommon, kind: str, request: dict[str, Any] | None, options: dict[str, Any]
) -> None:
    """Run the replay (:func:`greenctl.executor.control.replay.replay`) with a progress bar,
    and print its result."""
    from greenctl.executor.control import replan, replay  # the library (and numpy) when it runs

    bar = Progress(
        TextColumn("replanning", style="progress.description"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=common.json_out,
        transient=True,
    )
    task = bar.add_task("replay", total=1.0)
    c = common
    out = check_writable_folder(c.output, option="-o") if c.output is not None else None
    with store_for(c.db) as store, bar, undone_on_failure(out) if out else nullcontext():
        result = replay.replay(
            store, kind=kind, request=request, plan=c.plan, load_trace=c.load_trace,
            region=c.region, carbon_trace=c.carbon_trace, start=c.start, hours=c.hours,
            every=c.every, threshold=c.threshold, margin=c.margin,
            min_dwell_s=replan.parse_duration(c.min_dwell), forecaster=c.forecaster,
            baselines=[b for b in c.baseline if b != "none"] if c.baseline else None,
            wue_l_per_kwh=c.wue, ewif_l_per_kwh=c.ewif, out_dir=c.output, kind_options=options,
            progress=lambda k, n: bar.update(task, completed=k / n),
        )  # fmt: skip
    if common.json_out:
        print_json(result)
        return
    _render(result)


def _one_model(model: list[str]) -> str:
    if len(model) != 1:
        raise InputError(
            f"--model is given {len(model)} times: a mix or mig replay takes one family",
            hint="--model NAME:RATE:SLO_MS repeats for replay glet",
        )
    return model[0]


def _name_files(values: list[str]) -> dict[str, str]:
    """``NAME=FILE`` arguments of --model-trace."""
    out: dict[str, str] = {}
    for text in values:
        name, sep, path = text.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InputError(
                f"--model-trace '{text}' is not NAME=FILE",
                hint="for example --model-trace resnet50=resnet50_rps.txt",
            )
        if name.strip() in out:
            raise InputError(f"--model-trace names {name.strip()} twice")
        out[name.strip()] = path.strip()
    return out


def _idle_busy(text: str) -> tuple[float, float]:
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise InputError(
            f"--gpu-power-w '{text}' is not IDLE:BUSY", hint="watts of one GPU, e.g. 50:250"
        ) from None


# -- the results, per layout (meta.layout: the figures a kind's replay step gives) -----------
def _render(result: dict[str, Any]) -> None:
    meta = result["meta"]
    layout = meta.get("layout")
    if layout == "models":
        _render_models(result)
    elif layout == "sites":
        _render_sites(result)
    else:
        _render_serving(result)
    for note in meta["notes"]:
        say(f"note: {note}", highlight=False)
    for path in meta.get("files", []):
        say(f"wrote {path}", highlight=False)


def _render_models(result: dict[str, Any]) -> None:
    meta = result["meta"]
    names = [m["name"] for m in meta["models"]]
    render_table(
        f"Replay of {meta['family']} (modeled): {meta['hours']:.2f} h from {meta['start']}, "
        f"{meta['intervals']} intervals of {meta['every_s']} s",
        ["policy", "SLO viol. %", "GPU-h", "mean GPUs", "max GPUs", "kWh", "gCO2", "water L",
         "changes"],
        [
            [s["policy"], s["violation_pct"], s["gpu_hours"], s["mean_units"], s["max_units"],
             s["energy_kwh"], s["carbon_g"], s["water_l"], s["changes"]]
            for s in result["summary"]
        ],
        caption=f"{meta['modeled']}; carbon: {meta['carbon']}; forecast: {meta['forecast']}",
    )  # fmt: skip
    render_table(
        "SLO violations per model, % of its requests (modeled)",
        ["policy", *names],
        [
            [s["policy"], *[s["per_model"][n]["violation_pct"] for n in names]]
            for s in result["summary"]
        ],
        caption="SLOs: "
        + ", ".join(f"{n} {meta['slos_ms'][n]:g} ms" for n in names if meta["slos_ms"].get(n)),
    )
    r = meta["replan"]
    say(
        f"replan: {r['solves']} solves, {r['cached']} repeated rounds answered from the "
        f"replay's memo, {r['dwell_holds']} held by --min-dwell, "
        f"{r.get('dwell_yields', 0)} changed within it (the running plan could not carry the "
        f"forecast); {meta['wall_s']:.1f} s",
        highlight=False,
    )


def _render_sites(result: dict[str, Any]) -> None:
    meta = result["meta"]
    render_table(
        f"Replay of {meta['family']} (modeled): {meta['hours']:g} h from {meta['start']}, "
        f"{meta['algorithm']} online step every {meta['every_s'] / 3600:g} h",
        ["policy", "MWh", "unserved MWh", "USD", "t CO2", "water m3", "objective USD",
         "changes"],
        [
            [s["policy"], s["load_mwh"], s["unserved_mwh"], s["cost_usd"], s["carbon_g"] / 1e6,
             s["water_l"] / 1000, s["objective_usd"], s["changes"]]
            for s in result["summary"]
        ],
        caption=f"{meta['modeled']}; objective = energy cost + {meta['mu_carbon_usd_per_kg']:g} "
        f"USD/kg x max-site CO2 + {meta['mu_water_usd_per_l']:g} USD/L x max-site water; "
        "changes: slots whose routing moved",
    )  # fmt: skip
    render_table(
        "Equity: the largest site's footprint, and over the per-site average (modeled)",
        ["policy", "max-site t CO2", "CO2 max/avg", "max-site water m3", "water max/avg"],
        [
            [s["policy"], s["carbon_kg_max_site"] / 1000, s["carbon_max_over_avg"],
             s["water_l_max_site"] / 1000, s["water_max_over_avg"]]
            for s in result["summary"]
        ],
    )  # fmt: skip
    r = meta["replan"]
    say(
        f"replan: {r['replans']} online rounds ({r['online_steps']} steps) in "
        f"{r['decide_s']:.2f} s; {meta['wall_s']:.1f} s",
        highlight=False,
    )


def _render_serving(result: dict[str, Any]) -> None:
    meta = result["meta"]
    label = f", {str(meta['label']).upper()}" if meta.get("label") else ""
    render_table(
        f"Replay of {meta['family']} (modeled{label}): {meta['hours']:.2f} h from {meta['start']}, "
        f"{meta['intervals']} intervals of {meta['every_s']} s",
        ["policy", "SLO viol. %", "accuracy", "kWh", "gCO2", "water L", "USD", "changes",
         "units"],
        [
            [s["policy"], s["violation_pct"], s["accuracy"], s["energy_kwh"], s["carbon_g"],
             s["water_l"], s["cost_usd"], s["changes"], s["mean_units"]]
            for s in result["summary"]
        ],
        caption=f"{meta['modeled']}; carbon: {meta['carbon']}; SLO {meta['slo_ms']:.4g} ms at "
        f"{meta['percentile']}; forecast: {meta['forecast']}",
    )  # fmt: skip
    r = meta["replan"]
    say(
        f"replan: {r['solves']} solves, {r['cached']} repeated rounds answered from the "
        f"replay's memo, {r['dwell_holds']} held by --min-dwell, "
        f"{r.get('dwell_yields', 0)} changed within it (the running plan could not carry the "
        f"forecast); {meta['wall_s']:.1f} s",
        highlight=False,
    )
    if meta.get("vpa"):
        names = ", ".join(f"{k}: {v}" for k, v in meta["vpa"]["variants"].items())
        say(f"{names}. {meta['vpa']['rule']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(replay_app, name="replay")
