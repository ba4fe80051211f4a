"""The spatio-temporal GPU-sharing planner (gpulet): its model, the schedule, the ideal bound and
the verification of a schedule, and how a new schedule moves the running one's glets."""
