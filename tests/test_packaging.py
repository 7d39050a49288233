"""The package as pip builds it from a checkout without symlinks (what Windows and a zip download
give): a wheel with every part, Lua script and static file, built from an sdist that has no
tests; and one import name for each part, even from the repo root. `.ci/check-package` runs
these and also installs a clone without symlinks into a fresh venv."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("broker", "workers", "producers")
HARNESS_NAMES = re.compile(r"bench|soak|embedded_cluster|supervise")
# the top-level folders and the import name each installs under
FOLDERS = {"pending_actions": "pending_actions", **{p: f"pending_actions.{p}" for p in PARTS}}


def tree_packages() -> dict[str, Path]:
    """Every package folder of the tree (one with an ``__init__.py``), by its import name."""
    found = {}
    for top, name in FOLDERS.items():
        for folder, dirs, files in os.walk(ROOT / top):  # not into the links to the parts
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                rel = Path(folder).relative_to(ROOT / top)
                found[".".join((name, *rel.parts))] = Path(folder)
    return found


def without_symlinks(dest: Path) -> Path:
    """The working tree as ``git clone -c core.symlinks=false`` lays it out: every file git
    tracks or would add, a link written as a file holding its target."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True)
    if listed.returncode:
        pytest.skip("not a git checkout: which files are the tree is git's to say")
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src, dst = ROOT / rel, dest / rel
        if not src.is_symlink() and not src.is_file():
            continue  # deleted, not yet committed
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.write_text(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return dest


@dataclass
class Dists:
    wheel: list[str]  # entry names
    sdist: list[str]  # member names, without the leading "<name>-<version>/"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """An sdist and the wheel built from it (python -m build does both)."""
    tree = without_symlinks(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(tree)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    with zipfile.ZipFile(wheel) as z, tarfile.open(sdist) as t:
        members = [m.name.partition("/")[2] for m in t.getmembers() if m.isfile()]
        return Dists(z.namelist(), members)


def test_every_package_folder_is_built() -> None:
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(listed["packages"]) == sorted(tree_packages())


def test_the_wheel_holds_the_tree(dists: Dists) -> None:
    """Every module of the tree under its one import name, every Lua script and static file:
    nothing more, nothing less."""
    wanted = {"pending_actions/py.typed"}
    for name, folder in tree_packages().items():
        prefix = name.replace(".", "/")
        wanted |= {f"{prefix}/{p.name}" for p in folder.glob("*.py")}
    wanted |= {f"pending_actions/broker/atomic/lua/{p.name}"
               for p in (ROOT / "broker" / "atomic" / "lua").glob("*.lua")}
    wanted |= {f"pending_actions/serve/static/{p.name}"
               for p in (ROOT / "pending_actions" / "serve" / "static").iterdir()}
    shipped = {n for n in dists.wheel if ".dist-info/" not in n}
    assert sorted(shipped ^ wanted) == []
    assert len([n for n in shipped if n.endswith(".lua")]) >= 20
    # the runtime only: the benchmark, the soak and the test clusters are the harness's
    assert [n for n in shipped if HARNESS_NAMES.search(n)] == []


def test_the_sdist_has_no_tests_and_no_part_twice(dists: Dists) -> None:
    assert [n for n in dists.sdist if n.startswith("tests/")] == []
    assert [n for n in dists.sdist if n.startswith(tuple(f"pending_actions/{p}" for p in PARTS))
            ] == []
    assert "broker/atomic/lua/take.lua" in dists.sdist


@pytest.mark.parametrize("part", PARTS)
def test_a_part_refuses_a_second_name(part: str) -> None:
    """From the repo root (on sys.path, as under pytest) ``import broker`` would load a second
    copy of every class: each part refuses, before it loads anything, under any name but its
    own, for itself and for its modules."""
    module = sorted(p.stem for p in (ROOT / part).glob("*.py") if p.stem != "__init__")[0]
    code = (f"import sys\n"
            f"for name in ('{part}', '{part}.{module}'):\n"
            f"    try:\n"
            f"        __import__(name)\n"
            f"    except ImportError as exc:\n"
            f"        print(exc)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"('{part}', 'pending_actions')))\n")
    ran = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    refusal = f"import pending_actions.{part}, not {part}"
    assert ran.stdout.splitlines() == [refusal, refusal, "[]"]


def test_the_harness_is_its_own_distribution_of_the_same_version() -> None:
    """bench and soak reach the CLI through the harness's entry points; it pins the service
    it was written against (it drives internals)."""
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    harness = tomllib.loads((ROOT / "harness" / "pyproject.toml").read_text())["project"]
    assert harness["dependencies"] == [f"{ours['name']}=={ours['version']}"]
    for command, option in (("bench", "--quick"), ("soak", "--kill-every")):
        ran = subprocess.run([sys.executable, "-m", "pending_actions", command, "--help"],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert option in ran.stdout
