"""The MIG planner (Clover): its problem, model, exact solver, annealer, random search and the
simulation that scores layouts."""
