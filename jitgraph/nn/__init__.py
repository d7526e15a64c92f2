"""jitgraph.nn: layers with PyTorch's names, layouts and initializations, built on jitgraph's
graphs (see module.py), and their weights by name (state_dict, safetensors)."""
from .files import load_safetensors, save_safetensors
from .layers import (GELU, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d, Dropout, Embedding, Flatten, Identity, LayerNorm,
                     LeakyReLU, Linear, LogSoftmax, ModuleList, MultiheadAttention, ReLU, RMSNorm, Sequential, Sigmoid,
                     SiLU, Softmax, Tanh)
from .module import Buffer, LoadResult, Module, Parameter, manual_seed

__all__ = ["Module", "Parameter", "Buffer", "LoadResult", "manual_seed", "load_safetensors", "save_safetensors",
           "Linear", "Conv1d", "Conv2d", "BatchNorm1d", "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding", "Dropout",
           "MultiheadAttention", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "Softmax", "LogSoftmax",
           "Identity", "Flatten", "Sequential", "ModuleList"]
