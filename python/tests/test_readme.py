"""The feature table "fogo next to the other Muon libraries" (issue 36 item 6; in docs/comparison.md
since issue 45 moved it out of the README): every test that the fogo column names exists, so each
"yes" stays backed by a test that runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _fogo_column() -> list[str]:
    text = (ROOT / "docs" / "comparison.md").read_text()
    table = text.split("## fogo next to the other Muon libraries", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return [row.split(" | ")[1] for row in rows[1:]]  # the header row is not a feature


def _gtest_sources() -> str:
    files = list((ROOT / "tests").glob("*.cpp")) + list((ROOT / "examples").glob("*/test_*.cpp"))
    return "\n".join(f.read_text() for f in files)


def test_every_test_the_fogo_column_names_exists():
    cells = _fogo_column()
    assert len(cells) >= 15, cells
    gtest = _gtest_sources()
    python = "\n".join(f.read_text() for f in (ROOT / "python" / "tests").glob("test_*.py"))
    named = [name for cell in cells for name in re.findall(r"`([^`]+)`", cell)]
    checked = 0
    for name in named:
        suite_test = re.fullmatch(r"([A-Za-z0-9_]+)[./]([A-Za-z0-9_]+|\*)", name)
        if name.startswith("test_") and name.endswith(".py"):
            assert (ROOT / "python" / "tests" / name).exists(), name
        elif name.startswith("test_"):
            assert re.search(rf"^def {re.escape(name)}\(", python, re.M), name
        elif suite_test:
            suite, test = suite_test.groups()
            pattern = (rf"\b{suite}\b" if test == "*" else rf"\(\s*{suite},\s*{test}\s*\)")
            assert re.search(pattern, gtest), name
        else:
            continue  # an option or a type (`cuda_graph=True`, `fogo::Muon`), not a test
        checked += 1
    assert checked >= 20, named
