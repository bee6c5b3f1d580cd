"""Prints how long the network front end takes: YAML write/read of the zoo, torch.fx import of ResNet-50
(meta device), and a profile of LeNet-5 per task. Run: .venv/bin/python benchmarks/bench_network_io.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from layerpipe.network import ZOO, dump_yaml, from_torch, parse_yaml_network


def _timed(fn, repeats: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    for name, make in ZOO.items():
        net = make(1)
        t_dump, text = _timed(lambda net=net: dump_yaml(net))
        t_load, _ = _timed(lambda text=text: parse_yaml_network(text))
        print(f"yaml {name:9s} {len(net):3d} layers  dump {t_dump * 1e3:7.2f} ms  load {t_load * 1e3:7.2f} ms")

    import torch

    from tests.test_zoo_torch import Bottleneck, TorchResNet

    with torch.device("meta"):
        module = TorchResNet(Bottleneck, [3, 4, 6, 3])
    t_fx, net = _timed(lambda: from_torch(module, (3, 224, 224)))
    print(f"fx   resnet50  {len(net):3d} layers  import {t_fx * 1e3:7.1f} ms")

    from layerpipe.profile import profile_network

    lenet = ZOO["lenet5"](8)
    start = time.perf_counter()
    model = profile_network(lenet, repeats=5)
    elapsed = time.perf_counter() - start
    total_us = sum(sum(t.values()) for t in model.times_ns.values()) / 1e3
    print(f"profile lenet5 batch 8: {elapsed:.2f} s to measure, {total_us:.0f} µs of tasks per iteration (1 thread)")


if __name__ == "__main__":
    main()
