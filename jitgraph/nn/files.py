"""Weights in files: safetensors, read and written through the ``safetensors`` package (its
Rust reader checks the header: length, JSON, offsets that cover the file exactly), and
state dicts from any source turned into numpy arrays, checked before anything is set."""
import json
import os
import struct
from typing import Any, Dict, Mapping, Union

import numpy as np

from ..errors import GraphError

PathLike = Union[str, "os.PathLike[str]"]
MAX_HEADER = 100 << 20          # the format's own bound on the JSON header (bytes)


def _safetensors() -> Any:
    try:
        import safetensors.numpy
    except ImportError:                   # a dependency of jitgraph; only a broken install lacks it
        raise ImportError("reading and writing safetensors files needs the 'safetensors' package: "
                          "pip install safetensors") from None
    return safetensors


def as_arrays(state: Mapping[str, Any], what: str) -> Dict[str, np.ndarray]:
    """{name: numpy array} from arrays, numbers or torch tensors (bfloat16 ones widened to
    float32), without importing torch; a GraphError names a key that is not a string or a
    value that is not an array of real numbers."""
    return {key: to_array(key, value, what) for key, value in state.items()}


def to_array(key: Any, value: Any, what: str) -> np.ndarray:
    if not isinstance(key, str):
        raise GraphError(f"{what}: keys must be strings (parameter names), got {key!r}")
    if hasattr(value, "detach") and hasattr(value, "cpu"):          # a torch tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    try:
        arr = np.asarray(value)
    except Exception as e:          # noqa: BLE001 -- any failure to convert is the same user error
        raise GraphError(f"{what}: {key!r} is not an array ({type(value).__name__}: {e})") from None
    if arr.dtype.kind not in "biuf":
        raise GraphError(f"{what}: {key!r} has dtype {arr.dtype}, not real numbers")
    return arr


def load_safetensors(path: PathLike) -> Dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a numpy array (bfloat16 widened to float32, its
    exact values).  A missing, truncated, oversized-header or malformed file raises a
    GraphError naming the file and the problem; nothing is returned half-read."""
    st = _safetensors()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GraphError(f"safetensors file {path!r} does not exist")
    out: Dict[str, np.ndarray] = {}
    try:
        with st.safe_open(path, framework="numpy") as f:
            for key in f.keys():
                if f.get_slice(key).get_dtype() == "BF16":
                    out[key] = _bf16(path, key)
                else:
                    out[key] = f.get_tensor(key)
    except GraphError:
        raise
    except Exception as e:            # noqa: BLE001 -- SafetensorError and friends: a bad file
        raise GraphError(f"safetensors file {path!r} could not be read: {e}") from None
    return out


def _bf16(path: str, key: str) -> np.ndarray:
    """A bfloat16 tensor (numpy has no such dtype) widened to float32, read at the offsets of
    the header safe_open has already checked."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        entry = json.loads(fh.read(n))[key]
        start, end = entry["data_offsets"]
        fh.seek(8 + n + start)
        raw = np.frombuffer(fh.read(end - start), "<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def save_safetensors(state: Mapping[str, Any], path: PathLike) -> None:
    """Write {name: array} to a safetensors file (contiguous copies; PyTorch's
    ``safetensors.torch.load_file`` reads it)."""
    arrays = {k: np.array(v, order="C") for k, v in as_arrays(state, "save_safetensors").items()}   # 0-d stays 0-d
    _safetensors().numpy.save_file(arrays, os.fspath(path))
