"""Shared test setup. Triton kernels run on CPU only under the interpreter, which must be chosen
before triton is first imported, so it is set here for the whole session."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def seed(request):
    """A fresh seed per test, printed so a failure can be replayed."""
    s = int.from_bytes(os.urandom(4), "little") if os.environ.get("WB_TEST_SEED") is None \
        else int(os.environ["WB_TEST_SEED"])
    print(f"{request.node.name}: seed {s} (replay with WB_TEST_SEED={s})")
    torch.manual_seed(s)
    return s
