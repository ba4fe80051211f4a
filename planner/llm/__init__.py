"""Planning LLM serving: instances per quality tier and each tier's share of requests under
time-to-first-token and time-per-output-token SLOs (Quality Time's problem, in tokens)."""
