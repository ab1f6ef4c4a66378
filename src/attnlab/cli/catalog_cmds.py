"""``attnlab models``, ``kinds``, ``sources`` and ``recipes``: what is registered and shipped."""

from __future__ import annotations

import argparse
import dataclasses
import json

from .common import UsageError


def cmd_models(args: argparse.Namespace) -> int:
    import torch

    from ..models import count_parameters, create_model, list_models, model_entry

    names = list_models(args.pattern)
    if not names:
        raise UsageError(f"no model matches {args.pattern!r}; run 'attnlab models' for the list")
    rows = []
    for name in names:
        with torch.device("meta"):  # shapes only: counts parameters without allocating them
            n = count_parameters(create_model(name))
        entry = model_entry(name)
        rows.append((name, entry.family, f"{n / 1e6:.1f} M", f"{n:,}", entry.description))
    header = ("model", "family", "params", "exact", "description")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    line = lambda r: "  ".join(c.ljust(w) if i != 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r[:4], widths))) + "  " + r[4]
    print(line(header))
    for r in rows:
        print(line(r))
    return 0


def cmd_kinds(args: argparse.Namespace) -> int:
    """The attention kinds with what each can do; with a name, that kind's options (types,
    defaults, ranges), as its registration declares them."""
    from ..attention.registry import attention_entry, list_attention

    if args.kind is None:
        flags = ("causal", "padding", "weights", "cache", "streaming", "decode_step")
        rows = [("kind", "family", *(f.replace("_", " ") for f in flags), "summary")]
        for name in list_attention():
            entry = attention_entry(name)
            caps = entry.capabilities
            marks = ["-" if getattr(caps, f) is None else ("only" if f == "causal" and caps.causal_only else
                                                           "yes" if getattr(caps, f) else "no") for f in flags]
            rows.append((name, entry.family, *marks, entry.summary))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        print("\nattnlab kinds KIND lists a kind's options; a model takes them as attention_options.")
        return 0
    entry = attention_entry(args.kind)  # an unknown name: one line with the close ones
    caps = entry.capabilities
    can = [f.replace("_", " ") for f in ("causal", "padding", "weights", "cache", "streaming", "decode_step",
                                         "positions", "causal_only") if getattr(caps, f)]
    print(f"{args.kind} ({entry.family}): {entry.summary}")
    print(f"declares: {', '.join(can) or 'none of the flags'}"
          + (f"; LoRA roles: {', '.join(caps.lora_roles)}" if caps.lora_roles else ""))
    options = list(entry.options)
    if not options:
        print("options: none")
        return 0
    rows = [("option", "takes", "default", "what it does")]
    rows += [(o.name, o.expected(), "required" if o.required else repr(o.default), o.help) for o in options]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    return 0


def cmd_sources(args: argparse.Namespace) -> int:
    """The registered data sources, by kind of data, each with the data keys it takes."""
    from ..data.source import list_sources

    for source in sorted(list_sources(), key=lambda s: s.kind):
        keys = [f.name for f in dataclasses.fields(source.config_class) if f.name not in ("name", "data_dir")]
        print(f"{source.kind:<15} {source.name:<16} {source.summary}\n{'':<32} data keys: {', '.join(keys) or '-'}")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    """The shipped recipes; with NAME (or a YAML file) its resolved settings, with --keys
    every key with its type, default and help."""
    from ..recipes import list_recipes

    if args.name is None:
        if args.keys:
            raise UsageError("--keys lists the keys of one recipe: attnlab recipes NAME --keys")
        rows = list_recipes()
        width = max(len(name) for name, _, _ in rows)
        task_width = max(len(task) for _, task, _ in rows)
        for name, task, description in rows:
            print(f"{name.ljust(width)}  {task.ljust(task_width)}  {description}")
        return 0
    import yaml  # (below: one recipe, read with its task's classes, which import torch)

    from ..data.tokenizers.text import shorten
    from ..recipes import load_recipe, recipe_keys
    from ..tasks import recipe_dict

    recipe = load_recipe(args.name, args.overrides)
    if not args.keys:
        print(yaml.safe_dump(recipe_dict(recipe), sort_keys=False, allow_unicode=True), end="")
        return 0
    rows = [(key, shorten(tp, 28), shorten(_shown(default), 32), shorten(_shown(value), 32), help_)
            for key, tp, default, value, help_ in recipe_keys(recipe)]
    header = ("key", "type", "default", "value", "help")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + ("  " + row[4] if row[4] else ""))
    return 0


def _shown(value: object) -> str:
    """A value as an override would spell it: ``null``, ``true``, ``[1, 2]``."""
    if value is None or isinstance(value, (bool, dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def add_models(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab models``."""
    p = sub.add_parser("models", help="list registered models with their parameter counts")
    p.add_argument("pattern", nargs="?", default="*", help="shell-style name filter, e.g. 'transformer_*'")
    p.set_defaults(func=cmd_models)


def add_kinds(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab kinds``."""
    p = sub.add_parser("kinds", parents=[plugins],
                       help="list the attention kinds and what each can do; 'attnlab kinds KIND': its options")
    p.add_argument("kind", nargs="?", default=None, help="a kind's name (e.g. exact, local, gated_delta)")
    p.set_defaults(func=cmd_kinds)


def add_sources(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab sources``."""
    p = sub.add_parser("sources", parents=[plugins], help="list the data sources a recipe's data.name can name")
    p.set_defaults(func=cmd_sources)


def add_recipes(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab recipes``."""
    p = sub.add_parser("recipes", parents=[plugins],
                       help="list the shipped recipes; with NAME its resolved settings, with --keys every key")
    p.add_argument("name", nargs="?", default=None, metavar="NAME", help="a shipped recipe or a YAML file")
    p.add_argument("overrides", nargs="*", help="dotted overrides to apply before printing")
    p.add_argument("--keys", action="store_true", help="every key of the recipe: type, default, value and help")
    p.set_defaults(func=cmd_recipes)
