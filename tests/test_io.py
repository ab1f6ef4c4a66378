"""Loading that runs no code (attnlab.io): a weights file whose pickle would run code is refused
without suggesting an unsafe load, and a damaged one is named."""

from __future__ import annotations

import pytest
import torch

from attnlab.io import read_state_dict


def test_a_pickled_weights_file_that_would_run_code_is_refused_without_suggesting_an_unsafe_load(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2), "x": Payload()}, path)
    with pytest.raises(ValueError) as info:
        read_state_dict(path)
    message = str(info.value)
    assert message.startswith(f"{path} was refused: it holds an object of ") and "print" in message
    assert "weights_only" not in message and "False" not in message
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match="is not a readable PyTorch file"):
        read_state_dict(path)
