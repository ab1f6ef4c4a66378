"""What the tests of refusals share: a refusal is one line, exit 2, never a traceback nor "a bug
in attnlab"; the command line run in a child process whose files are capped (a full disk);
allocations that would take gigabytes run in a child process under an address-space limit.

Imported by name (``from refusals import one_line``): tests/conftest.py puts tests/ on sys.path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

BUG = "bug in attnlab"


def one_line(err: str) -> str:
    """The one line of a refusal on stderr (asserting that there is one, and no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and BUG not in err, err
    return lines[0]


def one_line_refusal(capsys, argv, *needles):
    """``attnlab ARGV`` exits 2 with one line on stderr that holds each of ``needles``; that line."""
    from attnlab.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def capped_cli(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess:
    """``attnlab ARGS`` in a child process, its files capped at ``fsize`` bytes (``ulimit -f``)."""
    limit = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))\n" if fsize else ""
    code = f"{limit}import sys\nfrom attnlab.cli import main\nsys.exit(main({list(args)!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


# ----------------------------------------------------------------------------- under an address-space limit

CHILD = textwrap.dedent("""
    import contextlib, io, json, resource, sys
    import torch
    from attnlab.attention import build_attention
    from attnlab.cli import main
    from attnlab.formats import from_hf
    from attnlab.formats.hf.load import hf_model_spec, read_hf
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # an allocation of more fails
    cases = json.loads(sys.argv[1])
    out = {}
    for name, (call, args, kwargs) in cases.items():
        try:
            if call == "main":
                err = io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    rc = main(args)
                out[name] = [rc, err.getvalue()]
            else:
                {"from_hf": from_hf, "read_hf": read_hf, "hf_model_spec": hf_model_spec,
                 "build_attention": build_attention}[call](*args, **kwargs)
                out[name] = ["accepted", ""]
        except BaseException as exc:
            out[name] = [type(exc).__name__, str(exc)]
    print(json.dumps(out))
""")


def under_an_address_space_limit(cases: dict[str, list]) -> dict[str, list]:
    """``{case: [what happened, message]}`` of ``cases`` (``{case: [call, args, kwargs]}``, the call
    one of ``main``, ``from_hf``, ``read_hf``, ``hf_model_spec``, ``build_attention``), run in one
    child process under a 4 GB address-space limit: an allocation of gigabytes fails there instead
    of the refusal. Skips where RLIMIT_AS is not Linux's."""
    if sys.platform != "linux":
        pytest.skip("RLIMIT_AS is Linux's")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
