"""Bad CIFAR-10 pickles give one-line ``ValueError``s that name the file and say what is wrong
(a forbidden global, cut short, empty, not a batch, a forged numpy dtype), never advice to load
them unsafely."""

import gzip
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnlab.data import CIFAR10, load_cifar_batch


UNSAFE_ADVICE = re.compile(r"pickle\.load|allow_pickle|weights_only|unsafe|trust", re.IGNORECASE)


def _batch(n: int = 2) -> dict:
    return {b"batch_label": b"testing batch 1 of 1", b"labels": list(range(n)),
            b"data": np.zeros((n, 3 * 32 * 32), np.uint8), b"filenames": [b"a.png"] * n}


def _write_test_batch(tmp_path: Path, payload: bytes) -> Path:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir(exist_ok=True)
    path = folder / "test_batch"
    path.write_bytes(payload)
    return path


def _cifar_error(tmp_path: Path) -> str:
    with pytest.raises(ValueError) as info:
        CIFAR10(tmp_path, split="test", format="pickle")
    message = str(info.value)
    assert "\n" not in message and not UNSAFE_ADVICE.search(message)
    return message


def test_cifar_batch_naming_a_forbidden_global_is_a_value_error_naming_the_file(tmp_path):
    path = _write_test_batch(tmp_path, b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R.")
    message = _cifar_error(tmp_path)
    assert str(path) in message and "os.system" in message and "corrupt or malicious" in message


def test_cifar_batch_cut_in_half_says_it_is_truncated(tmp_path):
    whole = pickle.dumps(_batch(), protocol=2)
    path = _write_test_batch(tmp_path, whole[: len(whole) // 2])
    message = _cifar_error(tmp_path)
    assert str(path) in message and "truncated" in message


def test_cifar_batch_missing_only_its_last_byte_says_it_is_truncated(tmp_path):
    path = _write_test_batch(tmp_path, pickle.dumps(_batch(), protocol=2)[:-1])
    message = _cifar_error(tmp_path)
    assert str(path) in message and "truncated" in message


def test_empty_cifar_batch_says_it_is_empty(tmp_path):
    path = _write_test_batch(tmp_path, b"")
    message = _cifar_error(tmp_path)
    assert str(path) in message and "empty" in message


def test_cifar_batch_that_is_not_a_pickle_names_the_file(tmp_path):
    path = _write_test_batch(tmp_path, gzip.compress(pickle.dumps(_batch(), protocol=2)))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "not a CIFAR-10 batch" in message


def test_cifar_batch_holding_a_list_says_a_dict_with_data_and_labels_is_expected(tmp_path):
    path = _write_test_batch(tmp_path, pickle.dumps([np.zeros((2, 3072), np.uint8), [0, 1]], protocol=2))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "got a list" in message and "'data' and 'labels'" in message


def test_cifar_batch_dict_without_data_and_labels_lists_its_keys(tmp_path):
    # keys of mixed types: the message must still list them
    path = _write_test_batch(tmp_path, pickle.dumps({b"batch_label": b"x", 7: b"y"}, protocol=2))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "'data' and 'labels'" in message and "batch_label" in message


def test_cifar_batch_with_ragged_labels_names_the_file(tmp_path):
    batch = _batch()
    batch[b"labels"] = [[0], [1, 2]]
    path = _write_test_batch(tmp_path, pickle.dumps(batch, protocol=2))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "labels" in message


def test_cifar_meta_with_label_names_not_a_list_names_the_file(tmp_path):
    _write_test_batch(tmp_path, pickle.dumps(_batch(), protocol=2))
    meta = tmp_path / "cifar-10-batches-py" / "batches.meta"
    meta.write_bytes(pickle.dumps({b"label_names": 10, b"num_vis": 3072}, protocol=2))
    message = _cifar_error(tmp_path)
    assert str(meta) in message and "label_names" in message


def test_cifar_batch_with_a_forged_dtype_state_is_refused_before_it_can_crash_python(tmp_path):
    """numpy applies a pickled dtype state unchecked; a forged one crashes the interpreter
    when the dtype is used. Run in a child process, so that a crash fails this test only."""
    batch = tmp_path / "data_batch_1"
    forge = (
        "import pickle, sys, numpy as np\n"
        "class Forged:\n"
        "    def __reduce__(self):\n"
        "        return (np.dtype, ('i8', False, True), (3, '<', None, -1, -1, 0))\n"
        "open(sys.argv[1], 'wb').write(pickle.dumps({b'data': Forged(), b'labels': [0]}, protocol=2))\n"
    )
    subprocess.run([sys.executable, "-c", forge, str(batch)], check=True, timeout=60)
    load = ("import sys\nfrom attnlab.data import load_cifar_batch\n"
            "try:\n    load_cifar_batch(sys.argv[1])['data'].itemsize\n"
            "except ValueError as exc:\n    print(exc)\n")
    r = subprocess.run([sys.executable, "-c", load, str(batch)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"the child process died ({r.returncode}): {r.stderr[-500:]}"
    assert "refusing a numpy dtype whose pickled state" in r.stdout and str(batch) in r.stdout


def test_load_cifar_batch_refusal_is_a_value_error(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"\x80\x02cbuiltins\neval\n.")
    with pytest.raises(ValueError, match=r"refusing to load global builtins\.eval") as info:
        load_cifar_batch(path)
    assert str(path) in str(info.value) and not UNSAFE_ADVICE.search(str(info.value))
