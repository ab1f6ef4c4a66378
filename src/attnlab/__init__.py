"""attnlab: attention mechanisms and the models built on them, in PyTorch."""

__version__ = "0.1.0"

from . import attention, data, layers, models  # noqa: E402
from .models import create_model, list_models  # noqa: E402
from .tasks import finish_run, load_run, train  # noqa: E402

__all__ = ["attention", "data", "layers", "models", "create_model", "list_models", "train", "load_run", "finish_run",
           "__version__"]
