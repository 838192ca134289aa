"""The sample order's memory and first-batch time at N = 1e6, 1e8, 1e9 samples (issue 32).

Each case runs in a fresh Python process: it builds the sampler of a flat corpus of N samples and
asks for the first global batch, timed; memory is the rise of the process's peak resident set
(ru_maxrss) over the same process just before, and (new order) the bytes the order object holds.
`new` is data.order=feistel (computed); `old` is data.order=randperm (torch.randperm(N) as a list,
what every run did before), run only up to --old-max (at 1e8 it would hold ~4 GB per rank).
A mixture of three sources at the same total N is measured as well.

    .venv/bin/python -m benchmarks.sampler_scale
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASE = r"""
import json, resource, sys, time
n, order, global_size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
import numpy as np, torch
from launcher.data.sampler import GlobalBatchSampler, MixtureSampler
from launcher.data.mixture import MixtureDataset
class Sized:
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
torch.set_num_threads(1)
before = peak()
start = time.perf_counter()
if order == "mixture":
    parts = [n // 2, n // 3, n - n // 2 - n // 3]
    ds = MixtureDataset(["web", "code", "books"], [0.5, 0.3, 0.2], [Sized(p) for p in parts])
    sampler = MixtureSampler(ds, global_size, seed=0)
else:
    sampler = GlobalBatchSampler(n, global_size, seed=0, order=order)
batch = sampler.global_batch(0)
first = time.perf_counter() - start
start = time.perf_counter()
for step in range(1, 101):
    sampler.global_batch(step)
later = (time.perf_counter() - start) / 100
print(json.dumps({"n": n, "order": order, "first_batch_s": first, "next_batch_s": later,
                  "rss_rise_bytes": peak() - before}))
"""


def run_case(n: int, order: str, global_size: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CASE, str(n), order, str(global_size)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e8, 1e9])
    parser.add_argument("--old-max", type=float, default=1e7, help="largest N for randperm")
    parser.add_argument("--global-size", type=int, default=1024)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for n in [int(s) for s in args.sizes]:
        for order in ("feistel", "mixture", "randperm"):
            if order == "randperm" and n > args.old_max:
                continue
            rows.append(run_case(n, order, args.global_size))
    print(f"global batch {args.global_size}; one CPU thread")
    print("| N | order | first batch ms | next batches ms | peak RSS rise MiB |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['n']:.0e} | {r['order']} | {r['first_batch_s'] * 1e3:.2f} | "
            f"{r['next_batch_s'] * 1e3:.3f} | {r['rss_rise_bytes'] / 2**20:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
