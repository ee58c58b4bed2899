"""scripts/draw_algorithm.py: the committed docs/algorithm-flow.svg is what the script draws from
docs/algorithm-flow.txt (so the picture changes only with its source), the source covers every
numbered step of docs/algorithm.md's Part 1, and a malformed source is refused by line."""
import importlib.util
import math
import os
import re

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("draw_algorithm",
                                              os.path.join(HERE, "..", "draw_algorithm.py"))
da = importlib.util.module_from_spec(spec)
spec.loader.exec_module(da)


def test_the_committed_picture_is_the_sources():
    svg = da.render(da.parse(da.SOURCE.read_text()))
    assert da.TARGET.read_text() == svg, "run scripts/draw_algorithm.py and commit the SVG"
    assert da.main(["--check"]) == 0


def test_the_picture_shows_every_step_of_the_specification():
    flow = da.parse(da.SOURCE.read_text())
    spec_steps = re.findall(r"^(\d)\. \*\*", (da.ROOT / "docs" / "algorithm.md").read_text(), re.M)
    assert spec_steps == [str(k) for k in range(1, 10)]  # Part 1's steps 1-9
    drawn = " ".join(line for n in flow.nodes.values() for line in n.lines)
    drawn += " " + " ".join(e.label for e in flow.edges)
    for step in spec_steps:
        assert re.search(rf"(^|\s){step}\. ", drawn), f"step {step} is not in the picture"
    svg = da.TARGET.read_text()
    for node in flow.nodes.values():
        for line in node.lines:
            assert da.escape(line) in svg


def test_edges_end_on_their_boxes_and_point_at_the_target():
    flow = da.parse(da.SOURCE.read_text())
    canvas = da.Canvas(flow)
    for e in flow.edges:
        points = da.edge_points(e, flow, canvas)
        x, y, w, h = da.box(flow.nodes[e.dst], canvas)
        ex, ey = points[-1]
        on_side = (math.isclose(ex, x) or math.isclose(ex, x + w)) and y <= ey <= y + h
        on_top = (math.isclose(ey, y) or math.isclose(ey, y + h)) and x <= ex <= x + w
        assert on_side or on_top, (e.src, e.dst, points[-1])


def test_a_malformed_source_is_refused_naming_its_line():
    with pytest.raises(ValueError, match=r"algorithm-flow.txt:2: .*no node|no node 'Nowhere'"):
        da.parse("node A 0 0 input | a\nedge A Nowhere\n")
    with pytest.raises(ValueError, match=r"algorithm-flow.txt:1: unknown kind 'blue'"):
        da.parse("node A 0 0 blue | a\n")
    with pytest.raises(ValueError, match=r"algorithm-flow.txt:1: .* wider than a box"):
        da.parse("node A 0 0 input | " + "x" * 80 + "\n")
    with pytest.raises(ValueError, match=r"algorithm-flow.txt:1: not a title"):
        da.parse("box A\n")
