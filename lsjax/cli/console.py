"""What the command lines show on a terminal: a ticking status line while something long runs, one line and
status 130 on Ctrl-C, the process's end as soon as its output is out, and how programs were made ready."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


class Ticker:
    """Elapsed seconds on stderr while something long runs in this thread (XLA compiling, which releases
    the GIL): on a terminal one line rewritten every second and cleared at the end, else a line every
    `every` seconds (a log, a pipe, `--json`)."""

    def __init__(self, label, every: float = 5.0):
        self.every, self.tty = every, sys.stderr.isatty()
        self._state = (label, 0.0)  # (label, start): one tuple, so the thread never pairs a new label with an old start
        self._stop = threading.Event()

    @property
    def label(self):
        return self._state[0]

    @label.setter
    def label(self, label):
        self._state = (label, self._state[1])

    def __enter__(self):
        self._state = (self.label, time.perf_counter())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(1.0 if self.tty else self.every):
            label, t0 = self._state
            label = label() if callable(label) else label  # (a label that follows what it reports)
            line = f"[lsjax] {label}: {time.perf_counter() - t0:.0f}s"
            sys.stderr.write(f"\r{line}\033[K" if self.tty else line + "\n")
            sys.stderr.flush()

    def __exit__(self, *exc):
        self.stop()

    def restart(self, label):
        """Counts again from 0 under a new label (a string, or a function returning one at each tick)."""
        self._state = (label, time.perf_counter())

    def stop(self):
        """Ends the ticker (once; later calls do nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def exit_on_interrupt(prog: str = "decode.py") -> None:
    """Ctrl-C (SIGINT) prints one line and exits with status 130 at once, even while XLA compiles (Python
    would raise KeyboardInterrupt only when the compile returns, as a long traceback): the signal's wakeup fd
    wakes a thread that exits. Only for the program's own process."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.signal(signal.SIGINT, lambda *_: None)  # the main thread carries on; the thread below ends it
    signal.set_wakeup_fd(w)

    def watch():
        while signal.SIGINT not in os.read(r, 64):
            pass
        os.write(2, (("\n" if sys.stderr.isatty() else "") + f"{prog}: interrupted\n").encode())
        os._exit(130)

    threading.Thread(target=watch, daemon=True, name="sigint").start()


def exit_now(code: int) -> None:
    """Ends the process as soon as its output is out. Whatever is left then is work nobody waits for: a program
    still loading in the background (its thread is not a daemon, so Python's exit would wait for XLA to finish
    reading it) and tearing down the loaded executables. Programs compiled in the background are stored before
    this (`Generator.finish`), and the weights a first start keeps are waited for here (`lsjax.runtime.weights`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    weights = sys.modules.get("lsjax.runtime.weights")
    if weights is not None:
        weights.wait()  # a first start's weights, kept for the next start (`weights.defer_writes`)
    os._exit(code)


def rate(tokens_per_s: float) -> str:
    """A rate with at least 3 significant digits below 100 (0.42, 7.31, 42.1), whole above."""
    return f"{tokens_per_s:.0f}" if tokens_per_s >= 100 else f"{tokens_per_s:.3g}"


def programs_json(log) -> list[dict]:
    return [{"name": p.name, "how": p.how, "s": round(p.seconds, 3)} for p in log]


def programs_said(log) -> str:
    """'start loaded, decode compiled (46.8s)': how each program was made ready, seconds where they count."""
    return ", ".join(f"{p.name} {p.how}" + (f" ({p.seconds:.1f}s)" if p.seconds >= 1 else "") for p in log)


def loading_label(drafter, programs: int = 1) -> str:
    """What the ticker says while decode programs load from the compile cache (not compiled). Split
    (`programs` > 1): a split of two (or any beside an accelerator) loads every group at once; a larger one
    loads AR's group beside the prefill and the others as auto asks for them (`lsjax.runtime.split.loading`)."""
    from lsjax.runtime import beside_device
    from lsjax.runtime.split import loading

    names = [n for n in getattr(drafter, "cost_names", None) or () if n != "shadow"]
    if names and programs > 1 and loading(True, beside_device(), programs, one_decode=True)["eager"]:
        return f"loading auto's {programs} programs from the compile cache"
    if names and programs > 1:
        return f"loading auto's first program from the compile cache ({programs - 1} more as it asks for them)"
    what = f"auto's program ({len(names)} candidates)" if names else "the decode program"
    return f"loading {what} from the compile cache"


# A first start at a prompt width on a CPU, at T = 0 (`Generator.stands_in`): AR's programs compile in ~AR's
# time and the method's after the output.
STAND_IN_LABEL = "compiling AR's programs (this prompt width's first start; auto's compile after the output)"


def compiling_label(drafter, programs: int = 1) -> str:
    """What the compile ticker says: auto compiles all its candidates, into one program (the engine switches
    over them on device) or one per node-count group (`programs`), so it names them; it cannot say which one
    XLA is at."""
    names = getattr(drafter, "cost_names", None)
    if not names:
        return "compiling"
    steps = [n for n in names if n != "shadow"]
    into = f"as {programs} programs" if programs > 1 else "into one program"
    return f"compiling auto's {len(steps)} candidates ({', '.join(steps)}) {into}"
