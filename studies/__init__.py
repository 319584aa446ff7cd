"""One-off studies and paper sweeps: each folder asks one question and holds its script, test and answer
(studies/README.md). Outside the wheel; run them from the repository root as `python -m studies.<name>.<module>`."""
