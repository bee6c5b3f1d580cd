"""`build_program` of the data-parallel policies as it stood before its per-kernel work was trimmed: the oracle
tests/test_stream_engine_identity.py compares the fast one with on generated networks. Not used by the package."""

from __future__ import annotations

from layerpipe.dfg import Task
from layerpipe.schedule._dataparallel import _NOT_LOCAL, DPPlan
from layerpipe.schedule._ir import Op
from layerpipe.schedule._stream_engine import Program


def reference_build_program(p: DPPlan, steps: int) -> Program:
    """The kernels and ring transfers of `steps` steps (see the module docstring), as a stream-engine
    `Program` with one device of one lane per replica: a kernel of c cycles is c units of work."""
    n, net, graph = p.num_procs, p.network, p.graph
    prog = Program([1] * n, [1] * n)
    local: dict[Task, list[Task]] = {t: [] for t in graph.tasks}
    for e in graph.edges:
        if e.role not in _NOT_LOCAL and e.delay == 0:
            local[e.dst].append(e.src)
    first = set(p.first)
    item: dict[tuple[int, str, int, int], int] = {}  # (replica, kind, layer, t or step) → item
    done_at: dict[tuple[int, int, int], int] = {}  # (replica, layer, step) → item when its gradient is reduced

    def add(rep: int, kind: str, layer: int, t: int, step: int) -> None:
        task = graph.task_of(layer, kind)
        if task is None:
            return
        deps = [item[(rep, s.kind, s.layer, t)] for s in local[task]]
        if kind in "FE" and step > 0 and (rep, "U", layer, step - 1) in item:
            deps.append(item[(rep, "U", layer, step - 1)])
        prog.kernel(Op(rep, kind, layer, t), rep, 0, p.costs[task], 1, 0, deps)
        item[(rep, kind, layer, t)] = prog.num_items - 1

    def update(rep: int, layer: int, step: int) -> None:
        t = step * n + rep
        deps = [done_at[(rep, layer, step)]]
        deps += [item[(rep, k, layer, t)] for k in "FE" if (rep, k, layer, t) in item]  # write after read
        if step > 0:
            deps.append(item[(rep, "U", layer, step - 1)])
        task = graph.task_of(layer, "U")
        assert task is not None
        prog.kernel(Op(rep, "U", layer, step), rep, 0, p.costs[task], 1, 0, deps)
        item[(rep, "U", layer, step)] = prog.num_items - 1

    layers = [layer.index for layer in net.layers]
    for step in range(steps):
        for rep in range(n):
            t = step * n + rep
            for layer in layers:
                if layer in first and step > 0:
                    update(rep, layer, step - 1)  # gated: the update lands just before F_i
                add(rep, "F", layer, t, step)
            for layer in reversed(layers):
                for kind in "AE":
                    add(rep, kind, layer, t, step)
                if layer not in first:
                    add(rep, "G", layer, t, step)
            for layer in p.first:
                add(rep, "G", layer, t, step)
        for group in p.all_reduces:
            grads = {rep: [item[(rep, "G", layer, step * n + rep)] for layer in group] for rep in range(n)}
            if n == 1:
                for layer, g in zip(group, grads[0], strict=True):
                    done_at[(0, layer, step)] = g  # one replica: nothing to reduce
                continue
            words = -(-sum(net.layer(layer).weight_count for layer in group) // n)
            ring = [(rep, (rep + 1) % n) for rep in range(n)]
            priority = min(group) if p.comm_priority else 0
            # Round s: every replica sends to the next one, after its gradients and (from the second round on)
            # what it received in round s − 1, from replica rep − 1: item sent + (rep − 1) mod n of that round.
            sent = prog.transfers(ring, words, [tuple(grads[rep]) for rep in range(n)], priority)
            for _ in range(2 * (n - 1) - 1):
                sent = prog.transfers(ring, words, [(*grads[rep], sent + (rep - 1) % n) for rep in range(n)],
                                      priority)
            for rep in range(n):
                for layer in group:
                    done_at[(rep, layer, step)] = sent + (rep - 1) % n
        for rep in range(n):
            for layer in reversed(layers):
                if net.layer(layer).has_weights and layer not in first:
                    update(rep, layer, step)
            if step == steps - 1:
                for layer in p.first:
                    update(rep, layer, step)  # the last step's gated updates: no next forward to wait for
    return prog
