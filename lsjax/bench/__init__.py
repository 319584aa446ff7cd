"""Benchmarks; run each as `python -m lsjax.bench.<name>`."""
