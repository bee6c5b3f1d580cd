"""How well LayerPipe2's moving-average weight reconstruction (`ema`) stands in for weight stashing.

Run: .venv/bin/python benchmarks/bench_ema.py [--network mlp:16-32-32-16-4] [-n 3] [--samples 400]

For each asynchronous policy the schedule is simulated once per weight mode (the version map depends on
the mode) and trained by the functional simulator. Per backward read it prints the relative error of
the weights E uses against the exact version F used (what `stash` reads):
  stale_err  ‖W^(c) − W^(v)‖ / ‖W^(v)‖ — reading the current weights as is (`latest`);
  ema_err    ‖Ŵ^(v) − W^(v)‖ / ‖W^(v)‖ — the reconstruction Ŵ^(v) = W^(c) + η·(c − v)·ḡ (`ema`).
Then how far each mode's final weights end from the stash run's (relative Frobenius distance over all
layers), the mean loss of the last quarter of the samples, and the functional simulator's speed; last, a
sweep of the moving average's β = 1 − 2^−ema_shift on the layerpipe schedule.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from layerpipe.costs import make_cost_model
from layerpipe.fixedpoint import FixedFormat
from layerpipe.network import Network, load_network
from layerpipe.numerics import init_weights, make_data
from layerpipe.schedule.policies import make_schedule
from layerpipe.sim import SimConfig, Workload, simulate
from layerpipe.sim.functional import FunctionalConfig, FunctionalResult, order_by_start, run_functional

POLICIES = ("layerpipe", "pipedream", "ooo")
MODES = ("stash", "latest", "ema")


def distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    num = sum(float(np.sum((a[k].astype(float) - b[k].astype(float)) ** 2)) for k in b)
    den = sum(float(np.sum(b[k].astype(float) ** 2)) for k in b)
    return (num / den) ** 0.5


def run_policy(network: Network, policy: str, procs: int, samples: int, lr: float,
               fmt: FixedFormat | None) -> None:
    model = make_cost_model("macs")
    result = make_schedule(policy, network, procs, model)
    iterations = samples // network.batch
    schedule = result.ops(iterations)
    workload = Workload.of_graph(result.graph, model)  # type: ignore[arg-type]
    data, init = make_data(network, samples, 0), init_weights(network, 0, fmt)
    runs: dict[str, FunctionalResult] = {}
    staleness = 0
    for mode in MODES:
        timed = simulate(schedule, workload, SimConfig(mode=mode))
        order = order_by_start(zip(timed.ops, timed.start.tolist(), timed.end.tolist(), strict=True))
        staleness = max(staleness, max((t - v for (k, _, t), v in timed.version_map.items() if k == "F"), default=0))
        start = time.perf_counter()
        runs[mode] = run_functional(network, order, timed.version_map, init, data,
                                    FunctionalConfig(mode=mode, lr=lr, fmt=fmt))
        seconds = time.perf_counter() - start
        ops_per_s = len(order) / seconds
    numerics = "float64" if fmt is None else fmt.name
    print(f"{policy:10s} {numerics:7s} max F staleness {staleness:2d}   functional {ops_per_s:,.0f} ops/s")
    latest, ema = runs["latest"], runs["ema"]
    print(f"    per E read   stale_err mean {np.mean(latest.stale_error):.2e} max {np.max(latest.stale_error):.2e}"
          f"   ema_err mean {ema.ema_error_mean:.2e} max {ema.ema_error_max:.2e}"
          f"   (ema/stale mean {ema.ema_error_mean / max(np.mean(ema.stale_error), 1e-300):.2f})")
    quarter = slice(3 * samples // 4, samples)
    for mode in MODES:
        print(f"    {mode:6s}  final weights vs stash {distance(runs[mode].weights, runs['stash'].weights):.2e}"
              f"   mean loss, last quarter {np.mean(runs[mode].losses[quarter]):.4f}")


def sweep_beta(network: Network, policy: str, procs: int, samples: int, lr: float) -> None:
    """The moving average's weight β = 1 − 2^−m against the reconstruction error (float64)."""
    model = make_cost_model("macs")
    result = make_schedule(policy, network, procs, model)
    schedule = result.ops(samples // network.batch)
    timed = simulate(schedule, Workload.of_graph(result.graph, model), SimConfig(mode="ema"))  # type: ignore[arg-type]
    order = order_by_start(zip(timed.ops, timed.start.tolist(), timed.end.tolist(), strict=True))
    data, init = make_data(network, samples, 0), init_weights(network, 0)
    stash = run_functional(network, order, timed.version_map, init, data, FunctionalConfig(mode="stash", lr=lr))
    print(f"{policy} float64, β sweep:")
    for shift in range(0, 7):
        ema = run_functional(network, order, timed.version_map, init, data,
                             FunctionalConfig(mode="ema", lr=lr, ema_shift=shift))
        ratio = ema.ema_error_mean / max(float(np.mean(ema.stale_error)), 1e-300)
        print(f"    ema_shift {shift} (β = {1 - 2.0**-shift:.4f})   ema_err/stale_err mean {ratio:.2f}"
              f"   final weights vs stash {distance(ema.weights, stash.weights):.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="mlp:16-32-32-16-4")
    parser.add_argument("-n", "--procs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=400)
    args = parser.parse_args()
    network = load_network(args.network)
    for policy in POLICIES:
        run_policy(network, policy, args.procs, args.samples, 2.0**-5, None)
        # Q16.8 is the RTL's format; Q24.16 shows what the correction needs: η·s·ḡ above one LSB.
        for fmt in (FixedFormat(16, 8), FixedFormat(24, 16)):
            run_policy(network, policy, args.procs, args.samples, 2.0**-5, fmt)
    sweep_beta(network, "layerpipe", args.procs, args.samples, 2.0**-5)


if __name__ == "__main__":
    main()
