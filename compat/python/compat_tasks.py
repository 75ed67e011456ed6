"""Job functions imported by the RQ worker (it imports jobs by dotted path)."""


def add(a, b):
    return a + b


def concat(*parts):
    return "-".join(str(p) for p in parts)


def sleep_for(seconds):
    """A long job for the worker-command check: stopped or killed before it ends."""
    import time

    time.sleep(seconds)
    return seconds
