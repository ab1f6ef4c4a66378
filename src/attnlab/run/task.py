"""The :class:`Task` protocol that every task fills in, what it hands the training skeleton
(:class:`Prepared`, :class:`Preprocessing`), the registry of tasks (:func:`register_task`,
:func:`get_task`, :func:`list_tasks`), and a recipe read as its task's
(:func:`recipe_from_dict`).

A task (image classification, text classification, translation, the reversal demo, or one of
the user's own) is one class behind one protocol. ``cli``, ``viz`` and ``report`` call the
protocol and never name a task. A task of one's own subclasses :class:`Task`, gives its
:class:`~attnlab.run.recipe.Recipe` subclass and registers with :func:`register_task`; a recipe
then names it in ``task:`` (see the README for ``attnlab train --import``).
"""

from __future__ import annotations

import copy
import importlib
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Sequence, TypeVar, get_type_hints
import torch
from torch import nn
from ..data.kinds.labelled_images import ImageSpec
from ..data.source import source_of
from ..data.tokenizers.text import TextTokenizer
from ..engine.config import ConfigError, from_dict
from ..engine import distributed
from ..engine.sharding import shard_blocks
from ..errors import AttentionUnavailable, InputError, shape_str
from ..io import atomic_write_bytes
from ..memory import require_memory
from ..models import create_model
from ..layers.lora import apply_lora
from ..formats.hf.load import is_pretrained
from ..models.registry import OptionError, upgrade_options
from ..suggest import did_you_mean
from .recipe import Recipe, pretrained_model
from .trained import TrainedRun

__all__ = ["Task", "Prepared", "Preprocessing", "ImageSpec", "register_task", "get_task", "list_tasks", "recipe_from_dict", "check_texts", "check_text", "training_bytes"]


@dataclass
class Prepared:
    """What a task's :meth:`Task.prepare` hands the training skeleton: the data sets as the
    trainer reads them (``val`` ``None``: no validation), ``info`` for the model's options
    (:meth:`Task.model_options`), a classifier's ``classes`` (they decide whether a source
    run's head fits, and go to ``results.json``), and ``facts`` for ``results.json``
    (sizes, vocabularies). The skeleton fills in ``tested``, the engine's test figures
    (``test_loss``, ``test_accuracy``, ...) of the tested weights, before :meth:`Task.score`,
    which can build on them instead of evaluating the test set again."""

    train: Any
    val: Any
    test: Any
    info: Any = None
    classes: list[str] | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    tested: dict[str, Any] | None = None


@dataclass
class Preprocessing:
    """What a finished run reads back beside its weights (:meth:`Task.preprocessing`):
    ``info`` for the model's options, and what :class:`TrainedRun` carries."""

    info: Any = None
    classes: list[str] | None = None
    tokenizer: TextTokenizer | None = None
    target_tokenizer: TextTokenizer | None = None
    image: ImageSpec | None = None


class Task:
    """One kind of learning problem, behind the protocol that the command line, the
    pictures and the report call.

    Training is one skeleton, :func:`attnlab.run.skeleton.train`, whose steps a task fills
    in: :meth:`read_data` (before the run directory is made), :meth:`prepare` (inside it:
    the preprocessing fitted or, on resume, read back, and the data sets), then the engine
    fits and tests, :meth:`score` adds what the task measures beyond loss and accuracy,
    and ``results.json`` is written. :meth:`folds` splits a run into complete sub-runs
    (cross-validation) and :meth:`combine` merges their results.

    A task whose recipe's ``data`` section is a kind of source's (a
    :class:`~attnlab.data.source.SourceConfig` subclass with a ``kind``) gets its data
    from the source registry (:mod:`attnlab.data.source`) and never names a source.
    Subclasses set the class attributes and implement :meth:`model_options`,
    :meth:`prepare`, :meth:`preprocessing` and :meth:`evaluate`; the rest have defaults."""

    name: ClassVar[str]  # the recipe's `task:` value
    recipe_class: ClassVar[type[Recipe]]
    summary: ClassVar[str] = ""  # one line for `attnlab recipes`
    inputs: ClassVar[str | None] = None  # what predict takes: "images" (files) or "texts"; None: no predict
    outputs: ClassVar[str] = "labels"  # "labels" (a class and its probability) or "text" (generated)
    sample_unit: ClassVar[str] = "samples"  # what throughput counts, e.g. "images"
    # Keys whose change on --resume leaves the run meaningless to continue (prefixes of dotted keys);
    # the data source adds its own (SourceConfig.fixed_keys).
    fixed_on_resume: ClassVar[tuple[str, ...]] = ("task", "model", "train.optimizer")
    # Keys of an older attnlab's config.yaml that this task does not have (dotted): dropped on reading.
    legacy_keys: ClassVar[tuple[str, ...]] = ()
    # Keys (dotted) whose values a Hugging Face folder decides when model.checkpoint names one: a recipe
    # file's values yield to the folder's (attnlab.recipes.load_recipe), and overrides of them are refused
    # (model.name and model.options: checked against the folder's by pretrained_model and check).
    folder_keys: ClassVar[tuple[str, ...]] = ()
    # What a key does in this task where it differs from the help its section's comment gives for every
    # task (`attnlab recipes NAME --keys`): a language model has no classifier head to train alone.
    key_help: ClassVar[dict[str, str]] = {}

    # ------------------------------------------------------------------ recipe
    def model_options(self, recipe: Recipe, info: Any = None) -> dict[str, Any]:
        """The options the task gives the model from its data (``vocab_size``,
        ``num_classes``, ...), before ``model.options``. ``info`` is what the task learned
        from the data (a tokenizer, the classes); ``None`` asks for placeholder values
        that only serve to check the recipe."""
        return {}

    def upgrade(self, data: dict[str, Any]) -> dict[str, Any]:
        """The config of a run trained by an older attnlab, in today's form: the keys of
        :attr:`legacy_keys` (such as the sections of other tasks that every run used to
        carry) are dropped. Returns a new dict."""
        data = copy.deepcopy(data)
        model = data.get("model")
        if isinstance(model, dict) and isinstance(model.get("options"), dict) and isinstance(model.get("name"), str):
            model["options"] = upgrade_options(model["name"], model["options"])  # today's option names
        section = get_type_hints(self.recipe_class).get("data")
        if isinstance(data.get("data"), dict) and hasattr(section, "drop_foreign_keys"):
            data["data"] = section.drop_foreign_keys(data["data"])  # older runs carried every source's keys
        for key in self.legacy_keys:
            *path, last = key.split(".")
            node: Any = data
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(last, None)
        return data

    def build_model(self, recipe: Recipe, info: Any = None) -> nn.Module:
        """The recipe's model: ``model.name`` with the task's options and ``model.options``,
        with the adapters of ``model.lora`` (:func:`~attnlab.layers.lora.apply_lora`)."""
        model = create_model(recipe.model.name, **{**self.model_options(recipe, info), **recipe.model.options})
        if recipe.model.lora is not None:
            try:
                apply_lora(model, **dataclasses.asdict(recipe.model.lora))
            except InputError as exc:  # a rank is named by its key, model.lora.rank, as the others by theirs
                text = str(exc)
                raise InputError(f"model.lora.{text}" if text.startswith("rank ") else f"model.lora: {text}") from None
        return model

    def calibration_inputs(self, train_set: Any, count: int) -> list[Any]:
        """``count`` inputs of the training set that the model reads as it is (``model(x)``),
        for what weighs the model's activations (``model.convert_attention``'s factorisation);
        a task whose models take no such input refuses."""
        raise InputError(f"task {self.name} gives no inputs to weigh a model's activations by")

    def check_folder(self, folder: Path) -> None:
        """Refuse the Hugging Face folder ``folder`` (``model.checkpoint``) when this task
        cannot start from its kind of model, before it is read (:func:`pretrained_model`); by
        default any folder that :func:`~attnlab.formats.from_hf` reads is taken."""

    def check(self, recipe: Recipe) -> nn.Module | None:
        """Checks that the dataclasses cannot make: ``model.options`` against the model's
        configuration, by building it on the meta device (no memory, no weights). Returns that
        model (``None`` when the recipe names none yet), for a task's own checks to read
        without building it again."""
        model = self.check_model(recipe)
        if recipe.train.distributed == "fsdp":
            if not distributed.launched():
                raise ConfigError("train.distributed=fsdp shards the model over the processes torchrun starts; "
                                  "launch with torchrun --nproc_per_node N -m attnlab train ... (or leave "
                                  "train.distributed at auto)")
            if model is not None:
                shard_blocks(model)
        if recipe.data.kind and source_of(recipe.data).test_only:
            raise ConfigError(f"data.name={recipe.data.name} is a test set alone, with nothing to train on: train on "
                              f"another source and evaluate the run on it with attnlab eval RUN --data "
                              f"{recipe.data.name}")
        source = recipe.model.checkpoint
        if source is not None:
            path = Path(source).expanduser()
            if not (path.is_file() or (path / "checkpoints").is_dir() or is_pretrained(path)):
                raise ConfigError(f"model.checkpoint must be a .safetensors/.pth file, an attnlab run directory or a "
                                  f"Hugging Face checkpoint folder (config.json and its weights) or a GGUF file; {path} is "
                                  f"{'a folder without checkpoints/ or config.json' if path.is_dir() else 'missing'}")
        elif recipe.model.freeze_backbone or recipe.model.lora is not None:
            key = "model.freeze_backbone" if recipe.model.freeze_backbone else "model.lora"
            raise ConfigError(f"{key} needs model.checkpoint (the weights to keep); got none")
        if recipe.model.convert_attention is not None and (source is None or not is_pretrained(source)):
            raise ConfigError(f"model.convert_attention changes the attention of a pretrained decoder: it needs "
                              f"model.checkpoint= a Hugging Face folder or a GGUF file; got {source}")
        convert = recipe.model.convert_attention
        if convert is not None and convert.to == "latent" and recipe.model.lora is not None:
            raise ConfigError("model.lora cannot adapt model.convert_attention={to: latent}: a LoRA run's checkpoints "
                              "keep the adapters alone, over weights it would have to factor again on every load; "
                              "fine-tune every weight (leave model.lora out)")
        if recipe.model.lora is not None and (recipe.model.freeze_backbone or recipe.model.backbone_lr_scale != 1.0):
            raise ConfigError("model.lora trains the adapters and the head, the rest stays frozen: leave "
                              "model.freeze_backbone (false) and model.backbone_lr_scale (1.0) out; got "
                              f"freeze_backbone={recipe.model.freeze_backbone}, "
                              f"backbone_lr_scale={recipe.model.backbone_lr_scale}")
        return model

    def check_model(self, recipe: Recipe) -> nn.Module | None:
        """``model.options`` against the model's configuration, named by their recipe keys
        (none yet for a recipe whose model is to come from ``model.checkpoint``: training
        refuses it until one is given, :func:`require_model`); the model built on the meta
        device, or ``None``."""
        if not recipe.model.name:
            return None
        try:
            with torch.device("meta"):
                model = self.build_model(recipe)
        except OptionError as exc:  # named by its recipe key, as the training keys are
            raise ConfigError(f"model.options.{exc.key} must be {exc.rule}; got {exc.value!r} (model "
                              f"{recipe.model.name!r})") from None
        except InputError as exc:
            raise ConfigError(f"model {recipe.model.name!r}: {exc}") from None
        try:
            require_memory(training_bytes(model, recipe.train.optimizer, frozen=recipe.model.freeze_backbone),
                           f"model.options: model {recipe.model.name!r} of {_size_of(model)}, trained with "
                           f"{recipe.train.optimizer} ({4 * _COPIES.get(recipe.train.optimizer, 4)} bytes per "
                           f"trained float32 parameter: {_STATE.get(recipe.train.optimizer, 'weights and gradients')})")
        except InputError as exc:
            raise ConfigError(str(exc)) from None
        return model

    # ------------------------------------------------------------------ the training skeleton's steps
    def read_data(self, recipe: Recipe, log: Callable[[str], None]) -> Any:
        """The run's data, read before its run directory is made (a bad file is named before
        anything is written): by default the splits of the recipe's source, whose notes
        (counts, skipped rows) go to ``log``."""
        if not recipe.data.kind:
            raise NotImplementedError(f"task {self.name!r} reads its own data: it must define read_data")
        splits = source_of(recipe.data).load(recipe.data)
        for note in splits.notes:
            log(note)
        return splits

    def folds(self, recipe: Recipe, data: Any) -> list[tuple[str, Any]] | None:
        """``[(folder name, data of that sub-run), ...]`` when a run is made of complete
        sub-runs in folders of its own (the folds of a cross-validation), which
        :meth:`combine` merges; ``None``: one run."""
        return None

    def combine(self, recipe: Recipe, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The ``results.json`` of a run made of sub-runs, from theirs."""
        raise NotImplementedError

    def prepare(self, recipe: Recipe, run_dir: Path, data: Any, log: Callable[[str], None]) -> Prepared:
        """Inside the claimed ``run_dir``: the preprocessing (classes, tokenizers) learned
        from ``data`` and written beside the weights, or read back on resume (the weights
        belong to it), and the data sets the trainer reads."""
        raise NotImplementedError

    def test_weights(self, recipe: Recipe, run_dir: Path, log: Callable[[str], None]) -> str:
        """After fitting: the checkpoint the test set is evaluated with (``"auto"``: best on
        validation when the run kept one, else last); a task may write one first
        (averaged weights). Runs on every rank."""
        return "auto"

    def check_prepared(self, recipe: Recipe, run_dir: Path, model: nn.Module, prepared: Prepared,
                       log: Callable[[str], None]) -> None:
        """Before the first step (:func:`~attnlab.run.skeleton.preflight`): what the built
        ``model`` and the run's preprocessing (``prepared``) must agree on, a vocabulary's size
        and the model's, say. A mismatch the run cannot work with is an
        :class:`~attnlab.errors.InputError` naming both sides; one it works around is a line of
        ``log``."""

    def score(self, recipe: Recipe, run_dir: Path, model: nn.Module, prepared: Prepared, data: Any,
              log: Callable[[str], None]) -> dict[str, Any]:
        """What the task measures on the test set beyond the engine's loss and accuracy
        (BLEU, exact match), with the tested ``model``; rank 0 alone."""
        return {}

    def describe(self, recipe: Recipe) -> str:
        """What a run of ``recipe`` is, in a few words (the report's subtitle)."""
        return self.name.replace("_", " ")

    def metric_rows(self, metrics: dict[str, Any]) -> list[tuple[str, str]]:
        """``(name, value)`` rows of the test metrics, as the command line prints them."""
        rows = []
        if "test_accuracy" in metrics:
            spread = f" ± {100 * metrics['test_accuracy_std']:.2f}" if "test_accuracy_std" in metrics else ""
            rows.append(("test accuracy", f"{100 * metrics['test_accuracy']:.2f}%{spread}"))
        if "test_loss" in metrics:
            rows.append(("test loss", f"{metrics['test_loss']:.4f}"))
        return rows

    def save_preprocessing(self, run_dir: Path, recipe: Recipe, *, classes: Sequence[str] | None = None,
                           tokenizer: TextTokenizer | None = None,
                           target_tokenizer: TextTokenizer | None = None) -> list[Path]:
        """Write what :meth:`load` reads beside the weights: ``classes.json`` and
        ``tokenizer.json`` (a task with two tokenizers writes them as it names them).
        Returns the files written."""
        written = []
        if classes is not None:
            atomic_write_bytes(run_dir / "classes.json", json.dumps({"classes": list(classes)}, indent=1).encode())
            written.append(run_dir / "classes.json")
        if tokenizer is not None:
            written.append(tokenizer.save(run_dir / "tokenizer.json"))
        if target_tokenizer is not None:
            raise InputError(f"a {self.name} run has one tokenizer; got a target_tokenizer too")
        return written

    # ------------------------------------------------------------------ a finished run
    def preprocessing(self, run_dir: Path, recipe: Recipe) -> Preprocessing:
        """What ``run_dir`` (trained with ``recipe``) holds beside its weights, read back:
        :func:`attnlab.run.skeleton.load_run` builds the model from it, once."""
        return Preprocessing()

    def evaluate(self, run: TrainedRun, *, device: str = "auto", data: str | Path | None = None) -> dict[str, Any]:
        """The test metrics, under the keys ``results.json`` gives them, and ``samples``;
        with ``data`` (a labelled folder or file of one's own, in the task's format), the
        same metrics on it instead of the test set."""
        raise NotImplementedError

    def predict(self, run: TrainedRun, inputs: Sequence[Any], **options: Any) -> list[Any]:
        """Predictions for ``inputs`` (image files or texts, as :attr:`inputs` says):
        :class:`~attnlab.run.views.LabelPrediction` for a task whose :attr:`outputs` are
        labels (options ``top_k`` and ``batch_size``, which ``attnlab predict`` passes),
        :class:`~attnlab.run.views.TextPrediction` for one that generates text (options
        ``num_beams``, ``max_length``, ``batch_size``, ``device``). An input that cannot be
        read raises :class:`~attnlab.errors.InputError` naming it."""
        raise InputError(f"a {self.name} run makes no predictions on new inputs")

    def stream(self, run: TrainedRun, prompt: str, **options: Any) -> Iterator[str]:
        """The text that follows ``prompt``, piece by piece as it is generated (``attnlab
        generate``); options as :meth:`predict` takes them."""
        raise InputError(f"a {self.name} run does not generate text token by token")

    def sub_runs(self, run_dir: Path) -> list[Path]:
        """The complete runs inside ``run_dir`` when it holds no weights of its own (the
        folds of a cross-validation); their curves and pictures stand for it."""
        return []

    def report_items(self, runs: Sequence[TrainedRun], *, device: str = "auto") -> list[Any]:
        """What the run report shows beside results, configuration and curves: views of
        :mod:`attnlab.run.views` (predictions on the test set, sample outputs). ``runs``:
        the run, or its sub-runs (:meth:`sub_runs`), loaded."""
        return []

    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        """The attention of ``run``'s model on ``inputs`` (``None``: the first test
        examples), as views of :mod:`attnlab.run.views` that :mod:`attnlab.viz` draws."""
        raise AttentionUnavailable(f"a {self.name} run has no attention pictures",
                                   reason=f"the {self.name} task draws no attention pictures")

    def explore_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                      new_tokens: int = 20) -> list[Any]:
        """What the attention explorer (:func:`attnlab.viz.explore`) shows of ``run``'s model
        on ``inputs``: :meth:`attention_views` unless a task shows more (a language model
        its continuation, token by token; a translation its three attentions).
        ``new_tokens``: how many tokens a generating task adds to each input."""
        return self.attention_views(run, inputs, max_inputs=max_inputs)

    def __repr__(self) -> str:
        return f"<task {self.name}: {self.summary}>"


# Copies of each trained parameter that training keeps: the weights, their gradients and the
# optimizer's state (AdamW's two moments, SGD's momentum).
_COPIES = {"adamw": 4, "sgd": 3}
_STATE = {"adamw": "weights, gradients and AdamW's two moments", "sgd": "weights, gradients and SGD's momentum"}


def training_bytes(model: nn.Module, optimizer: str = "adamw", *, frozen: bool = False) -> int:
    """The bytes ``model`` takes while it trains (it may be on the meta device): each trained
    parameter with its gradient and the optimizer's state (16 bytes per float32 parameter
    under AdamW), frozen ones (LoRA's base, or all with ``frozen``: the head is a rounding
    error there) and buffers once. Activations come on top, and depend on the batch."""
    copies = _COPIES.get(optimizer, 4)
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad and not frozen)
    kept = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad or frozen)
    return copies * trained + kept + sum(b.numel() * b.element_size() for b in model.buffers())


def _size_of(model: nn.Module) -> str:
    """``1,234 parameters (the largest: embed.weight (300, 32))`` for a message."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    if not named:
        return "no parameters"
    name, largest = max(named, key=lambda item: item[1].numel())
    return (f"{sum(p.numel() for p in model.parameters()):,} parameters (the largest: {name} "
            f"({', '.join(map(str, largest.shape))}))")


def check_texts(inputs: Sequence[Any], task: str) -> list[str]:
    """``inputs`` as a list of texts, or an error naming the first that is not one."""
    for i, t in enumerate(inputs):
        if not isinstance(t, str):
            shape = f" of shape {shape_str(t)}" if hasattr(t, "shape") else ""  # a tensor by its shape, never whole
            raise InputError(f"inputs[{i}] must be a text (str) for a {task} run; got {type(t).__name__}{shape}")
        check_text(t, f"inputs[{i}]")
    return list(inputs)


def check_text(text: str, where: str) -> None:
    """Refuse a text that holds bytes which are not UTF-8: Python reads them (from a terminal, a
    pipe or a file name) as lone surrogates, which no tokenizer can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{where} is not UTF-8 text: {exc.end - exc.start:,} of its bytes, from character "
                         f"{exc.start:,}, are not (given in another encoding?)") from None


_TASKS: dict[str, Task] = {}
# Names that older attnlab versions wrote into config.yaml.
_RENAMED = {"sentiment": "text_classification"}
T = TypeVar("T", bound=type)


def register_task(cls: T) -> T:
    """Class decorator: make the :class:`Task` subclass ``cls`` nameable in a recipe's
    ``task:`` key. Its ``name`` must be new."""
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise InputError(f"register_task takes a Task subclass; got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise InputError(f"{cls.__name__}.name must be a non-empty string; got {name!r}")
    if name in _TASKS or name in _RENAMED:
        raise InputError(f"task {name!r} is already registered (by {type(_TASKS[name]).__name__ if name in _TASKS else 'attnlab'})")
    if not (isinstance(getattr(cls, "recipe_class", None), type) and issubclass(cls.recipe_class, Recipe)):
        raise InputError(f"{cls.__name__}.recipe_class must be a Recipe subclass")
    _TASKS[name] = cls()
    return cls


def _register_built_ins() -> None:
    """The built-in tasks register when :mod:`attnlab.tasks` is imported (this skeleton names none
    of them): a lookup imports it once, as a plugin registry loads its entry points."""
    importlib.import_module("attnlab.tasks")


def get_task(name: str) -> Task:
    """The registered task ``name`` (did-you-mean error otherwise)."""
    _register_built_ins()
    name = _RENAMED.get(name, name)
    if name not in _TASKS:
        raise ConfigError(f"unknown task {name!r}" + did_you_mean(name, _TASKS, "registered tasks")
                          + " (a task of your own registers when its module is imported: --import MODULE)")
    return _TASKS[name]


def list_tasks() -> list[Task]:
    _register_built_ins()
    return [_TASKS[n] for n in sorted(_TASKS)]


def recipe_from_dict(data: dict[str, Any], source: str = "", *, legacy: bool = False) -> Recipe:
    """A recipe of its task's recipe class, checked (keys, types, ranges, model options).
    ``source`` (a file name) prefixes the errors. ``legacy``: the config of a run (perhaps
    trained by an older attnlab, whose sections of other tasks are dropped), whose model
    was checked when it trained and is not built here."""
    name = data.get("task", "image_classification")
    if not isinstance(name, str):
        raise ConfigError(f"{source + ': ' if source else ''}task must be a task name; got {name!r}")
    task = get_task(name)
    if legacy:
        data = task.upgrade(data)
    data = {**data, "task": task.name}
    try:
        recipe = from_dict(task.recipe_class, data)
        if not legacy:  # a run's own recipe was checked when it trained; loading it builds its model once
            pretrained_model(recipe, task)
            task.check(recipe)
    except InputError as exc:
        raise ConfigError(f"{source}: {exc}" if source else str(exc)) from None
    return recipe
