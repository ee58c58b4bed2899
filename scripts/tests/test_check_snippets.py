"""scripts/check_snippets.py's rule (which blocks are code, how a fragment names its wrapper) on
small pages, and that a failing Python snippet fails the check naming its page and line. The
real pages' snippets are compiled and run by ctest doc_snippets, which needs the build."""
import importlib.util
import os
import pathlib
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("check_snippets",
                                              os.path.join(HERE, "..", "check_snippets.py"))
cs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cs)

PAGE = """# A page

```cpp
#include <fogo/fogo.h>
int main() {}
```

<!-- snippet: model -->

```cpp
auto opt = fogo::make_hybrid<fogo::Muon>(*model, fogo::MuonOptions(0.02),
                                         torch::optim::AdamWOptions(3e-4));
```

    scripts/test.sh

```
{"a layout": ..., ...}
```

```cmake
find_package(fogo REQUIRED)
```

<!-- snippet: model -->
```python
opt = fogo.Muon(model.parameters())
```
"""


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_code_blocks_are_found_with_their_wrappers_and_lines(tmp_path):
    snippets = cs.extract(write(tmp_path, PAGE))
    assert [(s.lang, s.line, s.wrapper) for s in snippets] == [
        ("cpp", 4, None), ("cpp", 11, "model"), ("python", 27, "model")]
    assert snippets[1].code.startswith("auto opt = fogo::make_hybrid")


def test_a_fragment_compiles_inside_main_with_its_page_and_line():
    s = cs.Snippet(cs.ROOT / "README.md", 40, "cpp", "opt.step();\n", "model")
    source = cs.cpp_source(s)
    assert '#line 40 "README.md"\nopt.step();\n}' in source
    assert source.index(cs.CPP_WRAPPERS["model"]) < source.index("#line 40")
    whole = cs.Snippet(cs.ROOT / "README.md", 23, "cpp", "int main() {}\n", None)
    assert cs.cpp_source(whole) == '#line 23 "README.md"\nint main() {}\n'


def test_a_python_snippet_keeps_its_line_numbers():
    s = cs.Snippet(cs.ROOT / "README.md", 30, "python", "x = 1\n", "model")
    source = cs.python_source(s)
    assert source.splitlines()[29] == "x = 1"
    assert source.startswith(cs.PY_WRAPPERS["model"])


@pytest.mark.parametrize("text, message", [
    ("```cpp\nopt.step();\n```\n", "needs <!-- snippet: NAME -->"),
    ("<!-- snippet: nothing -->\n```python\nx = 1\n```\n", "no python wrapper 'nothing'"),
    ("<!-- snippet: model -->\n```cpp\nint main() {}\n```\n", "takes no wrapper"),
    ("```python\nx = 1\n", "never closed"),
])
def test_a_page_that_breaks_the_rule_is_refused(tmp_path, text, message):
    with pytest.raises(cs.SnippetError, match=message):
        cs.extract(write(tmp_path, text))


def test_a_failing_python_snippet_fails_naming_its_line(tmp_path):
    page = write(tmp_path, "Text\n\n```python\nx = 1\nassert x == 2, 'broken'\n```\n")
    build = tmp_path / "build"
    (build / "python" / "fogo").mkdir(parents=True)
    (build / "python" / "fogo" / "_C.fake.so").write_text("")  # the check wants a module
    failures = cs.check_python(cs.extract(page), build, tmp_path / "work", sys.executable)
    assert len(failures) == 1
    assert "page.md:4: python snippet exited with 1" in failures[0]
    assert 'page.md.py", line 5' in failures[0] and "AssertionError: broken" in failures[0]
