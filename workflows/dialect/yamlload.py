"""Loading a workflow document: YAML text to the parse tree relay-core evaluates.

The document is untrusted, so nothing here constructs Python objects from tags: libyaml
(PyYAML's C parser) turns the text into events, and this module composes and decodes them
itself, with bounds on size, depth and alias expansion (no "billion laughs"). Scalars
resolve as gopkg.in/yaml.v3 resolves them when decoding into an interface, because that is
what relay-core does: `yes`, `on` and timestamps stay strings, `0777` is octal, `1_000` is
1000.

Two trees come out of one document:
- `raw`, the data with the tags dropped, which is what relay-core's JSON Schema check sees;
- `tree`, relay-core's parse tree, where the tags became data (parse/yaml.go): `!Parameter x`
  is `{"$type": "Parameter", "name": "x"}`, `!Fn.concat [a, b]` is `{"$fn.concat": [a, b]}`,
  `!!binary` is `{"$encoding": "base64", "data": ...}`.
`positions` maps JSON Pointers of `raw` to their line and column.
"""

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from workflows.dialect.problems import DocumentError, Problem, child_pointer

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64  # nesting of the written document
MAX_VALUES = 100_000  # values after alias expansion
MAX_EXPANDED_CHARS = 8 * 1024 * 1024  # scalar characters after alias expansion

YAML_TAG_PREFIX = "tag:yaml.org,2002:"
FN_TAG_PREFIX = "!Fn."
# The tags relay-core knows (parse/yaml.go), plus !Status from RFC 0005.
REFERENCE_TAGS = ("!Parameter", "!Secret", "!Connection", "!Output", "!Data", "!Answer", "!Status")


@dataclass
class Node:
    kind: str  # "scalar", "sequence", "mapping"
    tag: str  # short form: "" (none), "!" (non-specific), "!!str", "!Parameter", ...
    line: int
    column: int
    value: str = ""
    plain: bool = False  # a plain (unquoted, not block) scalar
    items: list["Node"] = field(default_factory=list)
    pairs: list[tuple["Node", "Node"]] = field(default_factory=list)


@dataclass(frozen=True)
class Document:
    raw: Any
    tree: Any
    positions: dict[str, tuple[int, int]]
    tags: dict[str, str]  # pointer of each tagged node (relay tags only) -> its tag

    def position(self, pointer: str) -> tuple[int | None, int | None]:
        """The line and column of the node at `pointer`, or of its nearest parent that has one."""
        while True:
            if pointer in self.positions:
                return self.positions[pointer]
            if "/" not in pointer:
                return None, None
            pointer = pointer.rsplit("/", 1)[0]

    def problem(self, pointer: str, detail: str) -> Problem:
        line, column = self.position(pointer)
        return Problem(pointer=pointer, detail=detail, line=line, column=column)


class _Stop(Exception):
    def __init__(
        self, detail: str, line: int | None = None, column: int | None = None, pointer: str = "#"
    ) -> None:
        super().__init__(detail)
        self.problem = Problem(pointer=pointer, detail=detail, line=line, column=column)


def _short_tag(tag: str | None) -> str:
    if not tag:
        return ""
    if tag.startswith(YAML_TAG_PREFIX):
        return "!!" + tag[len(YAML_TAG_PREFIX) :]
    return tag


def compose(text: str) -> Node | None:
    """The document's node graph from libyaml's events (aliases share nodes)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise _Stop(f"The document is over {MAX_BYTES} bytes.")
    loader = yaml.CSafeLoader(text) if yaml.__with_libyaml__ else yaml.SafeLoader(text)
    anchors: dict[str, Node] = {}
    stack: list[tuple[Node, str | None, list[Node]]] = []  # node, anchor, pending mapping key
    root: Node | None = None
    documents = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            mark = event.start_mark
            line, column = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise _Stop(
                        "A workflow is one YAML document; remove the second one (after '---').", line, column
                    )
                continue
            if isinstance(event, (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentEndEvent)):
                continue
            node: Node | None = None
            if isinstance(event, yaml.AliasEvent):
                if event.anchor not in anchors:
                    raise _Stop(
                        f"Unknown alias *{event.anchor}: define the anchor &{event.anchor} before.",
                        line,
                        column,
                    )
                node = anchors[event.anchor]
            elif isinstance(event, yaml.ScalarEvent):
                if "\x00" in event.value:  # from a "\0" escape: PostgreSQL keeps no NUL in text
                    raise _Stop(
                        "A string holds a NUL character (U+0000), which cannot be stored.", line, column
                    )
                node = Node(
                    "scalar",
                    _short_tag(event.tag),
                    line,
                    column,
                    value=event.value,
                    plain=event.style in (None, ""),
                )
                if event.anchor:
                    anchors[event.anchor] = node
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise _Stop(f"The document nests deeper than {MAX_DEPTH} levels.", line, column)
                kind = "sequence" if isinstance(event, yaml.SequenceStartEvent) else "mapping"
                stack.append((Node(kind, _short_tag(event.tag), line, column), event.anchor, []))
                continue
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                node, anchor, _ = stack.pop()
                if anchor:
                    anchors[anchor] = node
            if node is None:
                continue
            if not stack:
                root = node
                continue
            parent, _, pending = stack[-1]
            if parent.kind == "sequence":
                parent.items.append(node)
            elif pending:
                parent.pairs.append((pending.pop(), node))
            else:
                pending.append(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        detail = f"The YAML cannot be read: {exc.problem or exc.context}."
        raise _Stop(detail, *where) from None
    except yaml.YAMLError as exc:
        raise _Stop(f"The YAML cannot be read: {exc}.") from None
    finally:
        loader.dispose()
    return root


# yaml.v3's resolution of plain scalars (resolve.go), for decoding into an interface{}.
_NULLS = {"", "~", "null", "Null", "NULL"}
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_SPECIAL_FLOATS = {
    ".nan": math.nan,
    ".NaN": math.nan,
    ".NAN": math.nan,
    ".inf": math.inf,
    ".Inf": math.inf,
    ".INF": math.inf,
    "+.inf": math.inf,
    "+.Inf": math.inf,
    "+.INF": math.inf,
    "-.inf": -math.inf,
    "-.Inf": -math.inf,
    "-.INF": -math.inf,
}
_YAML_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_GO_INT = re.compile(r"^[-+]?(0[xX][0-9a-fA-F]+|0[oO]?[0-7]+|0[bB][01]+|[1-9][0-9]*|0)$")
_TIMESTAMP = re.compile(r"^\d{4}-\d{1,2}-\d{1,2}([Tt ]|$)")
INT64 = (-(2**63), 2**64 - 1)  # yaml.v3 falls back to uint64 above int64


class _MergeKey:
    pass


MERGE_KEY = _MergeKey()


def _parse_go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64), then ParseUint: base prefixes, a leading 0 is octal."""
    if not _GO_INT.match(text):
        return None
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-").lower()
    if digits.startswith("0x"):
        value = int(digits[2:], 16)
    elif digits.startswith("0b"):
        value = int(digits[2:], 2)
    elif digits.startswith("0o"):
        value = int(digits[2:], 8)
    elif len(digits) > 1 and digits.startswith("0"):
        value = int(digits[1:], 8)
    else:
        value = int(digits)
    value *= sign
    if not INT64[0] <= value <= INT64[1]:
        return None
    return value


def resolve_plain(text: str) -> Any:
    """The value of an untagged plain scalar, as yaml.v3 resolves it."""
    if text in _NULLS:
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    if text == "<<":
        return MERGE_KEY
    hint = text[0]
    if hint == ".":
        try:
            return float(text) if _YAML_FLOAT.match(text) else text
        except ValueError:
            return text
    if hint.isdigit() or hint in "+-":
        if _TIMESTAMP.match(text):
            # yaml.v3 keeps timestamp-looking values as strings when decoding into interface{}.
            return text
        plain = text.replace("_", "")
        value = _parse_go_int(plain)
        if value is not None:
            return value
        if _YAML_FLOAT.match(plain):
            return float(plain)
    return text


def _decode_tagged_scalar(node: Node) -> Any:
    tag = node.tag
    if tag in ("!!str", "!"):
        return node.value
    if tag in ("!!timestamp",):
        return node.value
    if tag in ("!!int", "!!float", "!!bool", "!!null"):
        value = resolve_plain(node.value)
        wanted = {"!!int": int, "!!float": (int, float), "!!bool": bool, "!!null": type(None)}[tag]
        if (isinstance(value, bool) and tag != "!!bool") or not isinstance(value, wanted):
            raise _Stop(f"{node.value!r} is not a valid {tag}.", node.line, node.column)
        return float(value) if tag == "!!float" else value
    # Other !! tags (!!python/..., !!set, ...) mean nothing here: the text, as yaml.v3 keeps it.
    return node.value


class _Decoder:
    """Builds the raw and relay trees from the node graph, counting what aliases expand to."""

    def __init__(self) -> None:
        self.values = 0
        self.chars = 0
        self.positions: dict[str, tuple[int, int]] = {}
        self.tags: dict[str, str] = {}
        self.problems: list[Problem] = []

    def count(self, node: Node, depth: int) -> None:
        self.values += 1
        self.chars += len(node.value)
        if self.values > MAX_VALUES or self.chars > MAX_EXPANDED_CHARS:
            raise _Stop(
                "The document expands to too much data (aliases repeat it too often).", node.line, node.column
            )
        if depth > 2 * MAX_DEPTH:
            raise _Stop(
                "The document nests too deeply once its aliases are expanded.", node.line, node.column
            )

    def scalar(self, node: Node) -> Any:
        if node.tag == "":
            value = resolve_plain(node.value) if node.plain else node.value
        else:
            value = _decode_tagged_scalar(node)
        if isinstance(value, float) and not math.isfinite(value):
            # `.inf`, `.nan`, or a number past a float64 (`1e400`, 400 digits): a workflow's
            # values are JSON (parameters, /spec, outputs), which has no such number, so a
            # default or a spec holding one could never be used.
            raise _Stop(
                f"{node.value!r} is not a finite number: a workflow's values are JSON, which has "
                "no infinity or NaN (a number past a float64, such as 1e400, is infinite).",
                node.line,
                node.column,
            )
        return value

    def decode(self, node: Node, pointer: str, depth: int = 0) -> tuple[Any, Any]:
        """(raw value, relay tree value) of the node."""
        self.count(node, depth)
        self.positions.setdefault(pointer, (node.line, node.column))
        tag = node.tag
        if tag.startswith("!") and not tag.startswith("!!") and tag != "!":
            return self.relay_tag(node, pointer, depth)
        if tag.startswith("!!") or tag in ("", "!"):
            if tag == "!!binary" and node.kind == "scalar":
                self.tags[pointer] = tag
                return node.value, {"$encoding": "base64", "data": node.value}
            if node.kind == "scalar":
                value = self.scalar(node)
                if value is MERGE_KEY:
                    value = "<<"
                return value, value
            if node.kind == "sequence":
                return self.sequence(node, pointer, depth)
            return self.mapping(node, pointer, depth)
        raise _Stop(f"Unknown tag {tag}.", node.line, node.column, pointer)

    def sequence(self, node: Node, pointer: str, depth: int) -> tuple[list[Any], list[Any]]:
        raw: list[Any] = []
        tree: list[Any] = []
        for index, item in enumerate(node.items):
            r, t = self.decode(item, child_pointer(pointer, index), depth + 1)
            raw.append(r)
            tree.append(t)
        return raw, tree

    def key(self, node: Node, pointer: str) -> str | _MergeKey:
        if node.kind != "scalar" or (node.tag not in ("", "!", "!!str")):
            raise _Stop("A mapping key must be a plain string.", node.line, node.column, pointer)
        key = self.scalar(node)
        if key is MERGE_KEY:
            return MERGE_KEY
        if not isinstance(key, str):
            raise _Stop(
                f"The mapping key {node.value} is not a string; quote it: '{node.value}'.",
                node.line,
                node.column,
                pointer,
            )
        return key

    def mapping(self, node: Node, pointer: str, depth: int) -> tuple[dict[str, Any], dict[str, Any]]:
        raw: dict[str, Any] = {}
        tree: dict[str, Any] = {}
        lines: dict[str, int] = {}
        merges: list[Node] = []
        for key_node, value_node in node.pairs:
            key = self.key(key_node, pointer)
            if isinstance(key, _MergeKey):
                merges.append(value_node)
                continue
            if key in raw:
                raise _Stop(
                    f"The key {key!r} is already defined on line {lines[key]}.",
                    key_node.line,
                    key_node.column,
                    child_pointer(pointer, key),
                )
            lines[key] = key_node.line
            raw[key], tree[key] = self.decode(value_node, child_pointer(pointer, key), depth + 1)
        # YAML merge keys (<<: *base): written keys win, then earlier merged maps.
        for merge in merges:
            sources = merge.items if merge.kind == "sequence" else [merge]
            for source in sources:
                if source.kind != "mapping" or source.tag not in ("", "!!map"):
                    raise _Stop(
                        "A merge key (<<) takes a mapping or a list of mappings.",
                        merge.line,
                        merge.column,
                        pointer,
                    )
                merged_raw, merged_tree = self.mapping(source, pointer, depth + 1)
                for key, value in merged_raw.items():
                    if key not in raw:
                        raw[key], tree[key] = value, merged_tree[key]
        return raw, tree

    def reference_argument(
        self, node: Node, pointer: str, depth: int, keys: tuple[str, ...]
    ) -> dict[str, Any]:
        """The fields of a reference tag in its three forms (parse/yaml.go): `!Tag value`,
        `!Tag [values...]` and `!Tag {key: value, ...}`."""
        tag = node.tag
        wanted = " and ".join(f'"{k}"' for k in keys)
        if node.kind == "mapping":
            fields: dict[str, Any] = {}
            for key_node, value_node in node.pairs:
                key = self.key(key_node, pointer)
                if key not in keys or key in fields:
                    raise _Stop(
                        f"{tag} as a mapping takes exactly the keys {wanted}.",
                        node.line,
                        node.column,
                        pointer,
                    )
                assert isinstance(key, str)
                _, fields[key] = self.decode(value_node, child_pointer(pointer, key), depth + 1)
            if len(fields) != len(keys):
                raise _Stop(
                    f"{tag} as a mapping takes exactly the keys {wanted}.", node.line, node.column, pointer
                )
            return fields
        if node.kind == "sequence":
            if len(node.items) != len(keys):
                count = "one item" if len(keys) == 1 else f"exactly {len(keys)} items ({', '.join(keys)})"
                raise _Stop(f"{tag} as a list takes {count}.", node.line, node.column, pointer)
            return {
                key: self.decode(item, child_pointer(pointer, index), depth + 1)[1]
                for index, (key, item) in enumerate(zip(keys, node.items, strict=True))
            }
        if len(keys) != 1:
            example = f"{tag} {{{', '.join(f'{k}: ...' for k in keys)}}} or {tag} [{', '.join(keys)}]"
            raise _Stop(f"{tag} needs {wanted}: write {example}.", node.line, node.column, pointer)
        # relay-core re-resolves the text as an untagged plain scalar: `!Parameter 5` names 5.
        return {keys[0]: resolve_plain(node.value) if node.value else node.value}

    def relay_tag(self, node: Node, pointer: str, depth: int) -> tuple[Any, Any]:
        tag = node.tag
        self.tags[pointer] = tag
        # The raw tree is what relay-core's schema check sees: yaml.v3 drops unknown tags.
        raw = self.plain(node, pointer, depth)
        fields_by_tag = {
            "!Parameter": ("Parameter", ("name",)),
            "!Secret": ("Secret", ("name",)),
            "!Data": ("Data", ("query",)),
            "!Status": ("Status", ("name",)),
            "!Connection": ("Connection", ("type", "name")),
            "!Output": ("Output", ("from", "name")),
            "!Answer": ("Answer", ("askRef", "name")),
        }
        if tag in fields_by_tag:
            type_name, keys = fields_by_tag[tag]
            return raw, {"$type": type_name, **self.reference_argument(node, pointer, depth, keys)}
        if tag.startswith(FN_TAG_PREFIX):
            name = tag[len(FN_TAG_PREFIX) :]
            if not name:
                raise _Stop("A function tag is !Fn.<name>, e.g. !Fn.concat.", node.line, node.column, pointer)
            if node.kind == "scalar":
                return raw, {f"$fn.{name}": [resolve_plain(node.value) if node.value else node.value]}
            if node.kind == "sequence":
                return raw, {f"$fn.{name}": self.sequence(node, pointer, depth)[1]}
            return raw, {f"$fn.{name}": self.mapping(node, pointer, depth)[1]}
        known = ", ".join((*REFERENCE_TAGS, "!Fn.<function>"))
        raise _Stop(f"Unknown tag {tag}; the tags are {known}.", node.line, node.column, pointer)

    def plain(self, node: Node, pointer: str, depth: int) -> Any:
        """The node as yaml.v3 decodes it into an interface with an unknown tag: the text of a
        scalar, or the collection."""
        if node.kind == "scalar":
            return node.value
        untagged = Node(node.kind, "", node.line, node.column, node.value, node.plain, node.items, node.pairs)
        return self.decode(untagged, pointer, depth)[0]


def load(text: str) -> Document:
    """The document's trees and positions, or DocumentError saying what is wrong and where."""
    try:
        root = compose(text)
        decoder = _Decoder()
        if root is None:
            return Document(raw=None, tree=None, positions={}, tags={})
        raw, tree = decoder.decode(root, "#")
    except _Stop as stop:
        raise DocumentError([stop.problem]) from None
    except RecursionError:
        raise DocumentError([Problem(pointer="#", detail="The document nests too deeply.")]) from None
    return Document(raw=raw, tree=tree, positions=decoder.positions, tags=decoder.tags)
