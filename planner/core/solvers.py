"""The one place greenctl builds solver objects (HiGHS, pulp's HiGHS, CBC) and reads them.

:func:`new_highs` silences highspy's banner on fd 1 (``--json`` must be one document on
stdout) and asks for :data:`HIGHS_THREADS` (HiGHS's process-wide pool cannot be resized).
:func:`highs_outcome` and :func:`pulp_outcome` map statuses to optimal, infeasible (the
caller raises :class:`~greenctl.data.errors.InfeasiblePlan`), stopped at a limit, or a
solver failure. Inside :func:`solve_memo` an identical HiGHS run returns the earlier outcome
(``replay`` replans the same few problems often; single-thread HiGHS is deterministic).
Planners stay pure: no store, files or network (CBC's temporary model file is pulp's).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import shutil
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from greenctl.data.errors import InputError, SolverError

#: HiGHS threads of every solve in this process. One: greenctl's LPs and MIPs are small
#: (simplex is serial anyway), one thread keeps MIP runs reproducible, and a pool of one
#: never competes with the executors on a shared control-plane machine.
HIGHS_THREADS = 1

#: Options :func:`new_highs` owns; callers may not pass them.
_OWNED_OPTIONS = frozenset({"threads", "output_flag", "log_to_console"})

_banner_silenced = False

OPTIMAL = "optimal"
INFEASIBLE = "infeasible"
LIMIT = "limit"

CBC_INSTALL_HINT = (
    "install CBC with `pip install 'greenctl[cbc]'` (cbcbox, what pulp's cbc extra installs) "
    "or put a cbc executable on PATH, or use --solver highs"
)


@contextlib.contextmanager
def stdout_fd_silenced() -> Iterator[None]:
    """Point file descriptor 1 at ``/dev/null`` for the block, restoring it even on error.

    For output written by C/C++ libraries straight to fd 1 (``sys.stdout`` redirection does
    not reach it). Python's and C's buffers are flushed first and last so nothing written
    before the block is lost or lands inside it.
    """
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all: nothing to protect
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        _flush_c_stdio()
        os.dup2(null, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: C's stdout buffer (full buffering on a pipe) goes out now."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # no C library to reach (some platforms): the dup2 still holds
        pass


def new_highs(options: Mapping[str, object] | None = None) -> Any:  # -> highspy.Highs
    """A ``highspy.Highs`` for greenctl: silent, on the process's thread count.

    Every HiGHS object of greenctl is built here (pulp's too, see :func:`pulp_highs`).

    Args:
        options: HiGHS options for this object (``presolve``, ``time_limit``, ...); the
            thread count and output options are this module's.

    Raises:
        ValueError: an option that is not HiGHS's, or one this module owns (a bug).
    """
    import highspy

    global _banner_silenced
    if _banner_silenced:
        h = highspy.Highs()
    else:
        # the banner comes once per process, at the first construction
        with stdout_fd_silenced():
            h = highspy.Highs()
        _banner_silenced = True
    _set(h, "output_flag", False)
    _set(h, "threads", HIGHS_THREADS)
    for key, value in (options or {}).items():
        if key in _OWNED_OPTIONS:
            raise ValueError(f"HiGHS option {key!r} is set by greenctl.planner.core.solvers")
        _set(h, key, value)
    memo = _MEMO.get()
    if memo is not None:
        return _MemoHighs(h, memo, dict(options or {}))
    return h


# -- repeated problems ---------------------------------------------------------------------------
@dataclass
class SolveMemo:
    """What :func:`solve_memo` remembered, and how often it answered."""

    max_entries: int = 4096
    #: runs answered from the memo / solved and remembered / not keyable (solved as usual)
    hits: int = 0
    misses: int = 0
    unkeyed: int = 0
    #: solver seconds the hits did not spend (the first runs' times)
    saved_s: float = 0.0
    entries: OrderedDict[bytes, _Outcome] = field(default_factory=OrderedDict)

    def stats(self) -> dict[str, Any]:
        return {
            "highs_runs": self.hits + self.misses + self.unkeyed,
            "highs_memo_hits": self.hits,
            "highs_solved": self.misses + self.unkeyed,
            "highs_saved_s": round(self.saved_s, 3),
        }


@dataclass(frozen=True)
class _Outcome:
    """One HiGHS run's outcome, as its getters return it."""

    run_status: Any
    model_status: Any
    info: dict[str, Any]
    solution: dict[str, Any]
    seconds: float
    time_limit: float  # the option in force (inf: none)


_MEMO: contextvars.ContextVar[SolveMemo | None] = contextvars.ContextVar(
    "greenctl_highs_memo", default=None
)


@contextlib.contextmanager
def solve_memo(max_entries: int = 4096) -> Iterator[SolveMemo]:
    """Within the block, HiGHS runs of a problem already run in the block are answered from
    memory (see the module docstring); nested blocks share the outer memo.

    A problem is keyed by everything that decides HiGHS's answer: the model passed whole
    (``passModel(HighsLp)``: costs, bounds, matrix, integrality, sense, offset), every
    option set on the object, and the start (``setSolution``). A run stopped by a time or
    iteration limit is not reused; an optimal or infeasible one is reused under any time
    limit at least as long as that run took. An object the memo cannot key (a model built
    call by call, a second run after a change) is solved as usual. Up to ``max_entries``
    outcomes are kept, the least recently used dropped first. Also a decorator
    (``@solve_memo()``): each call of the function runs in one block.
    """
    outer = _MEMO.get()
    if outer is not None:
        yield outer
        return
    memo = SolveMemo(max_entries=max_entries)
    token = _MEMO.set(memo)
    try:
        yield memo
    finally:
        _MEMO.reset(token)


def active_memo() -> SolveMemo | None:
    """The :func:`solve_memo` in force here, if any."""
    return _MEMO.get()


def _array_bytes(values: Any, dtype: str) -> bytes:
    import numpy as np

    return np.ascontiguousarray(np.asarray(values, dtype=dtype)).tobytes()


def _lp_key(lp: Any) -> bytes | None:
    """A digest of everything in a ``HighsLp`` that decides a solve (None: not keyable)."""
    import highspy

    if not isinstance(lp, highspy.HighsLp):
        return None
    a = lp.a_matrix_
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((lp.num_col_, lp.num_row_, str(lp.sense_), float(lp.offset_))).encode())
    h.update(repr((str(a.format_), int(a.num_col_), int(a.num_row_))).encode())
    for values, dtype in (
        (lp.col_cost_, "f8"),
        (lp.col_lower_, "f8"),
        (lp.col_upper_, "f8"),
        (lp.row_lower_, "f8"),
        (lp.row_upper_, "f8"),
        (a.start_, "i8"),
        (a.index_, "i8"),
        (a.value_, "f8"),
        ([int(t) for t in lp.integrality_], "i8"),
    ):
        b = _array_bytes(values, dtype)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


_SOLUTION_FIELDS = ("value_valid", "dual_valid", "col_value", "col_dual", "row_value", "row_dual")


def _snapshot_info(info: Any) -> dict[str, Any]:
    return {k: getattr(info, k) for k in dir(info) if not k.startswith("_")}


class _MemoHighs:
    """A ``highspy.Highs`` whose ``run()`` is answered from the active :class:`SolveMemo`
    when the same problem ran before (see :func:`solve_memo`).

    It keys the object's problem as it is built (``passModel`` of a whole ``HighsLp``,
    ``setSolution``, ``setOptionValue``); any other call before the run makes the object
    unkeyable. After a run answered from memory, the status, info and solution getters
    return that outcome; any other attribute first solves for real, then delegates.
    """

    def __init__(self, h: Any, memo: SolveMemo, options: dict[str, Any]) -> None:
        self._h = h
        self._memo = memo
        # the time limit is no part of the key: a finished run is reused under a limit at
        # least as long as it took (a run stopped by its limit is not kept)
        keyed = sorted((k, v) for k, v in options.items() if k != "time_limit")
        self._parts: list[bytes] | None = [repr(keyed).encode()]
        self._time_limit = float(options.get("time_limit", float("inf")))
        self._model = False
        self._ran = False
        self._hit: _Outcome | None = None

    # -- building the problem (keyed) -----------------------------------------------------------
    def passModel(self, *args: Any, **kwargs: Any) -> Any:
        key = _lp_key(args[0]) if len(args) == 1 and not kwargs else None
        if key is None or self._model or self._ran:
            self._parts = None
        elif self._parts is not None:
            self._parts.append(b"lp" + key)
            self._model = True
        return self._h.passModel(*args, **kwargs)

    def setSolution(self, *args: Any, **kwargs: Any) -> Any:
        import highspy

        sol = args[0] if len(args) == 1 and not kwargs else None
        if not isinstance(sol, highspy.HighsSolution) or self._ran:
            self._parts = None
        elif self._parts is not None:
            self._parts.append(
                b"start"
                + repr((bool(sol.value_valid), bool(sol.dual_valid))).encode()
                + _array_bytes(sol.col_value, "f8")
                + _array_bytes(sol.row_value, "f8")
            )
        return self._h.setSolution(*args, **kwargs)

    def setOptionValue(self, key: str, value: object) -> Any:
        if self._ran:
            self._parts = None
        elif key == "time_limit":
            self._time_limit = float(value)  # type: ignore[arg-type]
        elif self._parts is not None:
            self._parts.append(repr((key, value)).encode())
        return self._h.setOptionValue(key, value)

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> Any:
        import highspy

        memo = self._memo
        if self._ran or not self._model or self._parts is None:
            if not self._ran:
                memo.unkeyed += 1
            self._materialise()
            self._parts = None
            self._ran = True
            return self._h.run()
        self._ran = True
        key = hashlib.blake2b(b"\0".join(self._parts), digest_size=20).digest()
        got = memo.entries.get(key)
        if got is not None and got.seconds <= self._time_limit:
            memo.entries.move_to_end(key)
            memo.hits += 1
            memo.saved_s += got.seconds
            self._hit = got
            return got.run_status
        t0 = time.perf_counter()
        status = self._h.run()
        seconds = time.perf_counter() - t0
        memo.misses += 1
        ms = highspy.HighsModelStatus
        model_status = self._h.getModelStatus()
        if model_status in (ms.kOptimal, ms.kInfeasible, ms.kUnboundedOrInfeasible):
            sol = self._h.getSolution()
            memo.entries[key] = _Outcome(
                status,
                model_status,
                _snapshot_info(self._h.getInfo()),
                {k: getattr(sol, k) for k in _SOLUTION_FIELDS},
                seconds,
                self._time_limit,
            )
            while len(memo.entries) > memo.max_entries:
                memo.entries.popitem(last=False)
        return status

    def _materialise(self) -> None:
        """Solve for real when a remembered outcome stood in for this object's run."""
        if self._hit is not None:
            self._hit = None
            self._h.run()

    # -- reading the outcome -----------------------------------------------------------------------
    def getModelStatus(self) -> Any:
        return self._hit.model_status if self._hit is not None else self._h.getModelStatus()

    def getInfo(self) -> Any:
        if self._hit is None:
            return self._h.getInfo()
        return SimpleNamespace(**self._hit.info)

    def getSolution(self) -> Any:
        if self._hit is None:
            return self._h.getSolution()
        import highspy

        sol = highspy.HighsSolution()
        for k, v in self._hit.solution.items():
            setattr(sol, k, list(v) if isinstance(v, list) else v)
        return sol

    def modelStatusToString(self, status: Any) -> Any:
        return self._h.modelStatusToString(status)

    def __getattr__(self, name: str) -> Any:
        # anything else reads or changes the real object: it must hold the real outcome
        self._materialise()
        if not self._ran:
            self._parts = None
        return getattr(self._h, name)


def _set(h: Any, key: str, value: object) -> None:
    import highspy

    if h.setOptionValue(key, value) == highspy.HighsStatus.kError:
        raise ValueError(f"HiGHS refused option {key}={value!r}")


def highs_outcome(h: Any, *, what: str, limits: bool = False) -> str:
    """What a HiGHS run ``h`` (after ``run()``) came to, from its model status.

    ``what`` names the problem for the error message ("the geo LP", ...). With ``limits`` the
    caller keeps an incumbent found before a time or iteration limit; otherwise a limit fails.

    Returns:
        :data:`OPTIMAL`; :data:`INFEASIBLE` (the caller raises its own ``InfeasiblePlan``); with
        ``limits``, :data:`LIMIT` (check the primal solution status for an incumbent).
    Raises:
        GreenctlError: any other status (solve error, unbounded, ...): exit code 1.
    """
    import highspy

    ms = highspy.HighsModelStatus
    st = h.getModelStatus()
    if st == ms.kOptimal:
        return OPTIMAL
    # greenctl's models are bounded (every column that improves the objective has a finite
    # bound or is tied to one by its rows), so "infeasible or unbounded" is infeasible
    if st in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
        return INFEASIBLE
    if limits and st in (ms.kTimeLimit, ms.kIterationLimit, ms.kInterrupt):
        return LIMIT
    raise solver_failed(what, f"HiGHS model status '{h.modelStatusToString(st)}'", st == ms.kNotset)


def solver_failed(what: str, status: str, not_run: bool = False) -> SolverError:
    """The error of a solver that stopped without an answer (exit 1, not an infeasible plan)."""
    hint = "this is a solver failure, not an infeasible plan; please report it with the command"
    if not_run:
        hint = (
            "HiGHS did not solve (in a process that embeds greenctl, another HiGHS user may "
            f"have started HiGHS's thread pool with a size other than {HIGHS_THREADS}); " + hint
        )
    return SolverError(f"the solver failed on {what}: {status}", hint=hint)


def pulp_highs(options: Mapping[str, object] | None = None) -> Any:  # -> pulp.HiGHS
    """pulp's HiGHS interface (highspy in this process) on an object from :func:`new_highs`.

    After ``prob.solve(solver)``, ``prob.solverModel`` is that ``Highs``: read its status
    with :func:`highs_outcome`.
    """
    import pulp

    class GreenctlHiGHS(pulp.HiGHS):  # type: ignore[misc, valid-type]
        def createAndConfigureSolver(self, lp: Any) -> None:
            lp.solverModel = new_highs(options)

    return GreenctlHiGHS(msg=False)


def find_cbc() -> str | None:
    """A CBC executable: the ``cbcbox`` package (``pulp[cbc]``), else ``cbc`` on PATH, else
    the copy PuLP 3 bundles (PuLP 4 drops it); None when there is none."""
    try:
        import cbcbox

        with stdout_fd_silenced():  # cbcbox prints the build it picked when asked to
            path = str(cbcbox.cbc_bin_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # not installed, or no build for this machine
        pass
    on_path = shutil.which("cbc")
    if on_path:
        return on_path
    try:
        from pulp.apis import coin_api
    except ImportError:
        return None
    bundled = getattr(coin_api, "pulp_cbc_path", None)
    if bundled:
        bundled = coin_api.COIN_CMD.executableExtension(bundled)
        if os.path.isfile(bundled) and os.access(bundled, os.X_OK):
            return str(bundled)
    return None


def require_cbc() -> str:
    """The CBC executable's path.

    Raises:
        InputError: no CBC is installed (``--solver cbc`` cannot run here).
    """
    path = find_cbc()
    if path is None:
        raise InputError("--solver cbc: no CBC solver is installed", hint=CBC_INSTALL_HINT)
    return path


def cbc_solver(
    *, time_limit_s: float | None, gap_rel: float, gap_abs: float
) -> Any:  # -> pulp.COIN_CMD
    """pulp's CBC command (a child process, its output discarded), one thread.

    Raises:
        InputError: no CBC is installed.
    """
    import pulp

    return pulp.COIN_CMD(
        path=require_cbc(),
        msg=False,
        timeLimit=time_limit_s,
        gapRel=gap_rel,
        gapAbs=gap_abs,
        threads=1,
    )


def pulp_solve(prob: Any, solver: Any, *, what: str) -> None:
    """``prob.solve(solver)`` with pulp's failures (CBC crashed, not runnable) as greenctl's."""
    import pulp

    try:
        prob.solve(solver)
    except pulp.PulpSolverError as exc:
        raise solver_failed(what, f"{solver.name}: {exc}") from None


def pulp_outcome(prob: Any, *, what: str, time_limit_s: float | None) -> str:
    """What a pulp solve (CBC) came to: :data:`OPTIMAL`, :data:`INFEASIBLE` or
    :data:`LIMIT` (stopped at the time limit; ``prob.sol_status`` says whether with an
    incumbent).

    Raises:
        GreenctlError: unbounded, undefined, or not solved without a time limit to blame.
    """
    import pulp

    sol = prob.sol_status
    if prob.status == pulp.LpStatusInfeasible or sol == pulp.LpSolutionInfeasible:
        return INFEASIBLE
    if sol == pulp.LpSolutionOptimal:
        return OPTIMAL
    if sol == pulp.LpSolutionIntegerFeasible:
        return LIMIT
    if prob.status == pulp.LpStatusNotSolved and time_limit_s is not None:
        return LIMIT
    raise solver_failed(what, f"pulp status '{pulp.LpStatus.get(prob.status, prob.status)}'")
