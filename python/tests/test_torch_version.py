"""fogo and the torch it runs with: the extension module refuses another torch minor version by
name before it loads, and installing fogo keeps the user's torch (pyproject's range covers every
version scripts/torch.sh tests, and pip resolves it to the installed one)."""

import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import fogo
from fogo import _build
from conftest import ROOT


def _tested_versions():
    """FOGO_TORCH_VERSIONS of scripts/torch.sh: the versions CI builds and tests."""
    text = (ROOT / "scripts" / "torch.sh").read_text()
    (line,) = re.findall(r"^FOGO_TORCH_VERSIONS=\(([^)]*)\)", text, flags=re.M)
    return line.split()


def test_the_module_records_the_torch_it_was_compiled_against():
    built, installed = Version(_build.TORCH_VERSION), Version(torch.__version__.split("+")[0])
    assert (built.major, built.minor) == (installed.major, installed.minor)


def test_import_under_another_torch_minor_is_refused_naming_both_and_the_rebuild():
    script = "import torch; torch.__version__ = '2.99.0+cu999'; import fogo"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=dict(os.environ))
    assert out.returncode != 0
    assert "ImportError" in out.stderr, out.stderr
    assert f"compiled against torch {_build.TORCH_VERSION}" in out.stderr, out.stderr
    assert "torch 2.99.0+cu999 is installed" in out.stderr, out.stderr
    assert f"pip install --no-build-isolation --no-deps --force-reinstall {_build.SOURCE_DIR}" \
        in out.stderr, out.stderr


def test_a_patch_release_or_local_tag_of_the_same_minor_is_accepted():
    fogo._check_torch("2.11.0", "2.11.0+cu130")
    fogo._check_torch("2.15.1+cu132", "2.15.0")
    with pytest.raises(ImportError, match=r"compiled against torch 2\.15\.0, but torch 2\.13\.0"):
        fogo._check_torch("2.13.0", "2.15.0")


def test_the_dependency_range_holds_every_tested_torch_and_no_untested_minor():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (dep,) = project["project"]["dependencies"]
    (build_dep,) = [r for r in project["build-system"]["requires"] if r.startswith("torch")]
    assert dep == build_dep, (dep, build_dep)
    assert "==" not in dep
    spec = SpecifierSet(dep.removeprefix("torch"))
    versions = [Version(v) for v in _tested_versions()]
    assert all(v in spec for v in versions), (dep, versions)
    newest = max(versions)
    assert Version(f"{newest.major}.{newest.minor + 1}.0") not in spec, dep
    oldest = min(versions)
    assert Version(f"{oldest.major}.{oldest.minor - 1}.0") not in spec, dep


def test_pip_install_keeps_the_installed_torch(tmp_path):
    """`pip install --no-build-isolation .` in an environment holding a tested torch installs
    fogo alone: pip's resolver, offline, asked for its plan (--dry-run --report) after reading
    the package's metadata (no compilation)."""
    report = tmp_path / "report.json"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--dry-run",
         "--disable-pip-version-check", "-q", "--report", str(report), str(ROOT)],
        check=True, env=env, timeout=600, cwd=tmp_path)
    plan = json.loads(report.read_text())["install"]
    assert [item["metadata"]["name"] for item in plan] == ["fogo"], plan
