"""Run one page's executed code blocks as the site build does, without building the site.

    python docs/run_page.py docs/en/tutorials/attention.md [--html OUT.html]

It renders the page with markdown-exec (the same fences and sessions as ``mkdocs
build``), prints how long it took and exits 1 if a block failed, with the failure.
For writing a page; ``make docs`` and the test of the site run every page.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import markdown
from markdown_exec import formatter, validator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hooks  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page")
    parser.add_argument("--html", help="also write the rendered page body here")
    args = parser.parse_args()
    page = Path(args.page).resolve()
    html_out = Path(args.html).resolve() if args.html else None
    hooks.on_startup()
    hooks.enter_workdir()
    failures: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                failures.append(record.getMessage())

    logging.getLogger().addHandler(Catch())
    fence = {"validator": validator, "format": formatter}
    t0 = time.perf_counter()
    html = markdown.markdown(
        page.read_text(encoding="utf-8"),
        extensions=["pymdownx.superfences", "tables", "admonition", "attr_list", "md_in_html"],
        extension_configs={"pymdownx.superfences": {"custom_fences": [
            {"name": n, "class": n, **fence} for n in ("python", "py", "sh", "bash", "console")]}},
    )
    seconds = time.perf_counter() - t0
    hooks.leave_workdir()
    if html_out:
        html_out.write_text(html, encoding="utf-8")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"{args.page}: {'FAILED' if failures else 'ok'} in {seconds:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
