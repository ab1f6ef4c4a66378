"""How an exercise is checked: its cases, the comparison of a learner's answer with the
reference, and the one or two sentences that say it is right or what is wrong first.

An :class:`Exercise` holds a reference function, a generator of :class:`Case` objects (tiny
tensors drawn from its own ``torch.Generator``, never the global one) and the typical
mistakes of that exercise, each a wrong variant of the reference (:class:`Mistake`). The
learner's function runs on a copy of every case; the first case whose answer differs from
the reference is described in words, with its shapes, and the wrong variants run on the
same inputs: one whose output equals the learner's names the likely cause.

float16 cases give the learner float16 inputs and compare with the reference computed on
the same inputs in float32, with a looser tolerance; an answer must keep float16.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["Verdict", "Case", "Mistake", "Exercise", "run_check", "set_language", "get_language",
           "resolve_language", "LANGUAGES"]

LANGUAGES = ("en", "zh")
_STATE = {"lang": "en"}


def set_language(lang: str) -> None:
    """The language of every later message, description and skeleton: ``"en"`` or ``"zh"``."""
    _STATE["lang"] = resolve_language(lang)


def get_language() -> str:
    """The language set by :func:`set_language` (``"en"`` at the start)."""
    return _STATE["lang"]


def resolve_language(lang: str | None) -> str:
    """``lang``, or the language set when it is ``None``; anything else than ``"en"`` and
    ``"zh"`` is refused naming ``lang``."""
    if lang is None:
        return _STATE["lang"]
    if lang not in LANGUAGES:
        raise InputError(f"lang must be one of 'en' (English) or 'zh' (Chinese); got {lang!r}")
    return lang


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Verdict:
    """What :func:`~attnlab.exercises.check` found. True when ``passed``; shows ``message``.

    ``case`` describes the first case that went wrong (``None`` when all passed)."""

    name: str
    passed: bool
    message: str
    case: str | None = None
    _printed_in: Any = field(default=None, repr=False, compare=False)  # the notebook cell that printed it

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message

    def _ipython_display_(self) -> None:
        # check() printed the message already: a notebook cell that ends with the call shows it
        # once; the verdict shown in another cell prints it.
        if self._printed_in is not None and self._printed_in == current_cell():
            return
        print(self.message)


def current_cell() -> int | None:
    """The number of the notebook cell running now (IPython's ``execution_count``); ``None``
    outside IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return getattr(shell, "execution_count", None)


@dataclass
class Case:
    """One set of inputs. ``label``: a key of :data:`LABELS` or an ``(en, zh)`` pair;
    ``half``: the inputs are float16 (the reference runs on them in float32)."""

    label: str | tuple[str, str]
    args: tuple
    half: bool = False

    def words(self, lang: str) -> str:
        pair = LABELS[self.label] if isinstance(self.label, str) else self.label
        return pair[LANGUAGES.index(lang)]


@dataclass(frozen=True)
class Mistake:
    """A typical mistake: ``fn`` computes it (the reference's signature); ``en``/``zh`` say
    it and how to fix it, as a clause after "Likely cause:". ``matches(got, expected)``,
    when given, recognises it instead of a comparison with ``fn``'s output (``fn`` is then
    one example of the mistake)."""

    key: str
    fn: Callable[..., Any]
    en: str
    zh: str
    matches: Callable[[Any, Any], bool] | None = None

    def text(self, lang: str) -> str:
        return self.en if lang == "en" else self.zh


@dataclass(frozen=True)
class Exercise:
    """One exercise of the catalogue (see :mod:`attnlab.exercises.catalog`)."""

    name: str
    func: str  # the learner's function's name
    params: str  # its parameters, as the def writes them
    title: tuple[str, str]  # (en, zh)
    task: tuple[str, str]
    doc: tuple[str, str]  # the skeleton's docstring after its first line: shapes, returns
    section: tuple[str, str]  # the tutorial's section it practises
    reference: Callable[..., Any]
    cases: Callable[[torch.Generator], list[Case]]
    outputs: tuple[str, ...] = ()  # the names of a returned tuple's parts; () for one value
    mistakes: tuple[Mistake, ...] = ()
    atol: float = 1e-5
    rtol: float = 1e-4
    half_atol: float = 2e-2
    half_rtol: float = 2e-2
    library: str | None = None  # the attnlab function the reference calls, if any

    @property
    def tutorial(self) -> str:
        return self.name.rsplit("-", 1)[0]

    @property
    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    def make_cases(self) -> list[Case]:
        with quiet_rng():
            return self.cases(torch.Generator().manual_seed(self.seed))

    def expected(self, case: Case) -> Any:
        with quiet_rng():
            return self.reference(*copied(upcast(case.args) if case.half else case.args))


# The words of the usual cases, (en, zh).
LABELS: dict[str, tuple[str, str]] = {
    "random": ("random inputs", "随机输入"),
    "random2": ("random inputs of another shape", "另一种形状的随机输入"),
    "heads": ("with a head axis (B, H, L, D)", "带头维度 (B, H, L, D)"),
    "one token": ("one token", "单个词元"),
    "one": ("a single element", "单个元素"),
    "fully masked": ("a query whose keys are all blocked", "某个查询的所有键都被屏蔽"),
    "padding": ("padding", "填充"),
    "float16": ("float16", "float16"),
    "batch 1": ("batch size 1", "批量大小为 1"),
    "empty": ("an empty batch", "空批量"),
    "no padding": ("no padding", "没有填充"),
    "non-square": ("a non-square map", "非正方形的特征图"),
}


@contextlib.contextmanager
def quiet_rng() -> Iterator[None]:
    """The global random state left as it was: a reference that builds a module (whose
    initialisation draws) does not move the learner's random numbers."""
    with torch.random.fork_rng(devices=[]):
        yield


# ----------------------------------------------------------------------------- inputs
def copied(obj: Any) -> Any:
    """``obj`` with every tensor cloned (modules are shared, immutables kept)."""
    if isinstance(obj, Tensor):
        return obj.clone()
    if isinstance(obj, nn.Module):
        return obj
    if isinstance(obj, tuple):
        return tuple(copied(o) for o in obj)
    if isinstance(obj, list):
        return [copied(o) for o in obj]
    if isinstance(obj, dict):
        return {k: copied(v) for k, v in obj.items()}
    return copy.deepcopy(obj)


def upcast(obj: Any) -> Any:
    """``obj`` with its float16 tensors in float32."""
    if isinstance(obj, Tensor):
        return obj.float() if obj.dtype == torch.float16 else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(upcast(o) for o in obj)
    return obj


def _unchanged(before: Any, after: Any) -> bool:
    if isinstance(before, Tensor):
        if not isinstance(after, Tensor) or after.shape != before.shape or after.dtype != before.dtype:
            return False
        if before.is_floating_point():
            return bool(((before == after) | (before.isnan() & after.isnan())).all())
        return torch.equal(before, after)
    if isinstance(before, (list, tuple)):
        return isinstance(after, (list, tuple)) and len(before) == len(after) and \
            all(_unchanged(b, a) for b, a in zip(before, after))
    if isinstance(before, nn.Module):
        return True
    try:
        return bool(before == after)
    except Exception:  # noqa: BLE001 - an object without equality: assume unchanged
        return True


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(map(str, t.shape)) + (",)" if t.dim() == 1 else ")")


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def describe_value(name: str, value: Any, lang: str) -> str:
    """``q (2, 4, 8)``, ``mask (4, 6) bool``, ``p=0.7``: one argument of a case, in words."""
    if isinstance(value, Tensor):
        kind = "" if value.dtype == torch.float32 else f" {_dtype(value.dtype)}"
        if value.dim() == 0:
            return f"{name}={value.item():g}{kind}"
        if value.dim() == 1 and value.numel() <= 8 and not value.is_floating_point():
            return f"{name}={value.tolist()}"
        return f"{name} {_shape(value)}{kind}"
    if isinstance(value, nn.Module):
        return f"{name}={type(value).__name__}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Tensor) for v in value):
        shapes = {_shape(v) for v in value}
        shape = shapes.pop() if len(shapes) == 1 else "…"
        return f"{name}: {len(value)} × {shape}" if lang == "en" else f"{name}：{len(value)} 个 {shape}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"{name}: {len(value)} items" if lang == "en" else f"{name}：{len(value)} 项"
    if isinstance(value, str) and len(value) > 24:
        return f"{name}={value[:21]!r}…"
    return f"{name}={value!r}"


def param_names(ex: Exercise) -> list[str]:
    """The names of the learner's function's parameters: ``["q", "k", "v", "mask"]``."""
    return [p.split("=")[0].strip() for p in ex.params.split(",")] if ex.params else []


def describe_case(ex: Exercise, case: Case, lang: str) -> str:
    """A case in words, with its shapes: ``padding: q (3, 4, 8), ..., mask (3, 1, 6) bool``."""
    parts = [describe_value(n, v, lang) for n, v in zip(param_names(ex), case.args)]
    sep = ": " if lang == "en" else "："
    return case.words(lang) + sep + ", ".join(parts)


# ----------------------------------------------------------------------------- messages
_TEXT: dict[str, tuple[str, str]] = {
    "pass": ("✓ {name}: right on all {n} cases ({labels}).",
             "✓ {name}：全部 {n} 个用例都正确（{labels}）。"),
    "skeleton": ("✗ {name}: your function raised NotImplementedError on the first case ({case}): it is still the "
                 "skeleton. Write your code in place of the line `raise NotImplementedError(...)`, then run the "
                 "check again.",
                 "✗ {name}：你的函数在第一个用例（{case}）上抛出了 NotImplementedError：它还是练习给出的骨架代码。"
                 "把 `raise NotImplementedError(...)` 这一行换成你自己的代码，再运行一次检查。"),
    "raised": ("✗ {name}: your function raised {error} on case {i} of {n} ({case}): {detail}",
               "✗ {name}：你的函数在第 {i} 个用例（共 {n} 个；{case}）上抛出了 {error}：{detail}"),
    "wrong": ("✗ {name}: wrong on case {i} of {n} ({case}): {what}.",
              "✗ {name}：第 {i} 个用例（共 {n} 个；{case}）的结果不对：{what}。"),
    "mutated": ("✗ {name}: your function changed its input {arg} in place on case {i} of {n} ({case}); the caller "
                "still needs it. Work on a copy (x = x.clone()) or use operations that return a new tensor "
                "(masked_fill, not masked_fill_).",
                "✗ {name}：在第 {i} 个用例（共 {n} 个；{case}）上，你的函数原地修改了输入 {arg}，而调用者还要用它。"
                "请在副本上操作（x = x.clone()），或者使用返回新张量的运算（用 masked_fill 而不是 masked_fill_）。"),
    "cause": (" Likely cause: {text}.", "可能的原因：{text}。"),
    "whole": ("the output", "输出"),
    "part": ("returned value {i} ({part})", "第 {i} 个返回值（{part}）"),
    "none": ("{where} is None (did you forget `return`?)", "{where}是 None（是不是忘了写 return？）"),
    "numpy": ("{where} is a numpy array; return a torch tensor (torch.from_numpy(...))",
              "{where}是 numpy 数组；请返回 torch 张量（torch.from_numpy(...)）"),
    "not tensor": ("{where} is a {kind}; return a torch tensor",
                   "{where}是 {kind}；请返回 torch 张量"),
    "tuple for tensor": ("{where} is a {kind} of {m}; one tensor is expected",
                         "{where}是含 {m} 个元素的 {kind}；这里应返回一个张量"),
    "tensor for tuple": ("your function returned {kind}; a tuple of {n} is expected ({parts})",
                         "你的函数返回了 {kind}；应返回含 {n} 个元素的元组（{parts}）"),
    "tuple length": ("your function returned a {kind} of {m}; a tuple of {n} is expected ({parts})",
                     "你的函数返回了含 {m} 个元素的 {kind}；应返回含 {n} 个元素的元组（{parts}）"),
    "one tensor": ("one tensor", "一个张量"),
    "shape": ("{where} has the wrong shape: expected {expected}, got {got}",
              "{where}的形状不对：应为 {expected}，实际为 {got}"),
    "half dtype": ("{where} has dtype {got} for float16 inputs: keep the inputs' dtype (compute in float32 if you "
                   "like, then convert back with .to(x.dtype))",
                   "输入是 float16，{where}的 dtype 却是 {got}：请保持输入的 dtype（可以用 float32 计算，最后再用 "
                   ".to(x.dtype) 转回去）"),
    "dtype": ("{where} has dtype {got}, expected {expected}",
              "{where}的 dtype 是 {got}，应为 {expected}"),
    "nan": ("{where} has NaN at {count}, the first at {index}, where the reference has {value}",
            "{where}在 {count} 处出现 NaN（第一处在 {index}），而参考答案那里是 {value}"),
    "inf": ("{where} has {got} at {count}, the first at {index}, where the reference has {value}",
            "{where}在 {count} 处为 {got}（第一处在 {index}），而参考答案那里是 {value}"),
    "values": ("{where} differs from the reference at {count} of {total} places; the largest difference is at "
               "{index}: expected {expected}, got {got}",
               "{where}与参考答案有 {count}/{total} 处不同；差得最多的在 {index}：应为 {expected}，实际为 {got}"),
    "exact": ("{where} differs from the reference at {count} of {total} places, the first at {index}: "
              "expected {expected}, got {got}",
              "{where}与参考答案有 {count}/{total} 处不同，第一处在 {index}：应为 {expected}，实际为 {got}"),
    "scalar": ("{where}: expected {expected}, got {got}", "{where}：应为 {expected}，实际为 {got}"),
    "places1": ("1 place", "1"), "places": ("{k} places", "{k}"),
    "list length": ("{where} has {got} items, expected {expected}", "{where}有 {got} 项，应为 {expected} 项"),
    "item": ("{where}, item {i}", "{where}的第 {i} 项"),
    "py number": ("Python {kind}", "Python 的 {kind}"),
}


def _t(lang: str, key: str, **kw: Any) -> str:
    return _TEXT[key][LANGUAGES.index(lang)].format(**kw)


def _kind(value: Any) -> str:
    return type(value).__name__


def _index(flat: int, shape: torch.Size) -> str:
    if len(shape) == 0:
        return "[]"
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return "[" + ", ".join(map(str, reversed(idx))) + "]"


def _num(v: float) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4g}"


def _count(lang: str, k: int) -> str:
    return _t(lang, "places1") if k == 1 else _t(lang, "places", k=k)


def compare(got: Any, expected: Any, *, half: bool, atol: float, rtol: float, lang: str, where: str) -> str | None:
    """``None`` when ``got`` is ``expected`` (within the tolerance), else what differs first."""
    if isinstance(expected, Tensor):
        return _compare_tensor(got, expected, half=half, atol=atol, rtol=rtol, lang=lang, where=where)
    if got is None and expected is not None:
        return _t(lang, "none", where=where)
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return _t(lang, "scalar", where=where, expected=_short(expected), got=_short(got))
        if len(got) != len(expected):
            return _t(lang, "list length", where=where, got=len(got), expected=len(expected))
        for i, (g, e) in enumerate(zip(got, expected)):
            problem = compare(g, e, half=half, atol=atol, rtol=rtol, lang=lang,
                              where=_t(lang, "item", where=where, i=i))
            if problem:
                return problem
        return None
    if isinstance(expected, float):
        if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return _t(lang, "scalar", where=where, expected=_num(expected), got=_short(got))
        return None
    if got != expected or type(got) is not type(expected):
        return _t(lang, "scalar", where=where, expected=_short(expected), got=_short(got))
    return None


def _short(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"tensor {_shape(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


def _compare_tensor(got: Any, expected: Tensor, *, half: bool, atol: float, rtol: float, lang: str,
                    where: str) -> str | None:
    if got is None:
        return _t(lang, "none", where=where)
    if not isinstance(got, Tensor):
        if type(got).__module__ == "numpy":
            return _t(lang, "numpy", where=where)
        if isinstance(got, (tuple, list)):
            return _t(lang, "tuple for tensor", where=where, kind=_kind(got), m=len(got))
        kind = _t(lang, "py number", kind=_kind(got)) if isinstance(got, (int, float, bool)) else _kind(got)
        return _t(lang, "not tensor", where=where, kind=kind)
    if got.shape != expected.shape:
        return _t(lang, "shape", where=where, expected=_shape(expected), got=_shape(got))
    want = torch.float16 if half and expected.is_floating_point() else expected.dtype
    if got.dtype != want:
        if half and expected.is_floating_point():
            return _t(lang, "half dtype", where=where, got=_dtype(got.dtype))
        return _t(lang, "dtype", where=where, got=_dtype(got.dtype), expected=_dtype(want))
    got = got.detach().cpu()
    expected = expected.detach().cpu()
    if got.numel() == 0:
        return None
    if not expected.is_floating_point():
        wrong = got != expected
        if not bool(wrong.any()):
            return None
        first = int(wrong.flatten().nonzero()[0])
        return _t(lang, "exact", where=where, count=int(wrong.sum()), total=got.numel(), index=_index(first, got.shape),
                  expected=_num(expected.flatten()[first].item()), got=_num(got.flatten()[first].item()))
    g, e = got.double(), expected.double()
    nan = g.isnan() & ~e.isnan()
    if bool(nan.any()):
        first = int(nan.flatten().nonzero()[0])
        return _t(lang, "nan", where=where, count=_count(lang, int(nan.sum())), index=_index(first, g.shape),
                  value=_num(e.flatten()[first].item()))
    inf = g.isinf() & ~(e.isinf() & (g == e))
    if bool(inf.any()):
        first = int(inf.flatten().nonzero()[0])
        return _t(lang, "inf", where=where, count=_count(lang, int(inf.sum())), index=_index(first, g.shape),
                  got=_num(g.flatten()[first].item()), value=_num(e.flatten()[first].item()))
    close = torch.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return None
    if g.numel() == 1:
        return _t(lang, "scalar", where=where, expected=_num(e.item()), got=_num(g.item()))
    diff = (g - e).abs().nan_to_num(nan=math.inf).masked_fill(close, -1.0)
    worst = int(diff.flatten().argmax())
    return _t(lang, "values", where=where, count=int((~close).sum()), total=g.numel(), index=_index(worst, g.shape),
              expected=_num(e.flatten()[worst].item()), got=_num(g.flatten()[worst].item()))


def compare_answer(ex: Exercise, got: Any, expected: Any, case: Case, lang: str) -> tuple[str | None, bool]:
    """What is wrong with ``got`` (``None``: right) and whether a mistake may explain it
    (values and shapes, not types)."""
    atol, rtol = (ex.half_atol, ex.half_rtol) if case.half else (ex.atol, ex.rtol)
    if ex.outputs:
        parts = ", ".join(ex.outputs)
        if got is None:
            return _t(lang, "none", where=_t(lang, "whole")), False
        if not isinstance(got, (tuple, list)):
            kind = _t(lang, "one tensor") if isinstance(got, Tensor) else _kind(got)
            return _t(lang, "tensor for tuple", kind=kind, n=len(ex.outputs), parts=parts), False
        if len(got) != len(ex.outputs):
            return _t(lang, "tuple length", kind=_kind(got), m=len(got), n=len(ex.outputs), parts=parts), False
        for i, (g, e, part) in enumerate(zip(got, expected, ex.outputs), start=1):
            problem = compare(g, e, half=case.half, atol=atol, rtol=rtol, lang=lang,
                              where=_t(lang, "part", i=i, part=part))
            if problem:
                return problem, _explainable(g, e, case)
        return None, False
    problem = compare(got, expected, half=case.half, atol=atol, rtol=rtol, lang=lang, where=_t(lang, "whole"))
    return problem, problem is not None and _explainable(got, expected, case)


def _explainable(got: Any, expected: Any, case: Case) -> bool:
    """Whether a typical mistake may explain a wrong answer: wrong values and shapes may be
    one; a wrong type or dtype is told on its own."""
    if not isinstance(expected, Tensor):
        return True
    if not isinstance(got, Tensor):
        return False
    want = torch.float16 if case.half and expected.is_floating_point() else expected.dtype
    return got.shape != expected.shape or got.dtype == want


def _same(got: Any, out: Any, atol: float, rtol: float, nan_as_zero: bool) -> bool:
    """Whether a learner's answer equals a wrong variant's output."""
    if isinstance(out, Tensor):
        if not isinstance(got, Tensor) or got.shape != out.shape:
            return False
        if not out.is_floating_point():
            return got.dtype == out.dtype and bool(torch.equal(got.cpu(), out.cpu()))
        g, o = got.detach().double().cpu(), out.detach().double().cpu()
        if nan_as_zero:
            g, o = (t.masked_fill(t.isnan(), 0.0) for t in (g, o))
        return bool(torch.isclose(g, o, rtol=rtol, atol=atol, equal_nan=True).all())
    if isinstance(out, (tuple, list)):
        return isinstance(got, (tuple, list)) and len(got) == len(out) and \
            all(_same(g, o, atol, rtol, nan_as_zero) for g, o in zip(got, out))
    if isinstance(out, float):
        return isinstance(got, (int, float)) and math.isclose(got, out, rel_tol=rtol, abs_tol=atol)
    try:
        return bool(got == out)
    except Exception:  # noqa: BLE001
        return False


def diagnose(ex: Exercise, case: Case, got: Any, expected: Any) -> Mistake | None:
    """The first typical mistake of ``ex`` whose output on ``case`` equals ``got``: first
    exactly, then with NaN read as 0 (a mistake that also leaves a NaN elsewhere)."""
    atol, rtol = (ex.half_atol, ex.half_rtol) if case.half else (ex.atol, ex.rtol)
    outputs: list[tuple[Mistake, Any]] = []
    for mistake in ex.mistakes:
        if mistake.matches is not None:
            try:
                if mistake.matches(got, expected):
                    return mistake
            except Exception:  # noqa: BLE001 - a recogniser that does not apply
                pass
            continue
        try:
            with quiet_rng():
                out = mistake.fn(*copied(upcast(case.args) if case.half else case.args))
        except Exception:  # noqa: BLE001 - a variant that fails on these inputs explains nothing
            continue
        if _same(got, out, atol, rtol, nan_as_zero=False):
            return mistake
        outputs.append((mistake, out))
    for mistake, out in outputs:
        if _same(got, out, atol, rtol, nan_as_zero=True):
            return mistake
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "…"


def run_check(ex: Exercise, fn: Callable[..., Any], lang: str) -> Verdict:
    """Runs ``fn`` on every case of ``ex`` (see the module docstring)."""
    cases = ex.make_cases()
    n = len(cases)
    for i, case in enumerate(cases, start=1):
        words = describe_case(ex, case, lang)
        expected = ex.expected(case)
        given = copied(case.args)
        try:
            with warnings.catch_warnings():  # torch's var() warns on the empty batch we made up, not on a mistake
                warnings.filterwarnings("ignore", message=r"var\(\): degrees of freedom", category=UserWarning)
                got = fn(*given)
        except NotImplementedError as exc:
            key = "skeleton" if i == 1 else "raised"
            message = _t(lang, key, name=ex.name, case=words, i=i, n=n, error="NotImplementedError",
                         detail=_first_line(exc))
            return Verdict(ex.name, False, message, words)
        except Exception as exc:  # noqa: BLE001 - the learner's error, told in one sentence
            message = _t(lang, "raised", name=ex.name, case=words, i=i, n=n, error=type(exc).__name__,
                         detail=_first_line(exc))
            return Verdict(ex.name, False, message, words)
        for arg, before, after in zip(param_names(ex), case.args, given):
            if not _unchanged(before, after):
                return Verdict(ex.name, False, _t(lang, "mutated", name=ex.name, case=words, i=i, n=n, arg=arg), words)
        problem, explainable = compare_answer(ex, got, expected, case, lang)
        if problem is None:
            continue
        message = _t(lang, "wrong", name=ex.name, case=words, i=i, n=n, what=problem)
        if explainable:
            mistake = diagnose(ex, case, got, expected)
            if mistake is not None:
                message += _t(lang, "cause", text=mistake.text(lang))
        return Verdict(ex.name, False, message, words)
    labels = _labels(cases, lang)
    return Verdict(ex.name, True, _t(lang, "pass", name=ex.name, n=n, labels=labels))


def _labels(cases: Sequence[Case], lang: str) -> str:
    seen: list[str] = []
    for case in cases:
        word = case.words(lang)
        if word not in seen:
            seen.append(word)
    return ("; " if lang == "en" else "；").join(seen)
