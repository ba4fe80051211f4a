"""Hardware discovery (NVML, CPU), the measurement harness, energy meters, the model catalog."""
