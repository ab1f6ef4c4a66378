"""The direction of imports, enforced: import-linter checks the contracts in
pyproject.toml (each package imports only those below it; engine and data know no
models, tasks or what is built on them), function-level imports included."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e '.[dev]')")


def _lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-cache", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_import_follows_the_layers():
    r = _lint()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "5 kept, 0 broken" in r.stdout


def test_an_import_against_the_layers_is_caught(tmp_path):
    """The same check with the layers turned upside down must fail: it sees the imports."""
    config = tmp_path / "upside-down.toml"
    config.write_text('[tool.importlinter]\nroot_package = "attnlab"\n\n'
                      '[[tool.importlinter.contracts]]\nname = "upside down"\ntype = "layers"\n'
                      'layers = ["attnlab.attention", "attnlab.models", "attnlab.tasks", "attnlab.cli"]\n')
    r = _lint("--config", str(config))
    assert r.returncode != 0 and "upside down BROKEN" in r.stdout
    assert "attnlab.tasks" in r.stdout and "attnlab.models" in r.stdout
