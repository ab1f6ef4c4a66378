"""``attnlab data list`` and ``attnlab data download``: the public data sets."""

from __future__ import annotations

import argparse


def cmd_data_list(args: argparse.Namespace) -> int:
    from ..data.download import list_datasets
    from ..data.paths import data_dir

    root = data_dir(args.data_dir)
    rows = list_datasets(root)
    width = max(len(name) for name, _, _ in rows)
    print(f"data directory: {root}")
    for name, description, present in rows:
        print(f"{name.ljust(width)}  {'present' if present else 'missing'}  {description}")
    return 0


def cmd_data_download(args: argparse.Namespace) -> int:
    from ..data.download import check_base_url, download

    check_base_url(args.base_url, "--base-url")
    download(args.name, args.data_dir, base_url=args.base_url)
    return 0


def add_data(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab data list`` and ``attnlab data download``."""
    p = sub.add_parser("data", help="list the public data sets and download them")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    q = data_sub.add_parser("list", help="data sets, and whether each is in the data directory")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.set_defaults(func=cmd_data_list)
    q = data_sub.add_parser("download", help="fetch a data set (resumable, checksummed)")
    q.add_argument("name", help="the dataset, one of those 'attnlab data list' shows")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.add_argument("--base-url", default=None, help=argparse.SUPPRESS)  # a mirror, or a test server
    q.set_defaults(func=cmd_data_download)
