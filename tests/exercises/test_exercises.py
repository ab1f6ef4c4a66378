"""The tutorials' exercises (attnlab.exercises): every solution passes, every skeleton and every
typical mistake gets its sentence in both languages, the references are attnlab's own functions,
and each tutorial page ends with its exercises, their skeletons as exercises.skeleton gives them."""

import contextlib
import io
import math
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnlab import exercises
from attnlab.errors import InputError
from attnlab.exercises import catalog, solutions

ROOT = Path(__file__).resolve().parents[2]
NAMES = exercises.names()
MISTAKES = [(ex.name, m.key) for ex in catalog.EXERCISES for m in ex.mistakes]
FENCE = r'```python exec="on" source="above" result="text" session="([^"]+)"\n'


@pytest.fixture(autouse=True)
def _english_afterwards():
    yield
    exercises.set_language("en")


def _ex(name):
    return catalog.BY_NAME[name]


def _solution(name):
    return getattr(solutions, _ex(name).func)


def _quiet_check(name, fn, **kw):
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's var() on an empty batch
        return exercises.check(name, fn, **kw)


# ----------------------------------------------------------------------------- the catalogue


def test_every_tutorial_has_three_to_six_exercises_named_in_order():
    assert list(catalog.TUTORIALS) == ["attention", "norms", "transformer", "vit", "cnn", "efficient", "lm", "data",
                                       "inside"]
    for tutorial in catalog.TUTORIALS:
        names = exercises.names(tutorial)
        assert 3 <= len(names) <= 6, tutorial
        assert names == [f"{tutorial}-{n}" for n in range(1, len(names) + 1)]
    assert 30 <= len(NAMES) <= 45
    assert exercises.list_exercises() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_is_described_in_both_languages(name):
    ex = _ex(name)
    en, zh = exercises.describe(name, lang="en"), exercises.describe(name, lang="zh")
    assert en.startswith(f"{name}: {ex.title[0]}\n") and f"def {ex.func}({ex.params}):" in en
    assert zh.startswith(f"{name}: {ex.title[1]}\n") and re.search(r"[\u4e00-\u9fff]", zh)
    for pair in (ex.title, ex.task, ex.doc, ex.section):
        assert pair[0] and re.search(r"[\u4e00-\u9fff]", pair[1]), (name, pair)
    assert len(ex.mistakes) >= 2
    assert len({m.key for m in ex.mistakes}) == len(ex.mistakes)


@pytest.mark.parametrize("name", NAMES)
def test_skeleton_is_a_def_with_shapes_that_raises(name):
    ex = _ex(name)
    for lang, here in (("en", "your code here"), ("zh", "在这里写你的代码")):
        code = exercises.skeleton(name, lang=lang)
        assert code.startswith(f"def {ex.func}({ex.params}):\n    \"\"\"")
        assert code.endswith(f'    raise NotImplementedError("{here}")\n')
        compile(code, name, "exec")
    assert repr(exercises.skeleton(name)) == str(exercises.skeleton(name))  # a notebook shows the code itself


# ----------------------------------------------------------------------------- right, skeleton, mistakes


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_in_both_languages(name):
    for lang, start in (("en", f"✓ {name}: right on all "), ("zh", f"✓ {name}：全部 ")):
        verdict = _quiet_check(name, _solution(name), lang=lang)
        assert verdict and verdict.passed and verdict.case is None
        assert verdict.message.startswith(start), verdict.message


@pytest.mark.parametrize("name", NAMES)
def test_printed_solution_runs_on_its_own(name):
    namespace = {"math": math, "torch": torch, "F": F}
    exec(exercises.solution(name), namespace)
    assert _quiet_check(name, namespace[_ex(name).func])


@pytest.mark.parametrize("name", NAMES)
def test_skeleton_gets_the_friendly_message(name):
    for lang, told in (("en", "it is still the skeleton. Write your code in place of the line "
                              "`raise NotImplementedError(...)`"),
                       ("zh", "它还是练习给出的骨架代码。把 `raise NotImplementedError(...)` 这一行换成你自己的代码")):
        namespace = {"math": math, "torch": torch, "F": F}
        exec(exercises.skeleton(name, lang=lang), namespace)
        verdict = _quiet_check(name, namespace[_ex(name).func], lang=lang)
        assert not verdict
        assert verdict.message.startswith(f"✗ {name}")
        assert "NotImplementedError" in verdict.message and told in verdict.message, verdict.message
        assert verdict.case and verdict.case in verdict.message


@pytest.mark.parametrize("name,key", MISTAKES, ids=[f"{n}:{k}" for n, k in MISTAKES])
def test_typical_mistake_gets_its_diagnosis(name, key):
    mistake = next(m for m in _ex(name).mistakes if m.key == key)
    for lang, cause in (("en", " Likely cause: "), ("zh", "可能的原因：")):
        verdict = _quiet_check(name, mistake.fn, lang=lang)
        assert not verdict
        assert cause + mistake.text(lang) in verdict.message, verdict.message


# ----------------------------------------------------------------------------- what is told


def test_wrong_shape_is_told_expected_and_got():
    verdict = _quiet_check("attention-2", lambda x, num_heads: x)
    assert "the output has the wrong shape: expected (2, 3, 5, 4), got (2, 5, 12)" in verdict.message
    assert "case 1 of 6 (random inputs: x (2, 5, 12), num_heads=3)" in verdict.message
    zh = _quiet_check("attention-2", lambda x, num_heads: x, lang="zh")
    assert "输出的形状不对：应为 (2, 3, 5, 4)，实际为 (2, 5, 12)" in zh.message


def test_nan_is_told_with_its_place():
    verdict = _quiet_check("norms-3", lambda x, weight, eps=1e-6: solutions.rms_norm(x, weight, eps) * math.nan)
    assert "the output has NaN at 80 places, the first at [0, 0, 0], where the reference has" in verdict.message


def test_largest_difference_is_told_with_its_index_and_values():
    def off(x, num_heads):
        out = solutions.split_heads(x, num_heads).clone()
        out[1, 2, 3, 0] += 0.5
        return out

    verdict = _quiet_check("attention-2", off)
    assert re.search(r"differs from the reference at 1 of 120 places; the largest difference is at \[1, 2, 3, 0\]: "
                     r"expected -?[\d.]+, got -?[\d.]+\.$", verdict.message), verdict.message
    assert "Likely cause" not in verdict.message  # no typical mistake looks like this


def test_float32_for_float16_inputs_is_told():
    verdict = _quiet_check("attention-2", lambda x, num_heads: solutions.split_heads(x.float(), num_heads))
    assert "case 4 of 6 (float16: x (2, 3, 8) float16, num_heads=2)" in verdict.message
    assert "has dtype float32 for float16 inputs: keep the inputs' dtype" in verdict.message


def test_float16_is_compared_in_float32_with_a_looser_tolerance():
    def in_float32(x, weight, eps=1e-6):  # computed in float32, returned in the inputs' dtype
        return solutions.rms_norm(x.float(), weight.float(), eps).to(x.dtype)

    assert _quiet_check("norms-3", in_float32)


def test_a_tuple_a_numpy_array_a_list_or_none_is_told_what_was_expected():
    assert "the output is a tuple of 1; one tensor is expected" in \
        _quiet_check("attention-2", lambda x, h: (solutions.split_heads(x, h),)).message
    assert "the output is a numpy array; return a torch tensor" in \
        _quiet_check("attention-2", lambda x, h: solutions.split_heads(x, h).numpy()).message
    assert "returned value 2 (labels) is a list of 12; one tensor is expected" in \
        _quiet_check("data-1", lambda p: (solutions.class_index(p)[0], solutions.class_index(p)[1].tolist())).message
    assert "your function returned one tensor; a tuple of 2 is expected (output, weights)" in \
        _quiet_check("attention-1", lambda q, k, v, m: solutions.masked_attention(q, k, v, m)[0]).message
    assert "the output is None (did you forget `return`?)" in _quiet_check("attention-3", lambda x: None).message
    assert "the output is a Python float; return a torch tensor" in \
        _quiet_check("transformer-3", lambda lo, ta, p: solutions.padded_loss(lo, ta, p).item()).message


def test_an_error_of_the_learner_is_told_with_the_case():
    verdict = _quiet_check("attention-3", lambda x: x.view(-1, 7))
    assert verdict.message.startswith("✗ attention-3: your function raised RuntimeError on case 1 of 6 "
                                      "(random inputs: x (2, 3, 5, 4)): ")


def test_an_input_changed_in_place_is_told():
    def in_place(x, num_heads):
        x.mul_(1.0).add_(1.0)
        return solutions.split_heads(x - 1.0, num_heads)

    verdict = _quiet_check("attention-2", in_place)
    assert "your function changed its input x in place on case 1 of 6" in verdict.message


def test_a_check_prints_its_sentence_once(monkeypatch):
    class Shell:
        execution_count = 7

    ipython = type(sys)("IPython")
    ipython.get_ipython = lambda: Shell  # a notebook, in its cell 7
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        verdict = exercises.check("attention-3", solutions.merge_heads)
        verdict._ipython_display_()  # the cell's value, displayed after the cell: printed already
    assert buffer.getvalue() == verdict.message + "\n"
    Shell.execution_count = 8
    with contextlib.redirect_stdout(buffer):
        verdict._ipython_display_()  # shown in a later cell: printed
    assert buffer.getvalue() == (verdict.message + "\n") * 2
    assert str(verdict) == repr(verdict) == verdict.message
    with pytest.raises(AttributeError):
        verdict.passed = False  # type: ignore[misc]


def test_a_check_prints_with_the_print_of_its_caller():
    shown = []  # markdown-exec gives a page's block a print of its own, which collects what the page shows
    namespace = {"print": lambda *texts, **kw: shown.append(" ".join(map(str, texts))), "exercises": exercises,
                 "merge_heads": solutions.merge_heads}
    exec('exercises.check("attention-3", merge_heads)', namespace)
    assert len(shown) == 1 and shown[0].startswith("✓ attention-3: right on all 6 cases")


def test_checks_leave_the_global_random_state_alone_and_repeat():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = _quiet_check("cnn-1", solutions.pixel_attention)  # builds attnlab's block: its init draws
    wrong = _quiet_check("norms-1", lambda x, w, b, eps=1e-5: solutions.layer_norm(x, w, b, eps) + 1e-3)
    assert torch.equal(before, torch.get_rng_state())
    assert first and wrong.message == _quiet_check("norms-1", lambda x, w, b, eps=1e-5:
                                                   solutions.layer_norm(x, w, b, eps) + 1e-3).message


# ----------------------------------------------------------------------------- languages and names


def test_set_language_is_the_default_of_every_message():
    exercises.set_language("zh")
    assert exercises.get_language() == "zh"
    assert _quiet_check("attention-3", solutions.merge_heads).message.startswith("✓ attention-3：全部 6 个用例都正确")
    assert "合并多个头" in exercises.describe("attention-3")
    assert _quiet_check("attention-3", solutions.merge_heads, lang="en").message.startswith("✓ attention-3: right")


@pytest.mark.parametrize("call", [
    lambda: exercises.check("attention-1", solutions.masked_attention, lang="fr"),
    lambda: exercises.set_language("fr"),
    lambda: exercises.describe("attention-1", lang="fr"),
    lambda: exercises.skeleton("attention-1", lang="fr"),
])
def test_a_wrong_lang_is_refused_naming_it(call):
    with pytest.raises(InputError, match=r"lang must be one of 'en' \(English\) or 'zh' \(Chinese\); got 'fr'"):
        call()


def test_an_unknown_name_is_refused_with_did_you_mean():
    with pytest.raises(InputError, match=r"name must be the name of an exercise, such as 'attention-1'; "
                                         r"got 'atention-1'; did you mean attention-1"):
        exercises.check("atention-1", solutions.masked_attention)
    for call in (exercises.describe, exercises.skeleton, exercises.solution):
        with pytest.raises(InputError, match="got 'lm-9'"):
            call("lm-9")
    with pytest.raises(InputError, match=r"tutorial must be one of .*; got 'vits'; did you mean vit"):
        exercises.names("vits")


def test_fn_must_be_callable():
    with pytest.raises(InputError, match="fn must be your function .*such as merge_heads; got int"):
        exercises.check("attention-3", 3)


# ----------------------------------------------------------------------------- the references are attnlab's


def _resolve(dotted):
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("name", [ex.name for ex in catalog.EXERCISES if ex.library])
def test_the_reference_named_as_attnlabs_exists(name):
    assert callable(_resolve(_ex(name).library))


def test_split_and_merge_heads_are_multi_head_attention_by_hand():
    from attnlab.attention import MultiHeadAttention, scaled_dot_product_attention

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        heads, _ = scaled_dot_product_attention(*(solutions.split_heads(p(x), 4) for p in (mha.q_proj, mha.k_proj,
                                                                                              mha.v_proj)))
        assert torch.allclose(mha.o_proj(solutions.merge_heads(heads)), mha(x)[0], atol=1e-6)


def test_patchify_is_the_patch_embedding_of_attnlab():
    from attnlab.layers.patch_embed import PatchEmbed

    torch.manual_seed(0)
    layer = PatchEmbed(img_size=8, patch_size=4, in_chans=3, embed_dim=10)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        by_hand = solutions.patchify(x, 4) @ layer.proj.weight.reshape(10, -1).T + layer.proj.bias
        assert torch.allclose(by_hand, layer(x), atol=1e-5)


def test_class_token_sequence_is_what_the_vits_first_block_receives():
    import attnlab

    torch.manual_seed(0)
    vit = attnlab.create_model("vit_digits_patch2", depth=1).eval()
    seen = {}
    hook = vit.blocks[0].register_forward_pre_hook(lambda module, args: seen.update(x=args[0]))
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        vit.forward_features(x)
        ours = solutions.add_class_token(vit.patch_embed(x), vit.cls_token, vit.pos_embed)
    hook.remove()
    assert torch.allclose(ours, seen["x"], atol=1e-6)


def test_window_mask_is_the_band_of_local_attention():
    from attnlab.attention import scaled_dot_product_attention
    from attnlab.attention.variants.local import local_attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 9, 4).unbind(0)
    for causal in (False, True):
        exact, _ = scaled_dot_product_attention(q, k, v, attn_mask=solutions.window_mask(9, 3, causal))
        assert torch.allclose(local_attention(q, k, v, 3, is_causal=causal), exact, atol=1e-5)


def test_repeat_kv_is_grouped_query_attention_by_hand():
    from attnlab.attention import GroupedQueryAttention, scaled_dot_product_attention

    torch.manual_seed(0)
    gqa = GroupedQueryAttention(32, 4, num_kv_heads=2).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        q = gqa.q_proj(x).view(2, 6, 4, 8).transpose(1, 2)
        k, v = (p(x).view(2, 6, 2, 8).transpose(1, 2) for p in (gqa.k_proj, gqa.v_proj))
        heads, _ = scaled_dot_product_attention(q, solutions.repeat_kv(k, 2), solutions.repeat_kv(v, 2), is_causal=True)
        by_hand = gqa.o_proj(heads.transpose(1, 2).reshape(2, 6, 32))
        assert torch.allclose(by_hand, gqa(x, is_causal=True)[0], atol=1e-5)


def test_class_index_is_the_image_folders_classes(tmp_path):
    from attnlab.data.readers.image_scan import scan_images

    for name in ("three", "one", "Zebra", "two"):
        (tmp_path / name).mkdir()
        for k in range(2):
            (tmp_path / name / f"{k}.png").write_bytes(b"")
    classes, samples, _ = scan_images(tmp_path)
    paths = [f"root/{Path(f).parent.name}/{Path(f).name}" for f, _ in samples]
    ours, labels = solutions.class_index(paths)
    assert ours == classes and labels.tolist() == [label for _, label in samples]


def test_encode_chars_is_attnlabs_char_tokenizer():
    from attnlab.data.tokenizers.lm import CharTokenizer

    text = "First Citizen:\n注意力就是你所需要的。"
    tokenizer = CharTokenizer.train(text, eos=False)
    chars, ids = solutions.encode_chars(text)
    assert chars == tokenizer.chars and ids.tolist() == tokenizer.encode(text)
    assert "".join(chars[i] for i in ids) == text


def test_lm_windows_are_the_windows_of_lm_dataset():
    from attnlab.data.batches.lm import LMDataset
    from attnlab.data.tokenizers.lm import CharTokenizer

    text = "to be, or not to be"  # 19 characters, context 4: the last window short
    dataset = LMDataset([text], CharTokenizer.train(text, eos=False), 4)
    inputs, labels = dataset.get_batch(range(len(dataset)))
    x, y = solutions.lm_windows(dataset.tokens, 4)
    assert torch.equal(x, inputs["input_ids"]) and torch.equal(y, labels)


def test_head_figures_are_the_explorers():
    from attnlab.viz.explorer.documents import head_stats

    torch.manual_seed(0)
    tokens = torch.tensor([3, 9, 2, 5, 3, 9, 2, 5])
    w = torch.randn(4, 8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), -math.inf).softmax(-1)
    stats = head_stats([w], [str(t) for t in tokens.tolist()])
    assert torch.allclose(solutions.head_entropy(w), torch.tensor(stats["entropy"][0]), atol=1e-5)
    assert torch.allclose(solutions.previous_token_score(w), torch.tensor(stats["previous"][0]), atol=1e-5)
    assert torch.allclose(solutions.induction_score(w, tokens), torch.tensor(stats["induction"][0]), atol=1e-5)


# ----------------------------------------------------------------------------- the pages' exercises


def _page(stem, lang):
    return (ROOT / "docs" / lang / "tutorials" / f"{stem}.md").read_text(encoding="utf-8")


def _exercise_section(stem, lang):
    """The tutorial page's exercises: from its "## Exercises" (练习) to its "## Next" (下一步)."""
    start, end = ("## Exercises\n", "## Next\n") if lang == "en" else ("## 练习\n", "## 下一步\n")
    text = _page(stem, lang)
    assert text.count(start) == 1 and text.index(start) < text.index(end), (stem, lang)
    return text[text.index(start):text.index(end)]


def _blocks(text):
    return re.findall(FENCE + r"(.*?)```\n", text, flags=re.S)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("tutorial", list(catalog.TUTORIALS))
def test_tutorial_page_ends_with_each_skeleton_as_given(tutorial, lang):
    stem = catalog.TUTORIALS[tutorial][0]
    text = _exercise_section(stem, lang)
    session = re.search(r'session="([^"]+)"', _page(stem, lang)).group(1)  # the page's first block's
    names = exercises.names(tutorial)
    assert text.rstrip().splitlines()[-1].startswith("Solutions: `print(exercises.solution(" if lang == "en" else
                                                     "参考答案：`print(exercises.solution(")
    blocks = _blocks(text)
    assert len(blocks) == len(names) == text.count("```python")
    for i, (name, (block_session, block)) in enumerate(zip(names, blocks)):
        assert block_session == session, name  # the page's session: the notebook is one kernel
        func = _ex(name).func
        assert (f"(`{name}`)" if lang == "en" else f"（`{name}`）") in text
        defined = re.search(rf"^def {func}\(.*?(?=^\S)", block + "\n#", flags=re.S | re.M).group(0)
        assert defined.rstrip("\n") + "\n" == exercises.skeleton(name, lang=lang), name
        assert block.rstrip().endswith(f'exercises.check("{name}", {func})')
        assert "from attnlab import exercises" in block
        assert ('exercises.set_language("zh")' in block) == (lang == "zh" and i == 0)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("tutorial", list(catalog.TUTORIALS))
def test_sections_an_exercise_practises_are_the_pages_headings(tutorial, lang):
    stem = catalog.TUTORIALS[tutorial][0]
    headings = dict(re.findall(r"^## (\d+)\. (.*)$", _page(stem, lang), flags=re.M))
    for name in exercises.names(tutorial):
        said = _ex(name).section[0 if lang == "en" else 1]
        titles = re.findall(r"“([^”]*)”", said)
        numbers = re.findall(r"\d+", re.sub(r"“[^”]*”", "“”", said).split("(")[0].split("（")[0])
        assert numbers and len(numbers) == len(titles), (name, said)
        for number, title in zip(numbers, titles):
            assert headings.get(number, "").startswith(title), (name, number, title, headings.get(number))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_page_blocks_run_and_print_the_skeleton_message(lang):
    told = "it is still the skeleton" if lang == "en" else "它还是练习给出的骨架代码"
    for tutorial, (stem, _, _) in catalog.TUTORIALS.items():
        namespace: dict = {}
        for name, (_, block) in zip(exercises.names(tutorial), _blocks(_exercise_section(stem, lang))):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(block, namespace)
            assert out.getvalue().startswith(f"✗ {name}") and told in out.getvalue(), out.getvalue()
        exercises.set_language("en")
