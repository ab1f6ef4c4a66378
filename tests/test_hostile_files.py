"""Hostile files are bounded: a chat template's output, values and time; JSON's size and
depth wherever attnlab reads it; config.json sizes that would imply huge memory (a sliding
window of 10^12 positions); command-line text that is not UTF-8. Each is refused in one
line, exit 2, before the work it would size; each test takes seconds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
import torch

from attnlab.cli import main
from attnlab.data import chat
from attnlab.data.tokenizers.chat import render_chat
from attnlab.errors import InputError
from attnlab.jsonfile import json_depth, parse_json, read_json
from attnlab.limits import CHAT_MAX_CHARS, JSON_MAX_DEPTH

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

from test_lm_from_folder import model_folder  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


def one_line_refusal(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return model_folder("llama", tmp_path_factory.mktemp("llama"))


def variant(llama, tmp_path, **config):
    """A copy of the tiny Llama folder with ``config`` merged into its config.json."""
    folder = tmp_path / "variant"
    shutil.copytree(llama, folder)
    c = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**c, **config}))
    return folder


# -- chat templates --------------------------------------------------------------------------

@pytest.mark.parametrize("template, said", [
    ("{% for i in range(100000) %}{{ 'twenty characters...' }}{% endfor %}", "its output passed the limit of 1,000,000"),
    ("{{ 'x' * 10**9 }}", "a value of 1,000,000,000 characters, past the limit of 1,000,000"),
    ("{{ 'x' | center(10**9) }}", "the filter center was given 1,000,000,000"),
    ("{{ 'x'.ljust(10**9) }}", "ljust was given 1,000,000,000"),
    ("{% set ns = namespace(s='x' * 600000) %}{{ ns.s + ns.s }}", "a value of 1,200,000 characters"),
    ("{{ 7 ** (10**9) }}", "past the limit of 1,000,000"),
])
def test_a_chat_template_cannot_make_more_than_its_limit(template, said):
    start = time.perf_counter()
    with pytest.raises(InputError, match="CHAT_MAX_CHARS") as info:
        render_chat(template, HI)
    assert said in str(info.value) and time.perf_counter() - start < 2


@pytest.mark.parametrize("template, said", [
    ("{{ messages|tojson(indent=1000000000) }}", "the filter tojson was given 1,000,000,000"),
    ("{{ (messages * 1000)|tojson(indent=900000) }}", "tojson made a value of more than 1,000,000"),
    ("{{ '%1000000000s'|format('x') }}", "the filter format would make a value of 1,000,000,000"),
    ("{{ '%.1000000000f' % 1.0 }}", "a value of 1,000,000,000 characters"),
    ("{{ '{:>1000000000}'.format('x') }}", "format would make a value of 1,000,000,000"),
    ("{{ ('\\n' * 999999)|indent(999999) }}", "the filter indent would make a value of 999,999,999,999"),
    ("{{ ('x' * 999999)|replace('x', 'xx' * 1000) }}", "the filter replace would make"),
    ("{{ ('x' * 999999).replace('', 'yy') }}", "replace would make a value of 2,999,999"),
    ("{{ (['x' * 999999] * 1000)|join }}", "the filter join would make a value of 999,999,000"),
    ("{{ '-'.join(['x' * 999999] * 1000) }}", "join would make a value of 999,999,999"),
    ("{{ ('\\t' * 999999).expandtabs(999999) }}", "expandtabs would make"),
])
def test_what_multiplies_a_value_is_refused_before_it_is_made(template, said):
    with pytest.raises(InputError, match="CHAT_MAX_CHARS") as info:
        render_chat(template, HI)
    assert said in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the memory is read from Linux's /proc")
def test_a_template_that_doubles_a_value_is_stopped_at_its_memory_limit():
    """The three templates that reached 4-6 GB before: the process grows by a few times
    CHAT_MAX_BYTES at most (a doubling can land between two looks at the memory)."""
    code = """
import resource
from attnlab.data.tokenizers.chat import render_chat
from attnlab.errors import InputError
from attnlab.limits import CHAT_MAX_BYTES
hi = [{"role": "user", "content": "hi"}]
render_chat("{{ messages|tojson }}", hi)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
for template in ["{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 "{{ messages|tojson(indent=1000000000) }}", "{{ '%1000000000s'|format('x') }}"]:
    try:
        render_chat(template, hi)
        print("rendered")
    except InputError as exc:
        print("refused", "CHAT_MAX" in str(exc))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print("grown", grown / CHAT_MAX_BYTES)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = done.stdout.split("\n")
    assert lines[:3] == ["refused True"] * 3, done.stdout + done.stderr
    assert float(lines[3].split()[1]) < 3.5, lines[3]


def test_a_chat_template_that_runs_long_is_stopped_at_its_time_limit(monkeypatch):
    monkeypatch.setattr(chat, "CHAT_MAX_SECONDS", 0.3)
    start = time.perf_counter()
    with pytest.raises(InputError, match=r"ran past the limit of 0.3 s \(attnlab.limits.CHAT_MAX_SECONDS\)"):
        # prints nothing: only the clock on each line of the template's code can stop it
        render_chat("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", HI)
    assert time.perf_counter() - start < 2
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__  # the trace is taken back


def test_a_real_template_renders_as_before_within_the_limits():
    template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert render_chat(template, HI * 3) == "<|user|>hi" * 3 + "<|assistant|>"
    # a large number as a filter's value (not its count) is no size: filters with and without Jinja's context
    assert render_chat("{{ 1700000000 | string }} {{ 1700000000 | attr('real') }}", HI) == "1700000000 1700000000"
    text = "y" * (CHAT_MAX_CHARS - 100)  # close to the limit is still rendered
    assert len(render_chat("{{ messages[0].content }}", [{"role": "user", "content": text}])) == len(text)


def test_generate_chat_with_a_hostile_template_exits_2_in_one_line(llama, tmp_path, capsys):
    folder = variant(llama, tmp_path)
    (folder / "chat_template.jinja").write_text("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}")
    one_line_refusal(capsys, ["generate", str(folder), "hi", "--chat", "--max-new-tokens", "1"],
                     "chat_template.jinja was stopped: its output passed the limit of 1,000,000 characters")
    (folder / "chat_template.jinja").write_bytes(b"{# " + b"x" * (2**20 + 1) + b" #}")
    one_line_refusal(capsys, ["generate", str(folder), "hi", "--chat", "--max-new-tokens", "1"],
                     "chat_template.jinja is 1,048,583 bytes, more than the 1,048,576")


# -- JSON ------------------------------------------------------------------------------------

def test_json_depth_counts_brackets_outside_strings():
    assert json_depth(b'{"a": [1, {"b": "]]]][[[["}], "c": "\\"[[["}') == 3
    assert json_depth(b'["\\\\", [["x"]]]') == 3  # an escaped backslash ends no string
    assert json_depth(b"17") == 0 and json_depth(b"[]") == 1


def test_deep_or_large_json_is_refused_before_it_is_parsed(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000  # Python's own parser dies of a RecursionError on it
    with pytest.raises(InputError, match=f"x.json nests its JSON 200000 levels deep, more than the {JSON_MAX_DEPTH}"):
        parse_json(deep, "x.json")
    assert parse_json("[" * JSON_MAX_DEPTH + "]" * JSON_MAX_DEPTH, "ok") is not None
    with pytest.raises(InputError, match="y.json is 2,001 bytes of JSON, more than the 2,000 attnlab reads"):
        parse_json(b" " * 2001, "y.json", max_bytes=2000)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:  # a sparse file: 200 MB on paper, nothing on the disk; refused before it is read
        f.truncate(200 * 2**20)
    with pytest.raises(InputError, match="huge.json is 209,715,200 bytes of JSON, more than the 134,217,728"):
        read_json(huge)
    with pytest.raises(InputError, match=r"z.json is not JSON attnlab reads: .*digits"):
        parse_json("1" * 5000, "z.json")  # more digits than Python converts


def test_a_config_json_nested_a_million_deep_exits_2_in_one_line(llama, tmp_path, capsys):
    folder = variant(llama, tmp_path)
    (folder / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 10**6 + "]" * 10**6 + "}")
    one_line_refusal(capsys, ["generate", str(folder), "hi"], "config.json nests its JSON 1000001 levels deep")


def test_a_json_lines_data_set_nested_too_deep_exits_2_in_one_line(tmp_path, capsys):
    data = tmp_path / "reviews.jsonl"
    rows = [json.dumps({"text": f"a fine film {i}", "label": "pos" if i % 2 else "neg"}) for i in range(20)]
    rows[3] = '{"text": ' + "[" * 5000 + "]" * 5000 + ', "label": "pos"}'
    data.write_text("\n".join(rows) + "\n")
    one_line_refusal(capsys, ["train", "text-classification", f"data.train={data}", "--run-dir", str(tmp_path / "r")],
                     "reviews.jsonl: line 4 nests its JSON 5001 levels deep")


def test_a_metrics_line_nested_too_deep_is_a_damaged_line_not_a_crash(tmp_path):
    from attnlab.engine.metrics import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1, "loss": 2.0}\n' + "[" * 5000 + "]" * 5000 + "\n"
                    '{"kind": "train", "step": 2, "loss": 1.0}\n')
    with pytest.raises(InputError, match=r"metrics.jsonl: line 2 is not a JSON record \(the file is damaged"):
        read_metrics(path)  # (Python's parser alone raises a RecursionError here)


# -- config.json sizes -----------------------------------------------------------------------

def test_a_sliding_window_of_ten_to_the_twelve_generates_in_the_memory_of_its_tokens(llama, tmp_path, capsys):
    from attnlab.formats import from_hf

    folder = variant(llama, tmp_path, model_type="mistral", architectures=["MistralForCausalLM"],
                     sliding_window=10**12, max_position_embeddings=10**12)
    model = from_hf(folder)
    assert model.config.sliding_window == 10**12
    ids = torch.tensor([[1, 5, 9, 13]])
    cache = model.new_cache(1, 4 + 6)
    model(ids, cache=cache)
    # the buffers hold the positions the generation can take, not the window's 10^12
    assert all(c.nbytes() <= 2 * 10 * 32 * 4 for c in cache)
    # a window wider than everything is full attention: the tokens of the model without one
    full = from_hf(variant(llama, tmp_path / "full", model_type="mistral", architectures=["MistralForCausalLM"],
                           sliding_window=None))
    assert torch.equal(model.generate(ids, 6), full.generate(ids, 6))
    assert main(["generate", str(folder), "hi", "--max-new-tokens", "3"]) == 0


@pytest.mark.parametrize("config, said", [
    ({"hidden_size": 10**9}, "hidden_size"),
    ({"num_hidden_layers": 10**6}, "num_hidden_layers 1000000 disagrees with the weights: they hold 2 layers"),
    ({"vocab_size": 10**10}, "10000000000"),
    ({"head_dim": 10**9}, "in its config"),
])
def test_a_config_size_beyond_the_weights_exits_2_in_one_line_before_any_allocation(llama, tmp_path, capsys, config,
                                                                                       said):
    one_line_refusal(capsys, ["generate", str(variant(llama, tmp_path, **config)), "hi"], said)


# -- command-line text -----------------------------------------------------------------------

@pytest.mark.parametrize("args, said", [
    ([b"train", b"vit-digits", b"train.lr=\xff"], "override 'train.lr' is not valid UTF-8 (byte 0xff at character 9)"),
    ([b"train", b"vit-digits", b"--run-dir", b"runs/caf\xe9"], "--run-dir is not valid UTF-8 (byte 0xe9 at character 8)"),
    ([b"recipes", b"vit\xff"], "NAME is not valid UTF-8"),
    ([b"predict", b"run\xff", b"text"], "RUN_DIR is not valid UTF-8"),
])
def test_command_line_text_that_is_not_utf8_exits_2_in_one_line(args, said, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, cwd=tmp_path, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert said in err and "attnlab reads its command line as UTF-8 text" in err
    assert not (tmp_path / "runs").exists()  # refused before any work
