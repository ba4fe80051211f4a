"""Inputs of ``plan glet``: the ``--spec`` file (TOML or JSON) and ``--model`` arguments.

Each model is read into the plain dict a glet plan's ``request.models`` holds (``name``,
``rate_rps``, ``slo_ms``, ``variant`` or None), what ``greenctl.executor.kinds`` builds the
problem from. A spec holds optional ``max_gpus``, ``rate_percentile``, ``partitions``
(percentages or labels such as ``"mps:50"``) and ``algorithm``, and ``[[models]]`` tables
with those keys. Command-line flags win over the file. See docs/formats.md.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.resources import parse_resource

#: One model to serve, as a request holds it: name, rate_rps, slo_ms, variant (or None).
GletModelDoc = dict[str, Any]


def glet_model(
    name: str, rate_rps: float, slo_ms: float, variant: str | None = None
) -> GletModelDoc:
    """A model entry of a glet request."""
    return {"name": name, "rate_rps": rate_rps, "slo_ms": slo_ms, "variant": variant}


@dataclass
class GletSpec:
    """What a spec file (or flags) says; None means 'not given'."""

    models: list[GletModelDoc] = field(default_factory=list)
    partitions: list[str] | None = None
    max_gpus: int | None = None
    rate_percentile: float | None = None
    algorithm: str | None = None


def parse_model_arg(text: str) -> GletModelDoc:
    """``NAME:RATE:SLO_MS`` -> a model entry (:func:`glet_model`).

    Raises:
        InputError: naming the argument and the expected form.
    """
    parts = text.split(":")
    hint = "write --model NAME:RATE:SLO_MS, for example --model resnet50:200:25"
    if len(parts) != 3 or not parts[0].strip():
        raise InputError(f"--model '{text}' is not NAME:RATE:SLO_MS", hint=hint)
    name, rate_s, slo_s = (p.strip() for p in parts)
    try:
        rate, slo = float(rate_s), float(slo_s)
    except ValueError:
        raise InputError(f"--model '{text}': rate and SLO must be numbers", hint=hint) from None
    if not (math.isfinite(rate) and rate >= 0):
        raise InputError(f"--model '{text}': rate must be a number >= 0 req/s", hint=hint)
    if not (math.isfinite(slo) and slo > 0):
        raise InputError(f"--model '{text}': SLO must be a number > 0 ms", hint=hint)
    return glet_model(name, rate, slo)


def parse_partitions(values: list[Any], *, where: str = "--partitions") -> list[str]:
    """Numbers become ``mps:N``; labels are validated. Sorted, deduplicated."""
    out: list[str] = []
    for v in values:
        if isinstance(v, bool):
            raise InputError(f"{where}: {v!r} is not a partition")
        if isinstance(v, int | float) or (isinstance(v, str) and v.strip().isdigit()):
            n = float(v)
            if not (n.is_integer() and 1 <= n <= 100):
                raise InputError(f"{where}: {v!r} is not a percentage between 1 and 100")
            label = f"mps:{int(n)}"
        elif isinstance(v, str):
            label = parse_resource(v).label
        else:
            raise InputError(f"{where}: {v!r} is not a partition")
        if label not in out:
            out.append(label)
    if not out:
        raise InputError(
            f"{where} needs at least one partition", hint="for example 20,40,60,80,100"
        )
    return out


def load_glet_spec(path: str | Path, *, algorithms: Sequence[str] | None = None) -> GletSpec:
    """Read a TOML or JSON spec file.

    Args:
        path: the file.
        algorithms: the scheduling algorithms ``algorithm`` may name (the planner's
            ``ALGORITHMS``); None: any name.

    Raises:
        InputError / FileFormatError: missing file, syntax error (with line), bad field.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InputError(f"spec file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read spec file {p}: {exc}") from None
    doc: Any
    if p.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FileFormatError(str(p), f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    else:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise FileFormatError(str(p), f"invalid TOML: {exc}") from None
    if not isinstance(doc, dict):
        raise FileFormatError(str(p), "the spec must be a table/object with a 'models' list")
    known = {"models", "partitions", "max_gpus", "rate_percentile", "algorithm"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise FileFormatError(
            str(p),
            f"unknown field '{unknown[0]}'",
            hint="known fields: " + ", ".join(sorted(known)),
        )
    spec = GletSpec()
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise FileFormatError(
            str(p),
            "field 'models' must be a non-empty list",
            hint='TOML: [[models]] name = "resnet50" rate_rps = 200 slo_ms = 25',
        )
    for n, m in enumerate(models):
        where = f"models[{n}]"
        if not isinstance(m, dict):
            raise FileFormatError(str(p), f"{where} must be a table/object")
        name = m.get("name")
        if not isinstance(name, str) or not name.strip():
            raise FileFormatError(str(p), f"{where}.name is missing or not a string")
        vals = {}
        for key, positive in (("rate_rps", False), ("slo_ms", True)):
            v = m.get(key)
            x = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan
            if not math.isfinite(x) or x < 0 or (positive and x == 0):
                raise FileFormatError(
                    str(p),
                    f"{where}.{key} must be a number {'> 0' if positive else '>= 0'}, got {v!r}",
                )
            vals[key] = x
        variant = m.get("variant")
        if variant is not None and (not isinstance(variant, str) or not variant):
            raise FileFormatError(str(p), f"{where}.variant must be a string")
        extra = sorted(set(m) - {"name", "rate_rps", "slo_ms", "variant"})
        if extra:
            raise FileFormatError(str(p), f"{where} has unknown field '{extra[0]}'")
        spec.models.append(glet_model(name, vals["rate_rps"], vals["slo_ms"], variant))
    if "partitions" in doc:
        if not isinstance(doc["partitions"], list):
            raise FileFormatError(str(p), "field 'partitions' must be a list")
        try:
            spec.partitions = parse_partitions(doc["partitions"], where=f"{p}: partitions")
        except InputError as exc:
            raise FileFormatError(str(p), exc.message) from None
    if "max_gpus" in doc:
        v = doc["max_gpus"]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise FileFormatError(
                str(p), f"field 'max_gpus' must be a whole number >= 1, got {v!r}"
            )
        spec.max_gpus = v
    if "rate_percentile" in doc:
        v = doc["rate_percentile"]
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v < 100:
            raise FileFormatError(str(p), f"field 'rate_percentile' must be in [0, 100), got {v!r}")
        spec.rate_percentile = float(v)
    if "algorithm" in doc:
        v = doc["algorithm"]
        if not isinstance(v, str) or (algorithms is not None and v not in algorithms):
            raise FileFormatError(
                str(p),
                f"field 'algorithm' is {v!r}, expected "
                + (f"one of {', '.join(algorithms)}" if algorithms is not None else "a name"),
            )
        spec.algorithm = v
    return spec
