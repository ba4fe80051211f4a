"""The evaluation core every planner, predict, simulate and verify share: service-time models,
queueing and latency, the simulator, dispatch policies, solver construction, loads, forecasts,
interference and synthetic profiles."""
