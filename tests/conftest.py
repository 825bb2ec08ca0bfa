"""Shared test setup. Without a GPU, Triton kernels run only under the interpreter, which must be
chosen before the first kernel is compiled, so it is set here for the whole session."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def seed(request):
    """A fresh seed per test, printed so a failure can be replayed."""
    s = int.from_bytes(os.urandom(4), "little") if os.environ.get("WB_TEST_SEED") is None \
        else int(os.environ["WB_TEST_SEED"])
    print(f"{request.node.name}: seed {s} (replay with WB_TEST_SEED={s})")
    torch.manual_seed(s)
    return s
