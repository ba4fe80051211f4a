"""Pure planning: problem in, plan out (mix, mig, glet, geo) and the shared evaluation core."""
