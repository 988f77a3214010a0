"""Measuring models on a live Triton: load drivers, memory probes, the run, the HTML report."""
