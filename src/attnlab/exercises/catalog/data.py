"""Exercises of the tutorial *Training on your own data* (docs/en/tutorials/own-data.md)."""

from __future__ import annotations

import torch

from .. import solutions as S
from ._common import Case, Exercise, Mistake, t

# ----------------------------------------------------------------------------- data-1


def _class_index(paths, *, key=None, first_seen=False):
    folders = [p.split("/")[-2] for p in paths]
    classes = list(dict.fromkeys(folders)) if first_seen else sorted(set(folders), key=key)
    return classes, torch.tensor([classes.index(f) for f in folders], dtype=torch.long)


def _shuffle(g, items):
    return [items[i] for i in torch.randperm(len(items), generator=g).tolist()]


def _class_cases(g):
    digits = [f"my_images/{name}/{k:03d}.png" for name in ("zero", "one", "two", "three") for k in range(3)]
    pets = ["data/cat/1.jpg", "data/dog/2.jpg", "data/bird/3.jpg", "data/cat/4.jpg", "data/ant/5.jpg"]
    mixed = ["photos/Zebra/a.png", "photos/apple/b.png", "photos/Zebra/c.png", "photos/banana/d.png"]
    return [
        Case(t("the tutorial's digit folders, shuffled", "教程里的数字文件夹（打乱顺序）"), (_shuffle(g, digits),)),
        Case(t("folders in an order that is not sorted", "文件夹的出现顺序不是排好序的"), (pets,)),
        Case(t("one class", "只有一个类别"), (["flowers/rose/1.png", "flowers/rose/2.png"],)),
        Case(t("uppercase and lowercase names", "大小写混合的名字"), (mixed,)),
        Case(t("no files", "没有文件"), ([],)),
    ]


CLASS_INDEX = Exercise(
    name="data-1", func="class_index", params="paths",
    title=t("Classes from an image folder", "从图片文件夹得到类别"),
    task=t("Given the paths of an image folder's files, root/<class>/<file>, return the class names, the folder "
           "names in sorted order (as the image-folder recipe sorts them), and each file's class index.",
           "给定图片文件夹中各文件的路径 root/<类别>/<文件>，返回类别名（文件夹名按排序后的顺序，与 image-folder "
           "配方的做法相同）以及每个文件的类别编号。"),
    doc=t("The classes of an image folder and each file's label.\n\n"
          "paths: a list of str, \"root/<class>/<file>\" written with \"/\"\n"
          "returns: classes, the distinct folder names sorted (sorted(), as Python\n"
          "sorts str), and labels (N,) int64, each file's index into classes",
          "图片文件夹的类别以及每个文件的标签。\n\n"
          "paths：str 列表，形如 \"root/<类别>/<文件>\"，用 \"/\" 分隔\n"
          "返回：classes，即去重后排好序的文件夹名（用 Python 对 str 的 sorted()），\n"
          "以及 labels (N,) int64，即每个文件在 classes 中的下标"),
    section=t("sections 2 and 3, “An image folder of your own” and “Train from the command line”",
              "第 2 节“做一个自己的图片文件夹”和第 3 节“在命令行上训练”"),
    reference=S.class_index, cases=_class_cases, outputs=("classes", "labels"),
    mistakes=(
        Mistake("first seen", lambda paths: _class_index(paths, first_seen=True),
                "the classes were numbered in the order the folders first appear; the recipe sorts the folder names, "
                "so class 0 is the first name in sorted order",
                "类别是按文件夹第一次出现的顺序编号的；配方会对文件夹名排序，所以第 0 类是排序后的第一个名字"),
        Mistake("case-insensitive", lambda paths: _class_index(paths, key=str.lower),
                "the names were sorted ignoring case; sort them as Python's sorted() does (uppercase before "
                "lowercase), as the recipe does",
                "排序时忽略了大小写；应像 Python 的 sorted() 那样排序（大写字母排在小写字母前面），与配方一致"),
    ),
)

# ----------------------------------------------------------------------------- data-2


def _encode(text, *, first_seen=False, as_bytes=False):
    units = list(text.encode("utf-8")) if as_bytes else list(text)
    chars = list(dict.fromkeys(units)) if first_seen else sorted(set(units))
    index = {c: i for i, c in enumerate(chars)}
    return chars, torch.tensor([index[c] for c in units], dtype=torch.long)


ENCODE_CHARS = Exercise(
    name="data-2", func="encode_chars", params="text",
    title=t("A character vocabulary", "字符词表"),
    task=t("Build the vocabulary of a character model, the distinct characters of a text in sorted order (as "
           "attnlab's char tokenizer keeps them), and encode the text as their indices; decoding "
           "\"\".join(chars[i] for i in ids) gives the text back.",
           "构造字符级模型的词表：文本中去重后的字符按排序后的顺序排列（与 attnlab 的字符分词器一致），"
           "再把文本编码成这些字符的下标；用 \"\".join(chars[i] for i in ids) 解码就能得回原文。"),
    doc=t("A character vocabulary and the text encoded with it.\n\n"
          "text: str\n"
          "returns: chars, a list of the distinct characters of text, sorted, and\n"
          "ids (len(text),) int64 with chars[ids[n]] == text[n]",
          "字符词表，以及用它编码后的文本。\n\n"
          "text: str\n"
          "返回：chars，文本中去重后排好序的字符列表；\n"
          "ids (len(text),) int64，满足 chars[ids[n]] == text[n]"),
    section=t("section 4, “Train from Python” (a text becomes token ids; the character model of the Language models "
              "tutorial uses this vocabulary)",
              "第 4 节“在 Python 里训练”（文本变成词元 id；《语言模型》教程中的字符级模型用的就是这种词表）"),
    reference=S.encode_chars, outputs=("chars", "ids"),
    cases=lambda g: [
        Case(t("a short text", "一段短文本"), ("hello world",)),
        Case(t("a line of Tiny Shakespeare", "Tiny Shakespeare 中的一行"),
             ("First Citizen:\nBefore we proceed any further, hear me speak.",)),
        Case(t("Chinese text", "中文文本"), ("注意力就是你所需要的。注意力！",)),
        Case(t("one character", "单个字符"), ("a",)),
        Case(t("an empty text", "空文本"), ("",)),
    ],
    mistakes=(
        Mistake("first seen", lambda text: _encode(text, first_seen=True),
                "the characters were numbered in the order they first appear; sort them (sorted(set(text))), as the "
                "char tokenizer does, so that the same characters always get the same ids",
                "字符是按第一次出现的顺序编号的；应该排序（sorted(set(text))），与字符分词器一致，这样同样的字符集合总是"
                "得到同样的 id"),
        Mistake("bytes", lambda text: _encode(text, as_bytes=True),
                "the UTF-8 bytes were counted, not the characters: a Chinese character is three bytes; iterate over "
                "the str itself",
                "统计的是 UTF-8 字节而不是字符：一个汉字占三个字节；应直接遍历 str 本身"),
    ),
)

# ----------------------------------------------------------------------------- data-3


def _windows(tokens, context, *, shift=1, stride=None, drop_last=False, pad_label=-100):
    n_tokens, n = len(tokens), context
    stride = stride or n
    count = (n_tokens - 1) // stride if drop_last else -(-(n_tokens - 1) // stride)
    x = torch.zeros(count, n, dtype=torch.long)
    y = torch.full((count, n), pad_label, dtype=torch.long)
    for i in range(count):
        inputs = tokens[i * stride : i * stride + n]
        labels = tokens[i * stride + shift : i * stride + shift + n]
        x[i, : len(inputs)] = inputs
        y[i, : len(labels)] = labels
    return x, y


def _stream(g, n, vocab=20):
    return torch.randint(1, vocab, (n,), generator=g)


WINDOWS = Exercise(
    name="data-3", func="lm_windows", params="tokens, context",
    title=t("Training windows of a token stream", "把词元流切成训练窗口"),
    task=t("Cut a stream of T token ids into the training windows of a language model, as attnlab's LMDataset does: "
           "window i holds tokens i·L ... i·L + L (L + 1 of them), its first L the inputs x and its last L the "
           "labels y, the inputs shifted by one. A short last window is padded: inputs with 0, labels with -100.",
           "像 attnlab 的 LMDataset 那样，把长度为 T 的词元 id 流切成语言模型的训练窗口：第 i 个窗口包含词元 "
           "i·L ... i·L + L（共 L + 1 个），前 L 个是输入 x，后 L 个是标签 y，即输入右移一位。最后一个窗口不够长时"
           "要填充：输入填 0，标签填 -100。"),
    doc=t("Language-model windows: inputs and labels shifted by one.\n\n"
          "tokens: (T,) int64, T >= 2; context: int L\n"
          "returns: x, y, each (ceil((T - 1) / L), L) int64; x[i] = tokens[i*L : i*L + L],\n"
          "y[i] = tokens[i*L + 1 : i*L + L + 1]; a short last window padded (x with 0,\n"
          "y with -100)",
          "语言模型的训练窗口：输入和标签错开一位。\n\n"
          "tokens: (T,) int64，T >= 2；context: int L\n"
          "返回：x, y，形状都是 (ceil((T - 1) / L), L) int64；x[i] = tokens[i*L : i*L + L]，\n"
          "y[i] = tokens[i*L + 1 : i*L + L + 1]；最后一个窗口不够长时填充（x 填 0，y 填 -100）"),
    section=t("section 4, “Train from Python” (texts become training examples; the windows are those of the "
              "lm-text recipe)",
              "第 4 节“在 Python 里训练”（文本变成训练样本；窗口与 lm-text 配方中的相同）"),
    reference=S.lm_windows, outputs=("x", "y"),
    cases=lambda g: [
        Case(t("11 tokens, context 4: a short last window", "11 个词元，context 4：最后一个窗口较短"), (_stream(g, 11), 4)),
        Case(t("10 tokens, context 3: no short window", "10 个词元，context 3：没有较短的窗口"), (_stream(g, 10), 3)),
        Case(t("2 tokens, context 5", "2 个词元，context 5"), (_stream(g, 2), 5)),
        Case(t("context 1", "context 1"), (_stream(g, 5), 1)),
        Case(t("a longer stream", "更长的词元流"), (_stream(g, 40), 8)),
    ],
    mistakes=(
        Mistake("not shifted", lambda tok, n: _windows(tok, n, shift=0),
                "the labels were the inputs themselves; each label is the next token, y[i] = tokens[i*L + 1 : "
                "i*L + L + 1]",
                "标签就是输入本身；每个标签应是下一个词元：y[i] = tokens[i*L + 1 : i*L + L + 1]"),
        Mistake("stride", lambda tok, n: _windows(tok, n, stride=n + 1),
                "the windows started every L + 1 tokens; they start every L tokens and overlap by one, so every "
                "token but the first is a label exactly once",
                "窗口每隔 L + 1 个词元开始一个；应每隔 L 个词元开始一个，相邻窗口重叠一个词元，这样除第一个词元外，"
                "每个词元恰好当一次标签"),
        Mistake("dropped", lambda tok, n: _windows(tok, n, drop_last=True),
                "the short last window was dropped; keep it, padded (ceil((T - 1) / L) windows)",
                "丢掉了最后一个较短的窗口；应保留它并填充（共 ceil((T - 1) / L) 个窗口）"),
        Mistake("pad label", lambda tok, n: _windows(tok, n, pad_label=0),
                "the padded labels were 0, a real token; pad the labels with -100, which the loss ignores",
                "填充位置的标签用了 0，而 0 是一个真实的词元；标签应填 -100，损失函数会忽略它"),
    ),
)

# ----------------------------------------------------------------------------- data-4


def _split(labels, fraction, seed, *, stratified=True, one_generator=True):
    if not stratified:
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
        n_val = int(fraction * len(labels))
        return order[n_val:].sort().values, order[:n_val].sort().values
    g = torch.Generator().manual_seed(seed)
    train, val = [], []
    for c in labels.unique().tolist():
        if not one_generator:
            g = torch.Generator().manual_seed(seed)
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n_val = int(fraction * len(idx))
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return torch.cat(train).sort().values, torch.cat(val).sort().values


def _unsorted(got, expected):
    """The right indices, in another order."""
    if not isinstance(got, (tuple, list)) or len(got) != len(expected):
        return False
    pairs = list(zip(got, expected))
    if not all(isinstance(a, torch.Tensor) and a.shape == e.shape and a.dtype == e.dtype for a, e in pairs):
        return False
    return all(torch.equal(a.sort().values, e) for a, e in pairs) and not all(torch.equal(a, e) for a, e in pairs)


def _split_unsorted(labels, fraction, seed):
    g = torch.Generator().manual_seed(seed)
    train, val = [], []
    for c in labels.unique().tolist():
        idx = (labels == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n_val = int(fraction * len(idx))
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return torch.cat(train), torch.cat(val)


def _labels(g, counts, values=None):
    values = values or list(range(len(counts)))
    labels = torch.cat([torch.full((n,), v) for v, n in zip(values, counts)])
    return labels[torch.randperm(len(labels), generator=g)]


SPLIT = Exercise(
    name="data-4", func="split_by_class", params="labels, val_fraction, seed",
    title=t("A stratified split with a seed", "带随机种子的分层划分"),
    task=t("Hold out a validation part stratified by class, reproducibly: with one torch.Generator seeded once, go "
           "through the classes in increasing order, shuffle each class's indices with torch.randperm and hold out "
           "the first int(val_fraction · n_c) of them. Return both parts' indices, sorted.",
           "按类别分层、可复现地划出验证集：只用一个设好种子的 torch.Generator，按类别从小到大依次处理，用 "
           "torch.randperm 打乱每个类别的下标，取前 int(val_fraction · n_c) 个作为验证集。返回两部分的下标（排好序）。"),
    doc=t("A stratified train/validation split.\n\n"
          "labels: (N,) int64; val_fraction: float; seed: int\n"
          "g = torch.Generator().manual_seed(seed), once; for each class c in increasing\n"
          "order: its indices, permuted by torch.randperm(n_c, generator=g); the first\n"
          "int(val_fraction * n_c) go to validation, the rest to training\n"
          "returns: train, val: sorted int64 index tensors",
          "按类别分层的训练/验证划分。\n\n"
          "labels: (N,) int64；val_fraction: float；seed: int\n"
          "g = torch.Generator().manual_seed(seed)，只设一次；按类别 c 从小到大：\n"
          "把它的下标用 torch.randperm(n_c, generator=g) 打乱，前 int(val_fraction * n_c)\n"
          "个放进验证集，其余放进训练集\n"
          "返回：train, val：排好序的 int64 下标张量"),
    section=t("section 1, “Recipes for your own files” (held out for validation and test, stratified by class)",
              "第 1 节“读取自己文件的配方”（按类别分层地划出验证集和测试集）"),
    reference=S.split_by_class, outputs=("train", "val"),
    cases=lambda g: [
        Case(t("3 classes of 8, a quarter held out", "3 个类别各 8 个，划出四分之一"), (_labels(g, [8, 8, 8]), 0.25, 0)),
        Case(t("classes of different sizes", "各类别大小不同"), (_labels(g, [12, 4, 7]), 0.5, 1)),
        Case(t("one class", "只有一个类别"), (_labels(g, [10]), 0.25, 2)),
        Case(t("another seed", "换一个种子"), (_labels(g, [8, 8, 8]), 0.25, 7)),
        Case(t("labels 2, 5 and 9", "标签为 2、5、9"), (_labels(g, [6, 5, 9], [2, 5, 9]), 0.5, 3)),
    ],
    mistakes=(
        Mistake("not stratified", lambda lab, f, s: _split(lab, f, s, stratified=False),
                "the split was not stratified: one permutation of all the examples; draw the held-out examples "
                "within each class",
                "划分没有分层：对全部样本只做了一次打乱；应在每个类别内部抽取验证样本"),
        Mistake("generator per class", lambda lab, f, s: _split(lab, f, s, one_generator=False),
                "a new generator was seeded for every class; seed one generator once and draw every class's "
                "permutation from it, in increasing class order",
                "每个类别都重新设了一次种子；应只设一次种子，按类别从小到大依次用同一个生成器抽取排列"),
        Mistake("unsorted", _split_unsorted,
                "the indices are right but not sorted: return torch.cat(...).sort().values",
                "下标是对的，但没有排序：应返回 torch.cat(...).sort().values",
                matches=_unsorted),
    ),
)

EXERCISES = [CLASS_INDEX, ENCODE_CHARS, WINDOWS, SPLIT]
