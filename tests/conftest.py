"""Test configuration: Triton kernels run through the interpreter when there is no CUDA device.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` function is decorated, so it is set
here, before the tests import :mod:`kernels`.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
