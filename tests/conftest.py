"""Shared test setup. Without a GPU, Triton kernels run only under the interpreter, which must be
chosen before the first kernel is compiled, so it is set here for the whole session."""
import os

import pytest
import torch

from workbench.provenance import RESULTS_ENV

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def no_user_results(tmp_path_factory):
    """No test reads or writes the user's results/ folder: whatever writes into the default results
    folder (an interactive save_table, a command without --results, a subprocess that inherits the
    environment) lands in a folder of this session instead. A test that checks the default itself
    deletes the variable with monkeypatch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(RESULTS_ENV, str(tmp_path_factory.mktemp("default-results")))
        # nor the user's cache folder
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture
def stubs(tmp_path_factory, monkeypatch):
    """The stub studies of tests/stub_study.py (stub_a, stub_b), registered for this test only,
    each with a minimal notebook (for papermill mode); the registry is as it was afterwards. The
    test gets a cache folder of its own: a copy of the declarations saved without the stubs
    (another test's) must not refuse them, nor one saved with them outlive the test."""
    import stub_study
    from workbench.studies import STUDIES, register

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("stub-cache")))
    folder = tmp_path_factory.mktemp("stub-notebooks")
    before = {n: STUDIES[n] for n in stub_study.NAMES if n in STUDIES}
    made = {n: register(stub_study.make(n, stub_study.notebook(folder / f"{n}.ipynb", n))) for n in stub_study.NAMES}
    yield made
    for n in made:
        STUDIES.pop(n, None)
    STUDIES.update(before)


@pytest.fixture
def seed(request):
    """A fresh seed per test, printed so a failure can be replayed."""
    s = int.from_bytes(os.urandom(4), "little") if os.environ.get("WB_TEST_SEED") is None \
        else int(os.environ["WB_TEST_SEED"])
    print(f"{request.node.name}: seed {s} (replay with WB_TEST_SEED={s})")
    torch.manual_seed(s)
    return s


@pytest.fixture(scope="module")
def photos():
    """The shipped sample photos by name (`workbench.sample_images`), drawn once per test module."""
    import workbench as wb
    return wb.sample_images()
