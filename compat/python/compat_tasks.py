"""Job functions imported by the RQ worker (it imports jobs by dotted path)."""


def add(a, b):
    return a + b


def concat(*parts):
    return "-".join(str(p) for p in parts)
