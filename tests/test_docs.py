"""The documentation runs: every ```python block of README.md and docs/*.md, and the API reference builds.

Each block runs as written, in a fresh Python process under the current ``KERAS_BACKEND``, in an
empty temporary directory (files a block writes land there). A block whose first line is
``# backends: <name> [<name> ...]`` (followed by the reason) runs under those backends only; the others take
turns over the backends of a ``scripts/test.sh`` run (each on one of them: the features they show are tested on
every backend by the rest of the suite; pytest called alone runs each on its backend).
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT_S = 180


def python_blocks(path):
    """``(line, code)`` for every ```python fence of a Markdown file (line: the fence's, 1-based)."""
    blocks, code, start = [], None, 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if code is None:
            if re.fullmatch(r"```python\s*", stripped):
                code, start = [], number
        elif stripped == "```":
            blocks.append((start, "\n".join(code) + "\n"))
            code = None
        else:
            code.append(line)
    assert code is None, f"{path.name}: the ```python block at line {start} is not closed"
    return blocks


BLOCKS = [(page, line, code) for page in PAGES for line, code in python_blocks(page)]


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    """One JAX compilation cache for all blocks of a run: they compile the same small ops (initializers...)."""
    return str(tmp_path_factory.mktemp("jax_cache"))


def test_the_docs_have_python_blocks():
    assert any(page.name == "README.md" for page, _, _ in BLOCKS)


def _block_params():
    """The blocks as parameters; those that name no backends take turns over the run's backends (``turns``)."""
    return [pytest.param(page, line, code, id=f"{page.relative_to(ROOT)}:{line}",
                         marks=() if _PINNED.match(code) else (pytest.mark.turns,))
            for page, line, code in BLOCKS]


_PINNED = re.compile(r"#\s*backends:\s*([\w ]+)(.*)")


@pytest.mark.parametrize("page, line, code", _block_params())
def test_python_block_runs_as_written(page, line, code, tmp_path, jax_cache):
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    wanted = _PINNED.match(code)
    if wanted and backend not in wanted.group(1).split():
        pytest.skip(f"the block runs on {wanted.group(1).strip()} only {wanted.group(2).strip()}".rstrip())
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    # One thread per block: the examples are tiny, and the suite runs three backends side by side, where
    # PyTorch's and TensorFlow's thread pools would oversubscribe the cores (PyTorch's small matmuls ran 3x
    # slower). A value the caller set is kept.
    for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        env.setdefault(name, "1")
    if backend == "jax":  # the same results, fewer compilations
        env.update(JAX_COMPILATION_CACHE_DIR=jax_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, (
        f"{page.relative_to(ROOT)}, the ```python block at line {line}, failed on {backend}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")


def test_the_api_reference_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs and mkdocstrings are not installed (pip install '.[docs]')")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert (tmp_path / "site" / "api" / "index.html").exists()


@pytest.mark.quick
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_relative_links_point_to_files_that_exist(page):
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", page.read_text())
    missing = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"
