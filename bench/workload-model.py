#!/usr/bin/env python3
"""bench/workload-model.py — the hit ratio each coherence rule allows on
bench/workload.sh's load, with no proxy in the way (a model, not a run).

bcast: a key is cached after any access (a fill, or the proxy's own write).
optin (the default since issue #45): after a read, and after an own write
only if the key was read before (a key first written, never read, leaves
the L1 once its write lands; its first read misses). The measured
default/bcast ratios in bench/results/workload-matrix*.md match this model
to ±0.01, so what is left of the gap is the rule, not the implementation.

Usage: bench/workload-model.py [KEYS S WRITE_FRACTION WARM_OPS OPS] ...
(default: the 50% rows of the matrix).
"""
import bisect
import itertools
import random
import sys


def model(keys, s, w, warm, ops, seed=1):
    rng = random.Random(seed)
    cdf = list(itertools.accumulate(1 / (i + 1) ** s for i in range(keys)))
    bcast, optin, read = set(), set(), set()
    hits_b = hits_o = reads = 0
    for i in range(warm + ops):
        k = bisect.bisect_left(cdf, rng.random() * cdf[-1])
        if rng.random() < w:
            bcast.add(k)
            if k in read:
                optin.add(k)
            else:
                optin.discard(k)
        else:
            if i >= warm:
                reads += 1
                hits_b += k in bcast
                hits_o += k in optin
            bcast.add(k)
            optin.add(k)
            read.add(k)
    return hits_b / reads, hits_o / reads


def main():
    args = sys.argv[1:]
    runs = (
        [tuple(args[i : i + 5]) for i in range(0, len(args), 5)]
        if args
        else [
            (10_000, 0.99, 0.5, 0, 80_000),
            (1_000_000, 0.99, 0.5, 0, 80_000),
            (1_000_000, 0.99, 0.5, 80_000, 80_000),
            (1_000_000, 0.99, 0.5, 800_000, 80_000),
        ]
    )
    print("| keys | s | writes | warm-up ops | bcast | optin | optin/bcast |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for keys, s, w, warm, ops in runs:
        b, o = model(int(keys), float(s), float(w), int(warm), int(ops))
        print(f"| {int(keys):,} | {s} | {float(w):.0%} | {int(warm):,} | {b:.3f} | {o:.3f} | {o / b:.3f} |")


if __name__ == "__main__":
    main()
