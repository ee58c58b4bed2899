"""Packaging: `pip wheel` builds a wheel of this checkout (scikit-build-core, the CMake build
kept in build/python-wheel so a rebuild compiles only what changed), it installs into a fresh
virtualenv, and `import fogo` there steps an optimizer. Set FOGO_SKIP_WHEEL=1 to skip."""

import os
import pathlib
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from conftest import BUILD, ROOT

pytestmark = pytest.mark.skipif(os.environ.get("FOGO_SKIP_WHEEL") == "1", reason="FOGO_SKIP_WHEEL=1")


def test_wheel_builds_installs_and_imports(tmp_path):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the fresh virtualenv must find its own fogo
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    # The compilers of the CMake build this suite runs from (scikit-build-core would take
    # Python's sysconfig CXX, g++ rather than c++): the same compile commands, so ccache serves
    # the library's objects instead of compiling them again.
    cache = BUILD / "CMakeCache.txt"
    if cache.exists():
        for line in cache.read_text().splitlines():
            for var, key in (("CC", "CMAKE_C_COMPILER:"), ("CXX", "CMAKE_CXX_COMPILER:")):
                if line.startswith(key):
                    env.setdefault(var, line.split("=", 1)[1])
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "-q", "-w", str(wheels), str(ROOT)],
        check=True, env=env, timeout=1500)
    (wheel,) = wheels.glob("fogo-*.whl")
    assert "cp3" in wheel.name and "linux_x86_64" in wheel.name
    # fogo._C is in it, the tests' harness module fogo._testing is not (python/CMakeLists.txt).
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("fogo/_C.") for n in names), names
    assert not any("_testing" in n for n in names), names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    # torch without internet: the running interpreter's site-packages, after the venv's own.
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    pathlib.Path(site, "torch_from_host.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
                    "-q", str(wheel)], check=True, env=env)
    script = textwrap.dedent("""
        import importlib.util, torch, fogo
        print(fogo.__file__)
        assert importlib.util.find_spec("fogo._testing") is None
        assert not hasattr(fogo._C, "cpp_trajectory")
        w = torch.randn(8, 8, requires_grad=True)
        opt = fogo.FOGO([w], codebook_size=4, proj_dim=4)
        w.grad = torch.ones(8, 8)
        before = w.detach().clone()
        opt.step()
        assert not torch.equal(before, w.detach())
        print("ok", fogo.CUDA_KERNELS)
    """)
    out = subprocess.run([str(py), "-c", script], check=True, capture_output=True, text=True,
                         env=env, cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(venv)), out  # the installed package, not the checkout's
    assert out[1] == "ok"
    import fogo

    assert out[2] == str(fogo.CUDA_KERNELS)  # kernels in the wheel exactly when in the build
