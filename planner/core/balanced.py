"""The balanced objective's defaults, shared by every kind that offers it (mix, llm):
maximise quality less weighted resources (alpha), latency (beta) and carbon (gamma)."""

from __future__ import annotations

#: InfAdapter's alpha/beta; gamma chosen so that a plan with the reference plan's carbon
#: costs as much as 0.05 of accuracy
DEFAULT_ALPHA = 0.05
DEFAULT_BETA = 0.001
DEFAULT_GAMMA = 0.05
#: Carbon intensity the balanced objective's carbon term is normalised at (gCO2/kWh), an
#: order-of-magnitude world grid average; a grid dirtier than this weighs carbon more.
REFERENCE_CARBON_INTENSITY = 400.0
