"""The command-line options that several commands share, declared once.

A command names its option by type (``model: ModelOpt``, ``region: RegionOpt = None``), so
the flag, its short form and its help read the same everywhere; where a default differs by
command, the one help says each. An option that means something else in one command
(``replan --rate MODEL=RPS``, the demo's ``--model`` scenario) is declared there under its
own name. ``DbOpt`` and ``JsonOpt`` live in
:mod:`greenctl.cli.common` beside the store opening they go with, and are re-exported here.
"""

from __future__ import annotations

from typing import Annotated

import typer
from greenctl.cli.common import DbOpt, JsonOpt

__all__ = [
    "AtOpt",
    "DbOpt",
    "FromOpt",
    "JsonOpt",
    "ModelFilterOpt",
    "ModelOpt",
    "PlanCarbonIntensityOpt",
    "RateOpt",
    "RegionFilterOpt",
    "RegionOpt",
    "RequiredRegionOpt",
    "ToOpt",
    "VariantFilterOpt",
]

ModelOpt = Annotated[str, typer.Option("--model", help="Model family to serve.")]
ModelFilterOpt = Annotated[str | None, typer.Option("--model", help="Only this model family.")]
VariantFilterOpt = Annotated[str | None, typer.Option("--variant", help="Only this variant.")]

RateOpt = Annotated[
    float | None,
    typer.Option(
        "--rate",
        help="Request rate, req/s, Poisson (default: the plan's rate; a replay's first plan: "
        "the first forecast).",
        min=0.0,
    ),
]

RegionOpt = Annotated[
    str | None,
    typer.Option("--region", "-r", help="Carbon signal region (see `greenctl carbon regions`)."),
]
RequiredRegionOpt = Annotated[
    str, typer.Option("--region", "-r", help="Carbon signal region, e.g. CISO.")
]
RegionFilterOpt = Annotated[str | None, typer.Option("--region", "-r", help="Only this region.")]

AtOpt = Annotated[
    str | None,
    typer.Option(
        "--at",
        help="Use the carbon signal (and a geo plan's slot) in force at this time "
        "(ISO; default now).",
    ),
]
#: the grid intensity a planner plans at (plan mix, plan llm)
PlanCarbonIntensityOpt = Annotated[
    float | None,
    typer.Option(
        "--carbon-intensity",
        help="Grid carbon intensity in gCO2/kWh (default: the --region signal, else the "
        "only region's, else the reference 400).",
    ),
]
FromOpt = Annotated[str | None, typer.Option("--from", help="First time (ISO UTC).")]
ToOpt = Annotated[str | None, typer.Option("--to", help="Last time (ISO UTC).")]
