"""The geographic load-allocation planner (eGLB): the offline and online allocation and its LPs."""
