"""A tour of layerpipe's public API (docs/api.md explains each step). Run from anywhere:

    python examples/api_tour.py [OUT_DIR]

It loads a small MLP, schedules it under LayerPipe and PipeDream on two processors joined by links,
checks the LayerPipe schedule on the cycle-accurate simulator, asks retiming for the gradient delays of a
two-stage split, writes the training graph as DOT, and generates the accelerator's Verilog (when the hdl
extra, amaranth, is installed). Everything it prints comes from the run; nothing is hard-coded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import layerpipe


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)

    # 1. A network: a zoo name, mlp:W0-W1-..., a YAML file, or layerpipe.from_torch(module, input_shape).
    net = layerpipe.load_network("mlp:8-8-4")
    print(f"network {net.name}: {len(net)} layers, {net.total_weights} weights")

    # 2. A cost model and an interconnect: every figure below belongs to this pair.
    model = layerpipe.make_cost_model("pe", lanes=4, overhead=2)
    link = layerpipe.parse_interconnect("links:2:4")  # latency 2 cycles, 4 words per cycle
    print(f"cost model {model.name}, interconnect {link.spec}")

    # 3. Schedules: one policy, then a comparison on the same model and interconnect.
    result = layerpipe.make_schedule("layerpipe", net, 2, model, interconnect=link)
    print(f"layerpipe: {result.metrics.cycles_per_sample:.1f} cycles/sample, "
          f"max staleness {result.metrics.max_staleness}")
    table = layerpipe.compare(net, 2, ["layerpipe", "pipedream"], model=model, interconnect=link)
    for name, res in table.items():
        print(f"  {name:10s} {res.metrics.cycles_per_sample:8.1f} cycles/sample "
              f"{res.metrics.traffic_words_per_sample:8.1f} words/sample")

    # 4. The simulator runs the schedule on the interconnect it was made for.
    run = layerpipe.simulate(result, net, model, iterations=8)
    print(f"simulated 8 iterations: {run.total_cycles} cycles, steady state "
          f"{run.cycles_per_iteration:.1f} cycles/iteration")

    # 5. Retiming: the gradient delays D_l that pipeline a two-stage split (design notes §4).
    graph = layerpipe.build_training_graph(net)
    delays = layerpipe.solve_delays(graph, [0, 1], model)
    print(f"delays for stages [0, 1]: {dict(delays.delays)}")

    # 6. The training graph as a file Graphviz opens (dot -Tsvg training.dot > training.svg).
    from layerpipe.network import to_dot

    (out_dir / "training.dot").write_text(to_dot(graph.to_networkx(model)))
    print(f"wrote {out_dir / 'training.dot'}")

    # 7. RTL: the accelerator that executes the schedule (needs the hdl extra: amaranth).
    try:
        design = layerpipe.make_design(net, "layerpipe", 2, 4, 4)  # policy, PEs, lanes, samples
    except ImportError as exc:
        print(f"skipped RTL: {exc}")
        return
    verilog = layerpipe.export_verilog(design)
    (out_dir / "accel.v").write_text(verilog)
    print(f"wrote {out_dir / 'accel.v'} ({len(verilog.splitlines())} lines)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("api_tour_out"))
