"""Keeping plans right: the control loop and replay.

The loop observes (the carbon signal, the dispatcher's counters: :mod:`.history`), forecasts
load (:mod:`.forecasters`), decides (replans through the planners: :mod:`.replan`) and
reconciles (applies through the executor), recording why; :mod:`.cron` runs it periodically
and :mod:`.demo` runs it end to end. :mod:`.replay` replays it over a trace (what-if), each
kind's step in :mod:`.replay_kinds`. No typer or rich: the commands in ``cli/forecast.py``,
``cli/replan.py``, ``cli/demo.py`` and ``cli/replay.py`` are thin wrappers over the functions
here, which take keyword-only options and return plain data.
"""
