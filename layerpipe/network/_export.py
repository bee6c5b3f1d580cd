"""Graph files a user opens in Graphviz or Gephi: DOT and GraphML of any graph `to_networkx` returns.

Both writers take a networkx (multi)digraph whose nodes carry a `label` attribute (the id written to the
file; `Network.to_networkx` and `TrainingGraph.to_networkx` both set it) and write every node, edge and
graph attribute, in the graph's own order, so the same graph always gives the same bytes.

- GraphML is networkx's writer (`generate_graphml`), after relabelling nodes to their labels: GraphML ids
  are strings, and the attribute types (int, str, bool) are declared as `<key>`s that Gephi reads.
- DOT is written here: networkx's `write_dot` needs pydot or pygraphviz, neither of which the project
  needs otherwise. The writer quotes every id and value (DOT's quoted strings: `"` and `\\` escaped,
  newlines as `\\n`), so a layer named `conv-1.a` or a label with spaces is still one token. Beyond the
  data attributes it adds display hints Graphviz understands: `label` lines with the figures and a
  dashed style on edges that carry delays (the loop edges of a training graph).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["to_dot", "to_graphml"]

#: Node attributes shown on a node's DOT label after its id, in this order, when present.
_NODE_FIGURES = ("name", "kind", "out_shape", "cost", "weights")


def _edge_figures(data: Mapping[str, Any]) -> list[str]:
    """What an edge's DOT label says: its role, its words, its delays (when it has any)."""
    shown = [str(data["role"])] if "role" in data else []
    if "words" in data:
        shown.append(f"{data['words']} words")
    if data.get("delay", 0):
        shown.append(f"{data['delay']} delay" + ("s" if data["delay"] != 1 else ""))
    return shown


def _quote(value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(attrs: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={_quote(value)}" for key, value in attrs.items())


def _ids(graph: nx.MultiDiGraph[Any]) -> dict[Any, str]:
    ids = {v: str(data.get("label", v)) for v, data in graph.nodes(data=True)}
    if len(set(ids.values())) != len(ids):
        raise ValueError("node labels must be unique to name nodes in a graph file")
    return ids


def to_dot(graph: nx.MultiDiGraph[Any]) -> str:
    """The graph as Graphviz DOT text (`dot -Tsvg FILE` draws it)."""
    ids = _ids(graph)
    name = graph.graph.get("network", graph.graph.get("name", "graph"))
    lines = [f"digraph {_quote(name)} {{"]
    if graph.graph:
        lines.append(f"  graph [{_attrs({k: v for k, v in graph.graph.items()})}];")
    lines.append('  node [shape="box", fontname="Helvetica"];')
    lines.append('  edge [fontname="Helvetica", fontsize="10"];')
    for v, data in graph.nodes(data=True):
        shown = [ids[v]] + [f"{k} {data[k]}" for k in _NODE_FIGURES
                            if k in data and not ids[v].startswith(str(data[k]))]
        attrs = {k: val for k, val in data.items() if k != "label"}
        lines.append(f"  {_quote(ids[v])} [{_attrs({'label': chr(10).join(shown), **attrs})}];")
    for u, v, data in graph.edges(data=True):
        label = ", ".join(_edge_figures(data))
        hints: dict[str, Any] = {"label": label} if label else {}
        if data.get("delay", 0):
            hints["style"] = "dashed"
        attrs = {k: val for k, val in data.items() if k not in hints}
        lines.append(f"  {_quote(ids[u])} -> {_quote(ids[v])} [{_attrs({**hints, **attrs})}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_graphml(graph: nx.MultiDiGraph[Any]) -> str:
    """The graph as GraphML text (Gephi, yEd, Cytoscape and networkx's `read_graphml` open it)."""
    import networkx as nx  # ~0.1 s of import: only when a file is asked for

    ids = _ids(graph)
    relabelled = nx.relabel_nodes(graph, ids, copy=True)
    for _, data in relabelled.nodes(data=True):
        data.pop("label", None)  # the node id now
    return "\n".join(nx.generate_graphml(relabelled)) + "\n"
