"""scripts/include_graph.py: the library's layering holds, and a fault or a cycle is caught."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import include_graph  # noqa: E402


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)


def analyse(root, monkeypatch):
    monkeypatch.setattr(include_graph, "ROOT", str(root))
    edges = include_graph.graph()
    level, cycles = include_graph.levels(edges)
    return edges, level, cycles, include_graph.faults(edges)


def test_the_library_has_no_layering_fault():
    script = os.path.join(os.path.dirname(HERE), "include_graph.py")
    out = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "layering faults: 0" in out.stdout


def test_levels_follow_the_includes(tmp_path, monkeypatch):
    write(tmp_path, "include/fogo/a.h", "#include <vector>\n")
    write(tmp_path, "src/fogo_private/frame/b.h", '#include <fogo/a.h>\n')
    write(tmp_path, "src/frame/b.cpp", '#include "fogo_private/frame/b.h"\n#include <torch/torch.h>\n')
    edges, level, cycles, bad = analyse(tmp_path, monkeypatch)
    assert level == {"include/fogo/a.h": 1, "src/fogo_private/frame/b.h": 2, "src/frame/b.cpp": 3}
    assert not cycles and not bad


def test_an_upward_include_is_a_fault(tmp_path, monkeypatch):
    # A public header that includes a private one, and the frame reaching up into the hybrid.
    write(tmp_path, "include/fogo/a.h", '#include "fogo_private/frame/b.h"\n')
    write(tmp_path, "src/fogo_private/frame/b.h", "")
    write(tmp_path, "src/hybrid/h.cpp", "")
    write(tmp_path, "src/frame/c.cpp", '#include "hybrid/h.cpp"\n')
    _, _, _, bad = analyse(tmp_path, monkeypatch)
    assert sorted(bad) == [("include/fogo/a.h", "src/fogo_private/frame/b.h"),
                           ("src/frame/c.cpp", "src/hybrid/h.cpp")]


def test_a_cycle_is_reported(tmp_path, monkeypatch):
    write(tmp_path, "include/fogo/a.h", "#include <fogo/b.h>\n")
    write(tmp_path, "include/fogo/b.h", "#include <fogo/a.h>\n")
    _, _, cycles, _ = analyse(tmp_path, monkeypatch)
    assert cycles
