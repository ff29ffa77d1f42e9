"""A workflow's steps as a picture: Graphviz's `dot` lays the graph out and draws it as SVG
on the server (no layout of our own, no JavaScript). Each step is a link to its part of the
page (so Tab and Enter walk the graph), and says its status in words as well as in colour."""

import functools
import logging
import re
import subprocess
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workflows.dialect.workflow import Workflow as ParsedWorkflow

log = logging.getLogger(__name__)

DOT = "/usr/bin/dot"

# Fill colours by status; the word is always in the box too.
COLOURS = {
    "pending": "#eeeeee",
    "in-progress": "#cfe2ff",
    "waiting": "#fff3cd",
    "success": "#d1e7dd",
    "failure": "#f8d7da",
    "system-error": "#f5c2c7",
    "skipped": "#e2e3e5",
    "cancelled": "#e2e3e5",
}


@dataclass(frozen=True)
class Node:
    name: str
    approval: bool
    status: str = ""  # "" on the workflow's page: no run
    duration: str = ""
    conditional: bool = False  # has `when`


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# Past this many steps the graph runs down the page rather than across: a long workflow
# scrolls as the page does, its boxes at their size, instead of shrinking to fit the width.
ACROSS_AT_MOST = 12


def dot_source(nodes: Sequence[Node], edges: Sequence[tuple[str, str, bool]]) -> str:
    """`edges`: (before, after, whether `after` reads `before`'s status whatever it was)."""
    direction = "LR" if len(nodes) <= ACROSS_AT_MOST else "TB"
    lines = [
        "digraph steps {",
        f'  graph [rankdir={direction}, bgcolor="transparent", nodesep=0.3, ranksep=0.5];',
        '  node [shape=box, style="rounded,filled", fontname="sans-serif", fontsize=11,'
        ' fillcolor="#ffffff"];',
        '  edge [color="#666666", arrowsize=0.7];',
    ]
    for node in nodes:
        words = [node.name]
        if node.approval:
            words.append("approval")
        if node.conditional:
            words.append("when …")
        if node.status:
            words.append(node.status + (f" · {node.duration}" if node.duration else ""))
        attributes = {
            "label": '"' + "\\n".join(w.replace("\\", "\\\\").replace('"', '\\"') for w in words) + '"',
            # Percent-encoded: Graphviz escapes the label, id and tooltip, but writes the URL
            # into the SVG's href as given, so a quote in a step's name would end the attribute
            # and start one of its own (pages/static/pages/run.js decodes it).
            "URL": quoted("#step-" + urllib.parse.quote(node.name, safe="")),
            "tooltip": quoted(f"{node.name}: {node.status or ('approval' if node.approval else 'step')}"),
            "id": quoted(f"node-{node.name}"),
            "shape": "hexagon" if node.approval else "box",
        }
        if node.status:
            attributes["fillcolor"] = quoted(COLOURS.get(node.status, "#ffffff"))
        if node.conditional:
            attributes["style"] = quoted("rounded,filled,dashed")
        lines.append(f"  {quoted(node.name)} [{', '.join(f'{k}={v}' for k, v in attributes.items())}];")
    for before, after, any_outcome in edges:
        style = ' [style=dashed, tooltip="after it, whatever its outcome"]' if any_outcome else ""
        lines.append(f"  {quoted(before)} -> {quoted(after)}{style};")
    lines.append("}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=512)
def svg_of(source: str) -> str:
    """The SVG `dot` draws (cached: a live run page asks again each second, mostly unchanged)."""
    drawn = subprocess.run(
        [DOT, "-Tsvg"], input=source, capture_output=True, text=True, timeout=20, check=True
    )
    # Inline in the page: without the XML prolog and DOCTYPE, and focusable links.
    svg = drawn.stdout[drawn.stdout.index("<svg") :]
    return re.sub(r"<title>[^<]*</title>\n", "", svg, count=1)


def workflow_svg(document: ParsedWorkflow, steps: Mapping[str, tuple[str, str]] | None = None) -> str:
    """The document's steps, with each one's (status, duration) from `steps` (a run's)."""
    nodes = []
    edges = []
    for step in document.steps:
        status, duration = (steps or {}).get(step.name, ("", ""))
        nodes.append(
            Node(step.name, step.kind == "approval", status, duration, conditional=step.when is not None)
        )
        edges += [(before, step.name, False) for before in step.needs]
        edges += [(before, step.name, True) for before in step.status_of if before not in step.needs]
    try:
        return svg_of(dot_source(nodes, edges))
    except (OSError, subprocess.SubprocessError) as exc:
        # The steps' table says it all in words; the picture waits for Graphviz.
        log.warning("graphviz's dot could not draw a workflow: %s", exc)
        return (
            f'<p class="help">No picture: Graphviz\'s <code>{DOT}</code> could not draw it'
            " (is graphviz installed?).</p>"
        )
