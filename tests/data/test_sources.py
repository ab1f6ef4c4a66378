"""Data sources are one layer behind one registry: each declares its keys, a recipe's data
section is read as the keys of the source it names, and no task names a source."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.data import Source, get_source, list_sources, register_source
from attnlab.data.sources.image_folder import FolderConfig
from attnlab.data.kinds.labelled_images import ImageSource, ImageSourceConfig
from attnlab.data.kinds.labelled_texts import TextSourceConfig
from attnlab.engine.config import ConfigError, from_dict
from attnlab.errors import InputError
from attnlab.recipes import load_recipe
from attnlab.tasks import recipe_dict

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"


def test_every_built_in_source_is_registered_under_its_kind():
    kinds = {}
    for source in list_sources():
        kinds.setdefault(source.kind, []).append(source.name)
    assert kinds["images"][:3] == ["digits", "cifar10", "folder"]
    assert kinds["labelled_texts"][:2] == ["mr", "file"]
    assert kinds["sentence_pairs"][:2] == ["multi30k", "files"]
    assert kinds["reversal"] == ["reverse"]


def test_a_data_section_is_read_as_the_keys_of_the_source_it_names():
    folder = from_dict(ImageSourceConfig, {"name": "folder", "root": "photos", "img_size": 16}, "data")
    assert type(folder) is FolderConfig and folder.root == "photos" and folder.img_size == 16
    digits = from_dict(ImageSourceConfig, {"augment": True}, "data")  # no name: the kind's default source
    assert type(digits) is ImageSourceConfig and digits.name == "digits"
    assert set(recipe_dict(load_recipe("vit-digits"))["data"]) == {"name", "data_dir", "augment", "crop_padding",
                                                                   "val_size", "seed", "max_per_class"}


@pytest.mark.parametrize("data, message", [
    ({"root": "photos"}, r"data\.root applies to data\.name=folder; got data\.name='digits'"),
    ({"name": "foldr"}, r"data\.name must be one of 'digits', 'cifar10', 'folder'.*got 'foldr'.*folder"),
    ({"name": "mr"}, r"got 'mr' \('mr' is a source of labelled_texts\)"),
    ({"name": 3}, r"data\.name must be the name of a data source; got 3"),
])
def test_a_key_or_name_that_does_not_fit_the_source_is_one_clear_error(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(ImageSourceConfig, data, "data")


def test_a_config_built_in_python_must_be_its_sources_class():
    with pytest.raises(InputError, match=r"data\.name='digits' takes its settings as ImageSourceConfig; got a "
                                         r"FolderConfig"):
        FolderConfig(name="digits")
    with pytest.raises(InputError, match="data.name must be one of 'mr', 'file'"):
        TextSourceConfig(name="cifar10")


def test_the_keys_a_resume_may_change_are_the_sources_to_declare():
    keys = FolderConfig(root="photos").fixed_keys()
    assert "data.root" in keys and "data.img_size" in keys and "data.name" in keys
    assert not {"data.cache", "data.cache_mb", "data.augment", "data.data_dir"} & set(keys)


def test_register_source_refuses_what_it_cannot_register():
    with pytest.raises(InputError, match="data source 'digits' is already registered"):
        @register_source
        class Again(ImageSource):
            name = "digits"

    with pytest.raises(InputError, match="register_source takes a Source subclass"):
        register_source(object)

    @dataclasses.dataclass
    class TextKeys(TextSourceConfig):
        pass

    with pytest.raises(InputError, match="config_class must be of its kind 'images'"):
        @register_source
        class Mixed(ImageSource):
            name = "mixed_kinds"
            config_class = TextKeys
    assert [s.name for s in list_sources() if s.name in ("mixed_kinds",)] == []
    assert isinstance(get_source("digits"), Source)


def test_no_file_outside_data_compares_data_name_with_a_string():
    import re

    pattern = re.compile(r"data\.name\s*(==|!=|\bin\b)|\.name\s*(==|!=)\s*[\"'](digits|cifar10|folder|mr|file|files|"
                         r"multi30k|reverse)[\"']")
    found = [f"{path.relative_to(SRC)}:{i}" for path in SRC.rglob("*.py") if path.parent.name != "data"
             for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_the_command_lists_the_sources_with_their_keys():
    r = subprocess.run([sys.executable, "-m", "attnlab", "sources"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    folder = next(i for i, line in enumerate(lines) if line.split()[:2] == ["images", "folder"])
    assert "root" in lines[folder + 1] and "img_size" in lines[folder + 1]
