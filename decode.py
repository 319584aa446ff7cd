"""Generate text with lsjax: `python decode.py --help` (the same as `lsjax-decode`; `lsjax.cli.decode`)."""

import time

LAUNCHED = time.perf_counter()  # before any heavy import: what "seconds since launch" counts from

from lsjax.cli.decode import run_program  # noqa: E402

if __name__ == "__main__":
    run_program(launched=LAUNCHED)
