"""The versioned YAML network format, and its writer.

    version: 1
    name: residual_mlp
    input_shape: [16]          # [features] or [channels, height, width]
    batch: 1                   # optional micro-batch size
    layers:
      - {name: fc1, type: linear, out_features: 32, activation: relu}
      - {name: fc2, type: linear, out_features: 16}
      - {name: join, type: add, inputs: [fc2, input], activation: relu}

Each layer has a `name`, a `type` (a key of `LAYER_TYPES`), optional `inputs` (names of earlier layers or
`input`; default: the previous layer) and the fields of its type (the dataclass fields of its op, minus
the one the type name fixes: a pool's `mode`, an activation's `function`). Every mistake is an
`InputError` of one line that names the file, the layer and the field, and lists what is allowed.
Duplicate keys are rejected at any depth (PyYAML silently keeps the last one), with their line.

`dump_yaml` writes any `Network` (zoo ones too) so that loading the text gives an equal network.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from layerpipe.errors import InputError
from layerpipe.network._graph import INPUT, Network, NetworkBuilder
from layerpipe.network._ops import LAYER_TYPES, Activation, LayerOp, Pool2d

FORMAT_VERSION = 1
TOP_LEVEL_FIELDS: tuple[str, ...] = ("version", "name", "input_shape", "batch", "layers")
COMMON_LAYER_FIELDS: tuple[str, ...] = ("name", "type", "inputs")

#: The op field that a type name fixes (`maxpool` is Pool2d with mode "max"), so it is not written in YAML.
_FIXED_BY_TYPE: dict[type, str] = {Pool2d: "mode", Activation: "function"}


def _fixed_value(type_name: str) -> str:
    """The value of the fixed field for a type name: 'maxpool' -> 'max', 'relu' -> 'relu'."""
    return type_name.removesuffix("pool") if LAYER_TYPES[type_name] is Pool2d else type_name


def type_fields(type_name: str) -> dict[str, dataclasses.Field]:
    """The YAML fields of a layer type (besides name, type, inputs), in declaration order."""
    cls = LAYER_TYPES[type_name]
    fixed = _FIXED_BY_TYPE.get(cls)
    return {f.name: f for f in dataclasses.fields(cls) if f.name != fixed}


# ---------------------------------------------------------------------------------------------- reading


#: Limits of a YAML document (issue 12 items 5 and 6): nesting depth, checked while composing (before Python's
#: recursion limit), and nodes after expanding aliases (a 400-byte alias bomb expands to billions). A network of
#: a thousand layers has a few tens of thousands of nodes.
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 200_000


class _LimitedComposer(yaml.SafeLoader):
    """Composer hooks of `_StrictLoader`: depth while composing, expanded size once a document is composed."""

    _depth = 0
    source = "<yaml>"  #: what errors name (the file)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise InputError(f"{self.source}: line {line}: nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            _check_expanded_size(node, self.source)
        return node


def _check_expanded_size(root: yaml.Node, source: str) -> None:
    """Refuse a document of more than MAX_YAML_NODES nodes with aliases expanded, or a recursive alias.

    Iterative post-order with a memo per node, so a shared (aliased) node is sized once: the check is linear
    in the document, not in its expansion."""
    memo: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        if not done:
            if key in memo:
                continue
            if key in active:
                raise InputError(f"{source}: line {node.start_mark.line + 1}: a recursive alias (a node inside itself)")
            active.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in memo)
            continue
        active.discard(key)
        total = 1 + sum(memo[id(child)] for child in children)
        if total > MAX_YAML_NODES:
            raise InputError(f"{source}: more than {MAX_YAML_NODES} YAML nodes once aliases are expanded "
                             "(an alias bomb?); write the document out or make it smaller")
        memo[key] = total


class _Mapping(dict):
    """A YAML mapping that remembers the line it starts on, for error messages."""

    line: int = 0


class _StrictLoader(_LimitedComposer):
    """A SafeLoader (with `_LimitedComposer`'s limits) that rejects duplicate mapping keys and records the line
    of every mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, str] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges are allowed to be overridden
            key = self.construct_object(key_node, deep=True)
            mark = key_node.start_mark
            where = f"line {mark.line + 1} column {mark.column + 1}"
            try:
                first = seen.get(key)
            except TypeError:
                raise InputError(f"{self.source}: {where}: mapping keys must be scalars") from None
            if first is not None:
                raise InputError(f"{self.source}: duplicate key '{key}' at {where} (first at {first})")
            seen[key] = where
        return super().construct_mapping(node, deep=deep)


def _construct_located_map(loader: _StrictLoader, node: yaml.MappingNode):
    data = _Mapping()
    data.line = node.start_mark.line + 1
    yield data
    data.update(loader.construct_mapping(node))


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_located_map)


def _parse_yaml(text: str, source: str) -> Any:
    loader = None
    try:
        loader = _StrictLoader(text)  # the reader checks the characters here: inside the try
        loader.source = source
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        raise InputError(f"{source}: {where}invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: invalid YAML: {' '.join(str(exc).split())}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_network(path: str | Path, batch: int | None = None) -> Network:
    """Read a network file. `batch` overrides the file's `batch` (which defaults to 1)."""
    from layerpipe._files import read_text_limited  # regular files only, size-limited, strict UTF-8

    path = Path(path)
    text = read_text_limited(path, "cannot read network file")
    return parse_yaml_network(text, source=str(path), batch=batch, default_name=path.stem)


def parse_yaml_network(text: str, source: str = "<yaml>", batch: int | None = None,
                       default_name: str = "network") -> Network:
    """A network from YAML text; errors name `source`. `batch` overrides the document's `batch`."""
    doc = _parse_yaml(text, source)
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a network file must be a mapping with fields {', '.join(TOP_LEVEL_FIELDS)}")
    unknown = [k for k in doc if k not in TOP_LEVEL_FIELDS]
    if unknown:
        raise InputError(f"{source}: unknown field '{unknown[0]}'; allowed: {', '.join(TOP_LEVEL_FIELDS)}")
    if not _is_int(doc.get("version")) or doc["version"] != FORMAT_VERSION:
        got = "missing" if "version" not in doc else repr(doc["version"])
        raise InputError(f"{source}: version must be {FORMAT_VERSION} (got {got})")
    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise InputError(f"{source}: name must be a non-empty string, got {name!r}")
    shape = doc.get("input_shape")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise InputError(f"{source}: input_shape must be a list of positive integers like [784] or [3, 32, 32], "
                         f"got {shape!r}")
    if batch is None:
        batch = doc.get("batch", 1)
        if not _is_int(batch) or batch < 1:
            raise InputError(f"{source}: batch must be a positive integer, got {batch!r}")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise InputError(f"{source}: layers must be a non-empty list of layer mappings")
    try:
        builder = NetworkBuilder(name, shape, batch)
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None
    for position, entry in enumerate(layers):
        _add_layer(builder, entry, position, source)
    try:
        return builder.build()
    except InputError as exc:
        raise InputError(f"{source}: {exc}") from None


def _add_layer(builder: NetworkBuilder, entry: Any, position: int, source: str) -> None:
    where = f"{source}: layers[{position}]"
    if not isinstance(entry, dict):
        raise InputError(f"{where}: a layer must be a mapping with fields {', '.join(COMMON_LAYER_FIELDS)}, ...")
    line = f" (line {entry.line})" if isinstance(entry, _Mapping) else ""
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}{line}: field 'name' must be a non-empty string, got {name!r}")
    where = f"{where} '{name}'{line}"
    type_name = entry.get("type")
    if not isinstance(type_name, str) or type_name not in LAYER_TYPES:
        raise InputError(f"{where}: unknown type {type_name!r}; allowed: {', '.join(LAYER_TYPES)}")
    fields = type_fields(type_name)
    allowed = [*COMMON_LAYER_FIELDS, *fields]
    for key in entry:
        if key not in allowed:
            raise InputError(f"{where}: unknown field '{key}' for type {type_name}; allowed: {', '.join(allowed)}")
    inputs = entry.get("inputs")
    if inputs is not None and (not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs)):
        raise InputError(f"{where}: field 'inputs' must be a list of layer names (or 'input'), got {inputs!r}")
    kwargs: dict[str, Any] = {}
    hints = typing.get_type_hints(LAYER_TYPES[type_name])
    for key, spec in fields.items():
        if key in entry:
            _check_type(entry[key], hints[key], f"{where}: field '{key}'")
            kwargs[key] = entry[key]
        elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise InputError(f"{where}: missing field '{key}' (type {type_name} needs {', '.join(_required(fields))})")
    cls = LAYER_TYPES[type_name]
    fixed = _FIXED_BY_TYPE.get(cls)
    if fixed is not None:
        kwargs[fixed] = _fixed_value(type_name)
    try:
        builder.add(name, cls(**kwargs), inputs)
    except InputError as exc:
        # The builder names the layer itself; `where` already does.
        raise InputError(f"{where}: {str(exc).removeprefix(f'layer {name!r}: ')}") from None


def _required(fields: dict[str, dataclasses.Field]) -> list[str]:
    return [k for k, f in fields.items()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_type(value: Any, hint: Any, where: str) -> None:
    """Type-check a YAML value against an op field's annotation (int, bool, str or `int | None`)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    ok = any((opt is type(None) and value is None) or (opt is int and _is_int(value))
             or (opt in (bool, str) and isinstance(value, opt)) for opt in options)
    if not ok:
        names = " or ".join("null" if opt is type(None) else {int: "an integer", bool: "true/false",
                                                               str: "a string"}[opt] for opt in options)
        raise InputError(f"{where} must be {names}, got {value!r}")


# ---------------------------------------------------------------------------------------------- writing


def type_name_of(op: LayerOp) -> str:
    """The YAML `type` of an op (the inverse of LAYER_TYPES plus the fixed field)."""
    fixed = _FIXED_BY_TYPE.get(type(op))
    if fixed is None:
        return op.kind
    value = getattr(op, fixed)
    return f"{value}pool" if isinstance(op, Pool2d) else value


def dump_yaml(network: Network) -> str:
    """The network in the YAML format: one flow mapping per layer, default-valued fields left out."""
    head = {"version": FORMAT_VERSION, "name": network.name, "input_shape": list(network.input_shape),
            "batch": network.batch}
    # The header is written key by key so that `input_shape` stays a flow list on one line.
    lines = [f"{k}: {_flow(v)}" for k, v in head.items()]
    lines.append("layers:")
    for layer in network.layers:
        type_name = type_name_of(layer.op)
        entry: dict[str, Any] = {"name": layer.name, "type": type_name}
        if layer.inputs != (layer.index - 1,):
            entry["inputs"] = ["input" if i == INPUT else network.layer(i).name for i in layer.inputs]
        for key, spec in type_fields(type_name).items():
            value = getattr(layer.op, key)
            if spec.default is dataclasses.MISSING or value != spec.default:
                entry[key] = value
        lines.append(f"  - {_flow(entry)}")
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    """One value in YAML flow style on one line (quoting strings only when YAML needs it)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return text.strip().removesuffix("...").strip()  # a bare scalar document ends with "..."
