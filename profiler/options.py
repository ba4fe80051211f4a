"""What to measure: the choices of one profiling run, parsed and checked once.

``greenctl profile`` hands the text of its options to :func:`parse_profile_options`, which
refuses a bad combination with the flag and a fix (exit 2) before anything is measured,
and returns the :class:`ProfileOptions` that :func:`greenctl.profiler.harness.profile` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.limits import split_items
from greenctl.data.records import MAX_BATCH, Variant
from greenctl.profiler.models import user_variant

DEFAULT_WARMUP = 3
DEFAULT_DURATION_S = 1.0
#: the most one point is measured for: its figures settle within seconds, and a run
#: measures every (variant, resource, batch) point this long
MAX_POINT_DURATION_S = 3600.0
#: the most requests one point is measured with (``--requests``)
MAX_POINT_REQUESTS = 1_000_000
#: the most un-timed warm-up batches of one point (``--warmup``)
MAX_WARMUP = 1000


def check_emulate_mig(*, emulate_mig: bool, gpus: bool) -> None:
    """MIG slices are emulated on this machine's whole GPUs: ``emulate_mig`` needs ``gpus``.

    Raises:
        InputError: --emulate-mig without --gpus.
    """
    if emulate_mig and not gpus:
        raise InputError(
            "--emulate-mig needs --gpus",
            hint="add --gpus: MIG slices are emulated on this machine's whole GPUs",
        )


@dataclass(frozen=True)
class ProfileOptions:
    """The points of one profiling run: which variants, on which resources, for how long.

    ``mps``: MPS percentages (None: the defaults when a daemon runs); ``emulate_mig``: also
    emulate every MIG slice of each whole GPU as an MPS share.
    """

    variants: tuple[str, ...] = ()
    family: str | None = None
    user: Variant | None = None
    cpus: tuple[int, ...] = (1,)
    gpus: bool = False
    batches: tuple[int, ...] = (1, 2, 4, 8)
    duration_s: float | None = DEFAULT_DURATION_S
    requests: int | None = None
    warmup: int = DEFAULT_WARMUP
    mps: tuple[int, ...] | None = None
    emulate_mig: bool = False

    @classmethod
    def of(
        cls,
        *,
        variants: Sequence[str] = (),
        cpus: Sequence[int] = (1,),
        batches: Sequence[int] = (1, 2, 4, 8),
        mps: Sequence[int] | None = None,
        **rest: Any,
    ) -> ProfileOptions:
        """The options from keywords named as the fields, any sequence for the lists."""
        return cls(
            variants=tuple(variants),
            cpus=tuple(cpus),
            batches=tuple(batches),
            mps=None if mps is None else tuple(mps),
            **rest,
        )

    def check(self) -> None:
        """Refuse choices no run can carry out (each names its flag and a fix).

        Raises:
            InputError: --emulate-mig without --gpus; a batch size, --requests, --duration
                (without --requests) or --warmup outside its bound (:data:`MAX_BATCH`,
                :data:`MAX_POINT_REQUESTS`, :data:`MAX_POINT_DURATION_S`, :data:`MAX_WARMUP`).
        """
        check_emulate_mig(emulate_mig=self.emulate_mig, gpus=self.gpus)
        for b in self.batches:
            if not 1 <= int(b) <= MAX_BATCH:
                raise InputError(
                    f"--batch {b}: batch sizes must be 1 to {MAX_BATCH} (the largest batch "
                    "greenctl measures, imports or plans with)",
                    hint="for example --batch 1,2,4,8",
                )
        if self.requests is not None and not 1 <= self.requests <= MAX_POINT_REQUESTS:
            raise InputError(
                f"--requests {self.requests}: must be 1 to {MAX_POINT_REQUESTS:,} per point",
                hint="for example --requests 200",
            )
        duration = self.duration_s
        if self.requests is None and not (isinstance(duration, int | float) and duration > 0):
            raise InputError(
                "--duration must be a positive number of seconds", hint="e.g. --duration 2"
            )
        if self.requests is None and duration is not None and duration > MAX_POINT_DURATION_S:
            raise InputError(
                f"--duration {duration:g}: at most {MAX_POINT_DURATION_S:g} s per point (a "
                "point's figures settle within seconds; every point is measured this long)",
                hint="e.g. --duration 2",
            )
        if not 0 <= self.warmup <= MAX_WARMUP:
            raise InputError(
                f"--warmup {self.warmup}: must be 0 to {MAX_WARMUP} batches per point",
                hint=f"the default is {DEFAULT_WARMUP}",
            )


@dataclass(frozen=True)
class UserModelSpec:
    """The user's own model as ``--model-path`` and its companions name it."""

    model_path: str | None = None
    input_shape: str | None = None
    accuracy: float | None = None
    name: str | None = None
    weights: str | None = None

    def check(self) -> None:
        """Refuse a companion flag given without ``--model-path``.

        Raises:
            InputError: e.g. --input-shape without --model-path.
        """
        for flag, value in (
            ("--input-shape", self.input_shape),
            ("--accuracy", self.accuracy),
            ("--name", self.name),
            ("--weights", self.weights),
        ):
            if value is not None and self.model_path is None:
                raise InputError(f"{flag} only applies to --model-path", hint="add --model-path")


def parse_int_list(text: str, *, option: str) -> list[int]:
    """Parse ``1,2,4`` into ints >= 1, or fail naming the option.

    Raises:
        InputError: a part that is not a whole number >= 1, an empty part, or no part at all.
    """
    out = []
    for part in split_items(text, option, example="1,2,4"):
        if not part.isdigit() or int(part) < 1:
            raise InputError(
                f"{option}: '{part}' is not a whole number >= 1", hint=f"for example {option} 1,2,4"
            )
        out.append(int(part))
    return out


def parse_profile_options(
    *,
    variants: Sequence[str] = (),
    model: str | None = None,
    cpus: str = "1",
    gpus: bool = False,
    batch: str = "1,2,4,8",
    duration: float | None = None,
    requests: int | None = None,
    warmup: int = DEFAULT_WARMUP,
    mps: str | None = None,
    emulate_mig: bool = False,
    user: UserModelSpec | None = None,
) -> ProfileOptions:
    """The options of ``greenctl profile`` as given on the command line, checked and parsed.

    ``variants`` may repeat and comma-separate names; ``cpus`` is core counts or ``none``;
    ``user`` builds the user's variant (which then belongs to family ``model``).

    Raises:
        InputError: a bad combination or value, naming its flag and a fix.
    """
    names = tuple(n for v in variants for n in split_items(v, "--variant", example="tiny-s,tiny-m"))
    if duration is not None and requests is not None:
        raise InputError("give either --duration or --requests, not both")
    user = user or UserModelSpec()
    user.check()
    check_emulate_mig(emulate_mig=emulate_mig, gpus=gpus)
    no_cpus = cpus.strip().lower() == "none"
    if no_cpus and not gpus:
        raise InputError(
            "--cpus none leaves nothing to measure without --gpus",
            hint="add --gpus, or give core counts such as --cpus 1,2",
        )
    cpu_list = () if no_cpus else tuple(parse_int_list(cpus, option="--cpus"))
    batches = tuple(parse_int_list(batch, option="--batch"))
    mps_list = tuple(parse_int_list(mps, option="--mps")) if mps is not None else None
    if mps_list and any(p > 100 for p in mps_list):
        raise InputError("--mps: percentages must be between 1 and 100", hint="e.g. --mps 25,50")
    own = None
    if user.model_path is not None:
        own = user_variant(
            user.model_path,
            input_shape=user.input_shape,
            accuracy=user.accuracy,
            name=user.name,
            family=model,
            weights=user.weights,
        )
    options = ProfileOptions(
        variants=names,
        family=None if own is not None else model,
        user=own,
        cpus=cpu_list,
        gpus=gpus,
        batches=batches,
        duration_s=None if requests is not None else (duration or DEFAULT_DURATION_S),
        requests=requests,
        warmup=warmup,
        mps=mps_list,
        emulate_mig=emulate_mig,
    )
    options.check()
    return options
