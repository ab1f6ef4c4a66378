"""Tasks: image classification, text classification, translation and the reversal demo,
each one class behind one protocol (:class:`Task`), registered by name.

::

    from attnlab.tasks import load_run, train
    results = train(recipe, "runs/mr")         # results.json's content (the one training skeleton)
    run = load_run("runs/mr")                  # a TrainedRun: recipe, model, tokenizer, classes, checkpoint
    run.predict(["a gorgeous , witty film ."])  # [LabelPrediction(input=..., labels=[("positive", 0.93)])]
    run.evaluate()                              # results.json's test figures, recomputed

A task of one's own: subclass :class:`Task` (with a :class:`Recipe` subclass for its
settings, and the skeleton's steps), decorate it with :func:`register_task`, and name it
in a recipe's ``task:``;
``attnlab train my.yaml --import my_module`` imports the module that registers it.
"""

from . import image_classification, language_modeling, reverse, text_classification, translation  # noqa: F401  # registers the tasks
from ..run.recipe import DataConfig, ModelConfig, Recipe, model_label, recipe_dict
from ..run.task import ImageSpec, Prepared, Preprocessing, Task, get_task, list_tasks, recipe_from_dict, register_task
from ..run.trained import TrainedRun
from ..run.skeleton import (CHANGES, CONFIG, RESULTS, finish_run, load_run, open_run, read_config, read_recipe, read_results,
                   report_items, train)
from ..run.views import (AlignmentAttention, ClassifierPredictions, ImageAttention, LabelPrediction, PixelAttention,
                    SampleTable, TextPrediction, TextAttention)

__all__ = ["Task", "TrainedRun", "Recipe", "DataConfig", "ModelConfig", "ImageSpec", "Prepared", "Preprocessing",
           "register_task", "get_task", "list_tasks", "model_label", "recipe_from_dict", "recipe_dict", "train", "load_run",
           "report_items", "finish_run", "open_run", "read_config", "read_recipe",
           "read_results", "CONFIG", "CHANGES", "RESULTS", "LabelPrediction", "TextPrediction", "ClassifierPredictions", "SampleTable",
           "TextAttention", "AlignmentAttention", "ImageAttention", "PixelAttention"]
