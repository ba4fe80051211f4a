"""The variant-mix planner (InfAdapter/INFaaS): its problem model, the joint ILP and the
decomposed solve."""
