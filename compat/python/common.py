"""Shared plumbing for the compat checks: where to connect, and the PASS/FAIL line.

Every check program is run as `python PROG.py CHECK` by ../run.sh with
COMPAT_HOST, COMPAT_PORT (the endpoint under test: sidecache or the control
redis-server) and COMPAT_PREFIX (unique per check and endpoint, used for key
and queue names). It prints exactly one final line, `PASS <what was checked>`
or `FAIL <what went wrong>`, and exits 0 or 1. A PASS line ends with
`[note: …]` when a library's background thread died during the check. Tracebacks go to stderr, which
run.sh keeps in the log directory.
"""

import os
import signal
import sys
import threading
import traceback

HOST = os.environ.get("COMPAT_HOST", "127.0.0.1")
PORT = int(os.environ.get("COMPAT_PORT", "6379"))
PREFIX = os.environ.get("COMPAT_PREFIX", "compat")
URL = f"redis://{HOST}:{PORT}/0"


class CheckFailed(Exception):
    """A check ran but saw the wrong value."""


def expect(actual, wanted, what):
    if actual != wanted:
        raise CheckFailed(f"{what}: got {actual!r}, wanted {wanted!r}")


def _sigterm(_signum, _frame):
    # `timeout` sends SIGTERM; turn it into an exception so `finally` blocks
    # (which stop worker subprocesses) still run.
    raise SystemExit("killed by SIGTERM (timeout)")


_thread_errors = []


def _thread_excepthook(args):
    # A library's background thread dying does not fail the check by itself
    # (the job may still run), but it must not go unnoticed: the PASS line
    # names it.
    _thread_errors.append(" ".join(f"{args.exc_type.__name__}: {args.exc_value}".split()))
    threading.__excepthook__(args)


def main(checks):
    """Run the check named by argv[1] (a function returning a short summary)."""
    signal.signal(signal.SIGTERM, _sigterm)
    threading.excepthook = _thread_excepthook
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in checks:
        print(f"FAIL unknown check {name!r}; known: {', '.join(checks)}")
        sys.exit(2)
    try:
        summary = checks[name]()
    except BaseException as e:  # noqa: BLE001 - everything is a FAIL line
        traceback.print_exc()
        text = " ".join(f"{type(e).__name__}: {e}".split())
        print(f"FAIL {text[:400]}", flush=True)
        sys.exit(1)
    if _thread_errors:
        summary += f" [note: a background thread died: {'; '.join(sorted(set(_thread_errors)))}]"
    print(f"PASS {summary}", flush=True)
    sys.exit(0)


class Worker:
    """A worker subprocess (`celery … worker`, `rq worker`) whose output is kept.

    It stays in our process group, so run.sh's `timeout` stops it with us.
    The output goes to a temp file; `stop()` copies it to our stderr (the
    check's log), and `last_error()` names the error that stopped it.
    """

    def __init__(self, args):
        import subprocess
        import tempfile

        here = os.path.dirname(os.path.abspath(__file__))
        self._out = tempfile.NamedTemporaryFile("w+", prefix="compat-worker-", suffix=".log")
        self.proc = subprocess.Popen(
            args, cwd=here, env=dict(os.environ, PYTHONPATH=here),
            stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
        )

    def exited(self):
        """A CheckFailed describing the exit, or None while it runs."""
        if self.proc.poll() is None:
            return None
        return CheckFailed(f"worker exited with status {self.proc.returncode}: {self.last_error()}")

    def last_error(self):
        self._out.flush()
        with open(self._out.name, errors="replace") as f:
            lines = [line.strip() for line in f]
        errors = [line for line in lines if "Error" in line and ": " in line]
        return errors[-1] if errors else (lines[-1] if lines else "no output")

    def stop(self):
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        with open(self._out.name, errors="replace") as f:
            sys.stderr.write("---- worker output ----\n" + f.read() + "---- end of worker output ----\n")
        self._out.close()
