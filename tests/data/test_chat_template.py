"""Chat templates: a folder's template (``chat_template.jinja``, or ``chat_template`` in
``tokenizer_config.json``) renders a conversation exactly as ``transformers``'
``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` does (the
sandbox, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``, ``strftime_now``, ``tojson``,
the special tokens), and ``attnlab generate FOLDER --chat MESSAGE`` replies to it."""

import json
import subprocess
import sys
import time

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from attnlab.cli import main
from attnlab.data.tokenizers import chat
from attnlab.data.tokenizers.chat import render_chat
from attnlab.data.tokenizers.lm import HFTokenizer, load_run_tokenizer
from attnlab.errors import InputError
from attnlab.limits import CHAT_MAX_CHARS

from hf_folders import variant
from refusals import one_line_refusal


transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
           "<|end_header_id|>", "<s>", "</s>"]

# Qwen's ChatML: a default system message when none is given
CHATML = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'system' and loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Llama 3's kind: bos_token, a namespace, today's date, block tags on lines of their own (trim_blocks and
# lstrip_blocks decide its white space), tojson of the conversation
LLAMA3 = """{{ bos_token }}
{% set ns = namespace(system='') %}
{% if messages[0]['role'] == 'system' %}
    {% set ns.system = messages[0]['content'] | trim %}
{% endif %}
<|start_header_id|>system<|end_header_id|>

Today Date: {{ strftime_now("%d %b %Y") }}
{{ ns.system }}<|eot_id|>
{% for message in messages %}
    {% if message['role'] != 'system' %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
    {% endif %}
{% endfor %}
<!-- {{ messages | tojson }} -->
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}
"""

# Mistral's kind: roles must alternate, and a system message is refused (raise_exception)
MISTRAL = ("{{ bos_token }}{% for message in messages %}"
           "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "mistral": MISTRAL}
USER = [{"role": "user", "content": "  Hello, café au lait? 😀 "}]
SYSTEM = [{"role": "system", "content": "Be brief."}] + USER


@pytest.fixture(scope="module")
def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = "Hello there, how are you? Be brief. You are a helpful assistant. Today Date: 01 Jan 2026\n" * 5
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def save_folder(tokenizer, folder, template, *, jinja=True):
    """The tokenizer as transformers 5 saves it (the template in chat_template.jinja), or with
    the template under chat_template in tokenizer_config.json (``jinja=False``, the older form)."""
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                                              eos_token="<|eot_id|>", pad_token="<|endoftext|>")
    hf.chat_template = template
    hf.save_pretrained(folder)
    if not jinja and template is not None:
        (folder / "chat_template.jinja").unlink()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return folder


@pytest.mark.parametrize("name", ["chatml", "llama3", "mistral"])
@pytest.mark.parametrize("jinja", [True, False], ids=["chat_template.jinja", "tokenizer_config.json"])
def test_rendered_chat_equals_transformers_apply_chat_template(tokenizer, tmp_path, name, jinja):
    folder = save_folder(tokenizer, tmp_path, TEMPLATES[name], jinja=jinja)
    assert (folder / "chat_template.jinja").is_file() == jinja
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = HFTokenizer.load(folder)
    for messages in ([USER, SYSTEM] if name != "mistral" else [USER]):
        expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        text = ours.chat_prompt(messages)
        assert text == expected
        ids = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
        assert ours.encode_prompt(text, special_tokens=False) == list(ids)  # its special tokens read as tokens
    if name == "chatml":
        assert text.endswith("<|im_start|>assistant\n") and "You are a helpful assistant." in ours.chat_prompt(USER)
    if name == "llama3":
        assert text.startswith("<|begin_of_text|>\n<|start_header_id|>system<|end_header_id|>\n\nToday Date: ")


def test_a_template_that_refuses_the_conversation_is_one_line_as_transformers_refuses_it(tokenizer, tmp_path):
    folder = save_folder(tokenizer, tmp_path, MISTRAL)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        theirs.apply_chat_template(SYSTEM, tokenize=False, add_generation_prompt=True)
    with pytest.raises(InputError, match=r"chat_template.jinja refused the conversation: Conversation roles must "
                                         r"alternate user/assistant"):
        HFTokenizer.load(folder).chat_prompt(SYSTEM)
    with pytest.raises(InputError, match="Only user and assistant roles are supported"):
        HFTokenizer.load(folder).chat_prompt(USER + [{"role": "tool", "content": "x"}])
    with pytest.raises(InputError, match=r"is not a valid Jinja template \(line 1"):
        render_chat("{% for m in messages %}", USER, source="broken.jinja")


def test_the_sandbox_keeps_a_template_from_python_internals():
    with pytest.raises(InputError, match="sandbox forbids|a namespace cannot hold"):
        render_chat("{% set ns = namespace(_x=1) %}", USER)
    assert render_chat("{{ ''.__class__ }}", USER) == ""  # an unsafe attribute reads as undefined


def test_a_run_directory_keeps_the_folders_chat_template(tokenizer, tmp_path):
    folder = save_folder(tokenizer, tmp_path / "folder", LLAMA3)
    HFTokenizer.load(folder).save(tmp_path / "run")
    assert load_run_tokenizer(tmp_path / "run").chat_prompt(SYSTEM) == HFTokenizer.load(folder).chat_prompt(SYSTEM)


@pytest.fixture(scope="module")
def chat_model(tokenizer, tmp_path_factory):
    """A random tiny GPT-2 with the ChatML template, whose generation ends at <|im_end|>."""
    folder = save_folder(tokenizer, tmp_path_factory.mktemp("chat"), CHATML)
    end = tokenizer.token_to_id("<|im_end|>")
    config = transformers.GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=128, n_embd=32, n_layer=2,
                                     n_head=4, bos_token_id=end, eos_token_id=end)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
    return folder


def test_generate_chat_replies_as_transformers_does_to_the_rendered_chat(chat_model, capsys):
    assert main(["generate", str(chat_model), USER[0]["content"], "--chat", "--system", "Be brief.",
                 "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    theirs = transformers.AutoTokenizer.from_pretrained(chat_model)
    ids = theirs.apply_chat_template(SYSTEM, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(chat_model).eval()
    reply = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    assert len(reply) > 0
    assert out == theirs.decode(reply, skip_special_tokens=True) + "\n"  # the reply alone, not the template


def test_chat_without_a_template_is_refused_naming_the_folder_and_its_files(chat_model, tokenizer, tmp_path, capsys):
    folder = tmp_path / "plain"
    save_folder(tokenizer, folder, None)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (folder / name).write_bytes((chat_model / name).read_bytes())
    assert main(["generate", str(folder), "Hi", "--chat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder} has no chat template" in err
    assert str(folder / "chat_template.jinja") in err and str(folder / "tokenizer_config.json") in err
    assert main(["generate", str(folder), "Hi", "--system", "Be brief."]) == 2
    assert "--system is the system message of a chat: give it with --chat" in capsys.readouterr().err


# ---------------------------------------------------------------------------- limits of a template


HI = [{"role": "user", "content": "hi"}]


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
