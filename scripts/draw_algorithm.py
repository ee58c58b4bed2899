#!/usr/bin/env python3
"""Draws docs/algorithm-flow.svg, the data flow of one FOGO step, from docs/algorithm-flow.txt
(its format is in that file's header). Pure Python, no dependencies: boxes on a grid that the
source places, straight or bent arrows between them, so the picture changes only when its source
does and stays as true as the source (ctest doc_tools checks the committed SVG is this output).

    python3 scripts/draw_algorithm.py            # rewrites docs/algorithm-flow.svg
    python3 scripts/draw_algorithm.py --check    # exits 1 when the committed SVG is stale
"""

import argparse
import dataclasses
import math
import pathlib
import sys
import unicodedata
from xml.sax.saxutils import escape

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "algorithm-flow.txt"
TARGET = ROOT / "docs" / "algorithm-flow.svg"

COL_W, ROW_H = 280, 96  # one grid unit, in pixels
BOX_W = 256
LINE_H, PAD = 16, 8
FONT = 12
CHAR_W = 6.6  # a generous mean advance of a 12 px sans-serif character
MARGIN = 24
KINDS = {  # fill, and what the colour means (the legend)
    "input": ("#eeeeee", "input"),
    "stream": ("#dbe9f6", "per matrix, [m, n]"),
    "space": ("#fde7cf", "projected space, [m, d]"),
    "memory": ("#dcefd8", "the group's memory"),
    "output": ("#f3d9e9", "the parameter's update"),
}


@dataclasses.dataclass
class Node:
    name: str
    x: float  # grid column
    y: float  # grid row
    kind: str
    lines: list[str]


@dataclasses.dataclass
class Edge:
    src: str
    dst: str
    dashed: bool
    via: list[tuple[float, float]]
    label: str


@dataclasses.dataclass
class Flow:
    title: list[str]
    nodes: dict[str, Node]
    edges: list[Edge]


def text_width(s: str) -> float:
    # Combining marks (the tilde of z̃, the bar of r̄) take no advance.
    return CHAR_W * sum(1 for c in s if not unicodedata.combining(c))


def parse(text: str) -> Flow:
    title, nodes, edges = [], {}, []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, *fields = [f.strip() for f in line.split(" | ")]
        words = head.split()
        where = f"algorithm-flow.txt:{number}"
        if words[0] in ("title", "note") and len(words) == 1 and len(fields) == 1:
            title.append(fields[0])
        elif words[0] == "node" and len(words) == 5 and fields:
            name, x, y, kind = words[1], float(words[2]), float(words[3]), words[4]
            if kind not in KINDS or name in nodes:
                raise ValueError(f"{where}: unknown kind '{kind}' or a second node '{name}'")
            for f in fields:
                if text_width(f) > BOX_W - 2 * PAD:
                    raise ValueError(f"{where}: '{f}' is wider than a box")
            nodes[name] = Node(name, x, y, kind, fields)
        elif words[0] == "edge" and len(words) >= 3 and len(fields) <= 1:
            edges.append(_edge(words, fields, where))
        else:
            raise ValueError(f"{where}: not a title, note, node or edge line: {raw}")
    for e in edges:
        for end in (e.src, e.dst):
            if end not in nodes:
                raise ValueError(f"edge {e.src} -> {e.dst}: no node '{end}'")
    return Flow(title, nodes, edges)


def _edge(words: list[str], fields: list[str], where: str) -> Edge:
    rest = words[3:]
    dashed = bool(rest) and rest[0] == "dashed"
    rest = rest[1:] if dashed else rest
    via = []
    if rest:
        if rest[0] != "via" or len(rest) < 2:
            raise ValueError(f"{where}: expected 'dashed' or 'via X,Y ...', got {' '.join(rest)}")
        for point in rest[1:]:
            x, y = point.split(",")
            via.append((float(x), float(y)))
    return Edge(words[1], words[2], dashed, via, fields[0] if fields else "")


class Canvas:
    """Grid units to pixels: the grid's left and top edges come from the flow's extent."""

    def __init__(self, flow: Flow):
        xs = [n.x for n in flow.nodes.values()] + [p[0] for e in flow.edges for p in e.via]
        ys = [n.y for n in flow.nodes.values()]
        self.x0 = min(xs) * COL_W - BOX_W / 2 - MARGIN
        self.top = MARGIN + LINE_H * (len(flow.title) + 1) + 2 * LINE_H  # title and legend
        self.y0 = min(ys) * ROW_H - self.top - ROW_H / 2
        self.width = (max(xs) * COL_W + BOX_W / 2 + MARGIN) - self.x0
        self.height = (max(ys) * ROW_H + ROW_H / 2 + MARGIN) - self.y0

    def px(self, x: float, y: float) -> tuple[float, float]:
        return x * COL_W - self.x0, y * ROW_H - self.y0


def box(node: Node, canvas: Canvas) -> tuple[float, float, float, float]:
    cx, cy = canvas.px(node.x, node.y)
    h = LINE_H * len(node.lines) + 2 * PAD
    return cx - BOX_W / 2, cy - h / 2, BOX_W, h


def clip(rect: tuple[float, float, float, float], toward: tuple[float, float]):
    """Where the segment from the rectangle's centre toward a point leaves the rectangle."""
    x, y, w, h = rect
    cx, cy = x + w / 2, y + h / 2
    dx, dy = toward[0] - cx, toward[1] - cy
    if dx == 0 and dy == 0:
        return cx, cy
    t = min(w / 2 / abs(dx) if dx else float("inf"), h / 2 / abs(dy) if dy else float("inf"))
    return cx + t * dx, cy + t * dy


def edge_points(e: Edge, flow: Flow, canvas: Canvas) -> list[tuple[float, float]]:
    src, dst = flow.nodes[e.src], flow.nodes[e.dst]
    middle = [canvas.px(*p) for p in e.via]
    first = middle[0] if middle else canvas.px(dst.x, dst.y)
    last = middle[-1] if middle else canvas.px(src.x, src.y)
    return [clip(box(src, canvas), first)] + middle + [clip(box(dst, canvas), last)]


def f(v: float) -> str:
    return f"{v:.1f}"


def text(x: float, y: float, s: str, anchor: str = "middle", extra: str = "") -> str:
    return (f'<text x="{f(x)}" y="{f(y)}" text-anchor="{anchor}"{extra}>'
            f"{escape(s)}</text>")


def render(flow: Flow) -> str:
    canvas = Canvas(flow)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{f(canvas.width)}" '
           f'height="{f(canvas.height)}" viewBox="0 0 {f(canvas.width)} {f(canvas.height)}" '
           f'font-family="DejaVu Sans, Verdana, sans-serif" font-size="{FONT}">',
           "<!-- Drawn by scripts/draw_algorithm.py from docs/algorithm-flow.txt: edit that "
           "file and redraw, not this one. -->",
           f'<rect width="{f(canvas.width)}" height="{f(canvas.height)}" fill="white"/>']
    for k, line in enumerate(flow.title):
        weight = ' font-weight="bold" font-size="14"' if k == 0 else ""
        out.append(text(MARGIN, MARGIN + LINE_H * (k + 0.5), line, "start", weight))
    out += legend(MARGIN, MARGIN + LINE_H * (len(flow.title) + 1))
    for e in flow.edges:
        out += draw_edge(e, edge_points(e, flow, canvas))
    for node in flow.nodes.values():
        out += draw_node(node, canvas)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def legend(x: float, y: float) -> list[str]:
    out = []
    for fill, meaning in KINDS.values():
        out.append(f'<rect x="{f(x)}" y="{f(y)}" width="14" height="12" fill="{fill}" '
                   f'stroke="#666"/>')
        out.append(text(x + 20, y + 10, meaning, "start"))
        x += 34 + text_width(meaning)
    out.append(f'<line x1="{f(x)}" y1="{f(y + 6)}" x2="{f(x + 30)}" y2="{f(y + 6)}" '
               f'stroke="#444" stroke-dasharray="5,3"/>')
    out.append(text(x + 36, y + 10, "the memory's own updates, outside the step's path", "start"))
    return out


def draw_edge(e: Edge, points: list[tuple[float, float]]) -> list[str]:
    path = " ".join(f"{f(x)},{f(y)}" for x, y in points)
    dash = ' stroke-dasharray="5,3"' if e.dashed else ""
    out = [f'<polyline points="{path}" fill="none" stroke="#444" stroke-width="1.3"{dash}/>',
           arrowhead(points[-2], points[-1])]
    if e.label:
        # On the longest segment, beside its middle, on a white ground so that it reads over lines.
        (ax, ay), (bx, by) = max(zip(points, points[1:]),
                                 key=lambda s: abs(s[1][0] - s[0][0]) + abs(s[1][1] - s[0][1]))
        mx, my = (ax + bx) / 2, (ay + by) / 2
        w = text_width(e.label)
        x = mx + 6 if abs(bx - ax) < abs(by - ay) else mx - w / 2  # beside a vertical segment
        y = my - 2 if abs(bx - ax) < abs(by - ay) else my - 6
        out.append(f'<rect x="{f(x - 2)}" y="{f(y - 11)}" width="{f(w + 4)}" height="15" '
                   f'fill="white" stroke="none"/>')
        out.append(text(x, y, e.label, "start", ' fill="#222"'))
    return out


def arrowhead(a: tuple[float, float], b: tuple[float, float]) -> str:
    """A filled triangle at b pointing along a -> b (drawn, not an SVG marker, which some
    renderers leave out)."""
    length = math.hypot(b[0] - a[0], b[1] - a[1]) or 1.0
    ux, uy = (b[0] - a[0]) / length, (b[1] - a[1]) / length
    back, half = 9.0, 4.0
    left = (b[0] - back * ux - half * uy, b[1] - back * uy + half * ux)
    right = (b[0] - back * ux + half * uy, b[1] - back * uy - half * ux)
    points = " ".join(f"{f(x)},{f(y)}" for x, y in (b, left, right))
    return f'<polygon points="{points}" fill="#444"/>'


def draw_node(node: Node, canvas: Canvas) -> list[str]:
    x, y, w, h = box(node, canvas)
    fill = KINDS[node.kind][0]
    out = [f'<rect x="{f(x)}" y="{f(y)}" width="{f(w)}" height="{f(h)}" rx="6" fill="{fill}" '
           f'stroke="#555"/>']
    for k, line in enumerate(node.lines):
        weight = ' font-weight="bold"' if k == 0 and len(node.lines) > 1 else ""
        out.append(text(x + w / 2, y + PAD + LINE_H * k + 12, line, "middle", weight))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed SVG")
    ap.add_argument("--source", type=pathlib.Path, default=SOURCE)
    ap.add_argument("--out", type=pathlib.Path, default=TARGET)
    args = ap.parse_args(argv)
    svg = render(parse(args.source.read_text()))
    if args.check:
        if not args.out.exists() or args.out.read_text() != svg:
            print(f"{args.out} is not what {args.source} draws: run scripts/draw_algorithm.py",
                  file=sys.stderr)
            return 1
        return 0
    args.out.write_text(svg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
