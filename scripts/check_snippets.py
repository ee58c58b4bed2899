#!/usr/bin/env python3
"""Compiles and runs the C++ and Python snippets of the given Markdown pages (README.md,
docs/python.md, docs/cpp.md: ctest `doc_snippets`), so that a snippet cannot rot.

The rule, for every block fenced as ```cpp or ```python at the start of a line:
- A ```cpp block that defines `int main(` is a whole program: compiled as it is.
- Any other ```cpp block is a fragment and must name its wrapper in an HTML comment on the
  nearest non-blank line above it, `<!-- snippet: NAME -->`: the fragment becomes the body of a
  main() that starts with the wrapper's declarations (CPP_WRAPPERS below; the reader sees them
  named in the comment). A fragment without one is an error, never skipped.
- A ```python block runs as it is, or after the declarations of its wrapper (PY_WRAPPERS), or,
  with `<!-- snippet: torchrun2 -->`, as a script under torchrun on two processes.
- Blocks fenced otherwise (shell commands, ```cmake, ```text layouts, indented blocks) are not
  code to run and are not read.

C++ snippets are built against fogo as a user gets it: `cmake --install` of the build into a
scratch prefix, then a generated CMake project with find_package(fogo) and fogo::fogo, one
executable per snippet (compiled with `#line` directives, so an error names the page and line).
Python snippets run with the build's module on PYTHONPATH (build/python, as ctest python_tests),
each in a scratch directory, their tracebacks naming the page and line.

    check_snippets.py --build-dir build --work-dir build/tests/snippets README.md docs/python.md
    check_snippets.py --list README.md      # the blocks found and how each is checked
"""

import argparse
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(cpp|python)\s*$")
MARKER = re.compile(r"^<!--\s*snippet:\s*([A-Za-z0-9_]+)\s*-->\s*$")

# C++ wrappers: the declarations a fragment is written against, at the top of main().
CPP_WRAPPERS = {
    # A small model with matrices (to FOGO or Muon) and biases (to AdamW), and a batch `x`.
    "model": (
        "torch::manual_seed(0);\n"
        "torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),\n"
        "                            torch::nn::Linear(32, 4));\n"
        "const torch::Tensor x = torch::randn({8, 16});\n"
    ),
}
CPP_INCLUDES = "#include <fogo/fogo.h>\n#include <torch/torch.h>\n\n#include <iostream>\n"

# Python wrappers: what a fragment needs before it runs.
PY_WRAPPERS = {
    # A small model, its data and loss: the names docs/python.md's fragments use.
    "model": (
        "import torch, fogo\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(32, 4))\n"
        "steps = 4\n"
        "data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(2)]\n"
        "loss_fn = torch.nn.functional.mse_loss\n"
    ),
    "torchrun2": "",  # no declarations: the block is run by torchrun on two processes
}


@dataclasses.dataclass
class Snippet:
    page: pathlib.Path  # the Markdown file
    line: int  # 1-based line of the block's first code line
    lang: str  # "cpp" or "python"
    code: str
    wrapper: str | None

    @property
    def where(self) -> str:
        try:
            page = self.page.resolve().relative_to(ROOT)
        except ValueError:
            page = self.page
        return f"{page}:{self.line}"


class SnippetError(Exception):
    """A page breaks the rule above (an unclosed block, a fragment without a wrapper)."""


def extract(page: pathlib.Path) -> list[Snippet]:
    """Every ```cpp / ```python block of `page`, with its wrapper, checked against the rule."""
    lines = page.read_text().splitlines()
    snippets, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise SnippetError(f"{page}:{i + 1}: a ```{fence[1]} block is never closed")
        wrapper = _marker_above(lines, i)
        snippet = Snippet(page, start + 1, fence[1], "\n".join(lines[start:end]) + "\n", wrapper)
        _check_rule(snippet)
        snippets.append(snippet)
        i = end + 1
    return snippets


def _marker_above(lines: list[str], fence_index: int) -> str | None:
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    marker = MARKER.match(lines[j].strip()) if j >= 0 else None
    return marker[1] if marker else None


def _check_rule(s: Snippet) -> None:
    wrappers = CPP_WRAPPERS if s.lang == "cpp" else PY_WRAPPERS
    if s.wrapper is not None and s.wrapper not in wrappers:
        raise SnippetError(f"{s.where}: no {s.lang} wrapper '{s.wrapper}' "
                           f"(scripts/check_snippets.py has: {', '.join(wrappers)})")
    whole = re.search(r"\bint\s+main\s*\(", s.code) is not None
    if s.lang == "cpp" and whole and s.wrapper:
        raise SnippetError(f"{s.where}: a whole program (it has main()) takes no wrapper")
    if s.lang == "cpp" and not whole and not s.wrapper:
        raise SnippetError(f"{s.where}: a C++ fragment (no main()) needs <!-- snippet: NAME --> "
                           f"on the line above, NAME one of: {', '.join(CPP_WRAPPERS)}")


def cpp_source(s: Snippet) -> str:
    """The snippet as a translation unit; #line makes the compiler's messages name the page."""
    page = s.where.rsplit(":", 1)[0]
    if s.wrapper is None:
        return f'#line {s.line} "{page}"\n{s.code}'
    return (f"{CPP_INCLUDES}\nint main() {{\n{CPP_WRAPPERS[s.wrapper]}"
            f'#line {s.line} "{page}"\n{s.code}}}\n')


def python_source(s: Snippet) -> str:
    """The snippet padded with blank lines so that a traceback's line numbers are the page's."""
    prelude = PY_WRAPPERS.get(s.wrapper or "", "")
    pad = s.line - 1 - prelude.count("\n")
    if pad < 0:  # a wrapper longer than the page's lines above the block: keep it on one line
        prelude = "; ".join(l for l in prelude.splitlines() if l) + "\n"
        pad = s.line - 2
    return prelude + "\n" * max(pad, 0) + s.code


def _write_if_changed(path: pathlib.Path, text: str) -> None:
    # Unchanged files keep their times, so a second run rebuilds nothing.
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def cmake_project(names: list[str]) -> str:
    lines = ["cmake_minimum_required(VERSION 3.25)", "project(fogo_snippets LANGUAGES CXX)",
             "set(CMAKE_CXX_STANDARD 20)", "find_package(fogo 0.1 REQUIRED)",
             # torch/torch.h is most of each compile: parsed once, by a target of its own, so
             # that a broken snippet does not stop the others (REUSE_FROM depends on the owner).
             "add_library(snippet_pch OBJECT pch.cpp)",
             "target_link_libraries(snippet_pch PRIVATE fogo::fogo)",
             "target_precompile_headers(snippet_pch PRIVATE <torch/torch.h>)"]
    for name in names:
        lines.append(f"add_executable({name} {name}.cpp)")
        lines.append(f"target_link_libraries({name} PRIVATE fogo::fogo)")
        lines.append(f"target_precompile_headers({name} REUSE_FROM snippet_pch)")
    return "\n".join(lines) + "\n"


def check_cpp(snippets: list[Snippet], build: pathlib.Path, work: pathlib.Path) -> list[str]:
    """Builds every C++ snippet against the installed fogo and runs it; returns the failures."""
    if not snippets:
        return []
    prefix, project, out = work / "prefix", work / "project", work / "project-build"
    r = _run(["cmake", "--install", str(build), "--prefix", str(prefix)])
    if r.returncode:
        return [f"cmake --install {build} failed:\n{r.stdout}"]
    project.mkdir(parents=True, exist_ok=True)
    names = [f"snippet{k}" for k in range(len(snippets))]
    for name, s in zip(names, snippets):
        _write_if_changed(project / f"{name}.cpp", cpp_source(s))
    _write_if_changed(project / "pch.cpp", "// The precompiled header's owner (cmake_project).\n")
    _write_if_changed(project / "CMakeLists.txt", cmake_project(names))
    configure = ["cmake", "-S", str(project), "-B", str(out), "-G", "Ninja", "-Wno-dev",
                 f"-DCMAKE_PREFIX_PATH={prefix}"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=" + ";".join(
            ["cmake", "-E", "env", "CCACHE_SLOPPINESS=pch_defines,time_macros", "ccache"]))
    r = _run(configure)
    if r.returncode:
        return [f"configuring the snippets' project failed:\n{r.stdout}"]
    failures = []
    for name, s in zip(names, snippets):
        # One target at a time, one compile job (ctest runs other tests beside this one), so a
        # failure is the snippet's own.
        r = _run(["cmake", "--build", str(out), "--target", name, "-j", "1"])
        if r.returncode:
            print(f"{s.where}: cpp snippet FAILED to compile", flush=True)
            failures.append(f"{s.where}: C++ snippet does not compile:\n{_tail(r.stdout)}")
            continue
        failures += _run_in_scratch(s, [str(out / name)], work / "run" / name, {})
    return failures


def check_python(snippets: list[Snippet], build: pathlib.Path, work: pathlib.Path,
                 python: str) -> list[str]:
    if not snippets:
        return []
    if not list((build / "python" / "fogo").glob("_C*.so")):
        return [f"no fogo._C in {build}/python/fogo: build the module (scripts/build.sh "
                f"fogo_python) before checking the Python snippets"]
    env = {"PYTHONPATH": os.pathsep.join(
        p for p in [str(build / "python"), os.environ.get("PYTHONPATH", "")] if p)}
    failures = []
    for k, s in enumerate(snippets):
        scratch = work / "run" / f"python{k}"
        scratch.mkdir(parents=True, exist_ok=True)
        script = scratch / (pathlib.Path(s.where.rsplit(":", 1)[0]).name + ".py")
        script.write_text(python_source(s))
        if s.wrapper == "torchrun2":
            cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   script.name]
        else:
            cmd = [python, script.name]
        failures += _run_in_scratch(s, cmd, scratch, env)
    return failures


def _run_in_scratch(s: Snippet, cmd: list[str], scratch: pathlib.Path, env: dict) -> list[str]:
    """Runs a snippet in its own directory (it may write files) with one torch thread."""
    scratch.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    try:
        r = _run(cmd, cwd=scratch, env=full_env, timeout=300)
    except subprocess.TimeoutExpired:
        return [f"{s.where}: {s.lang} snippet ran past 300 s"]
    print(f"{s.where}: {s.lang} snippet {'ok' if r.returncode == 0 else 'FAILED'}", flush=True)
    if r.returncode:
        return [f"{s.where}: {s.lang} snippet exited with {r.returncode}:\n{_tail(r.stdout)}"]
    return []


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="+", type=pathlib.Path)
    ap.add_argument("--build-dir", type=pathlib.Path, default=ROOT / "build")
    ap.add_argument("--work-dir", type=pathlib.Path)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--list", action="store_true", help="list the blocks and their wrappers")
    args = ap.parse_args(argv)
    try:
        snippets = [s for page in args.pages for s in extract(page)]
    except SnippetError as e:
        print(f"check_snippets: {e}", file=sys.stderr)
        return 1
    if args.list:
        for s in snippets:
            print(f"{s.where}: {s.lang}, {s.wrapper or 'as it is'}")
        return 0
    build = args.build_dir.resolve()
    # The snippets run in scratch directories: a relative interpreter path must not move with them.
    python = os.path.abspath(args.python) if os.sep in args.python else args.python
    work = (args.work_dir or build / "tests" / "snippets").resolve()
    cpp = [s for s in snippets if s.lang == "cpp"]
    py = [s for s in snippets if s.lang == "python"]
    failures = check_cpp(cpp, build, work) + check_python(py, build, work, python)
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)
    print(f"check_snippets: {len(cpp)} C++ and {len(py)} Python snippets, "
          f"{len(failures)} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
