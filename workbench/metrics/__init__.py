"""What the engine measured: per request (TTFT, ITL, TPOT, e2e, acceptance) and per step, as pandas frames."""
