"""Configuration validation: unknown keys suggest matches, types and ranges name the key."""

from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from attnlab.cli import main
from attnlab.engine.config import ConfigError, apply_overrides, from_dict, parse_override, to_dict

from refusals import one_line


@dataclass
class Optim:
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = field(default=1e-3, metadata={"min": 0.0})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class Recipe:
    model: str
    epochs: int = field(default=10, metadata={"min": 1})
    dropout: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})
    compile: bool = False
    seed: Optional[int] = None
    options: dict = field(default_factory=dict)
    optim: Optim = field(default_factory=Optim)


def test_valid_config_with_nested_section_and_int_as_float():
    cfg = from_dict(Recipe, {"model": "vit", "epochs": 3, "dropout": 0, "optim": {"name": "sgd", "lr": 1}})
    assert cfg.optim == Optim(name="sgd", lr=1.0, betas=[0.9, 0.999]) and isinstance(cfg.dropout, float)
    assert to_dict(cfg)["optim"]["name"] == "sgd"


@pytest.mark.parametrize("data,message", [
    ({"model": "vit", "epoch": 3}, "unknown key 'epoch'; did you mean epochs"),
    ({"model": "vit", "optim": {"lrr": 1}}, "unknown key 'optim.lrr'; did you mean lr"),
    ({"model": "vit", "epochs": "3"}, "epochs must be an integer; got '3'"),
    ({"model": "vit", "epochs": 0}, "epochs must be >= 1; got 0"),
    ({"model": "vit", "dropout": 1.5}, "dropout must be <= 1.0; got 1.5"),
    ({"model": "vit", "compile": "yes"}, "compile must be true or false; got 'yes'"),
    ({"model": "vit", "optim": {"name": "adam"}}, "optim.name must be one of 'adamw', 'sgd'; got 'adam'"),
    ({"model": "vit", "optim": {"betas": [0.9, "x"]}}, r"optim.betas\[1\] must be a number; got 'x'"),
    ({"epochs": 2}, "missing key 'model'"),
    ({"model": "vit", "seed": 1.5}, "seed must be an integer; got 1.5"),
])
def test_errors_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(Recipe, data)


def test_overrides_are_read_as_yaml_and_nest():
    data = apply_overrides({"model": "vit", "optim": {"lr": 0.1}},
                           ["optim.lr=3e-4", "epochs=5", "compile=true", "seed=null", "options.depth=2"])
    cfg = from_dict(Recipe, data)
    assert cfg.optim.lr == 3e-4 and cfg.epochs == 5 and cfg.compile is True and cfg.seed is None
    assert cfg.options == {"depth": 2}


@pytest.mark.parametrize("text", ["lr", "=3", "optim..lr=1"])
def test_malformed_override(text):
    with pytest.raises(ConfigError, match="override must look like key.sub=value"):
        parse_override(text)


def test_override_into_a_value_is_an_error():
    with pytest.raises(ConfigError, match="'model' is not a section"):
        apply_overrides({"model": "vit"}, ["model.depth=2"])


# ---------------------------------------------------------------------------- numbers past 64 bits


def test_a_count_past_64_bits_is_refused_naming_its_key(capsys):
    assert main(["train", "vit-digits", "train.steps=1000000000000000000000"]) == 2
    assert "train.steps must be a whole number of 64 bits" in one_line(capsys.readouterr().err)
