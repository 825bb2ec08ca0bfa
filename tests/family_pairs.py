"""The pair every family test compares: transformers' modules with fresh weights (drawn by the family test's own
``randomize``), and our tower loaded from their state dict."""
from workbench.reference import hf_vision_model
from workbench.towers import build_tower


def matched_pair(cfg, seed, *, randomize, **kw):
    """(transformers' modules for ``cfg``, randomized with ``seed``; our tower built with ``kw``, loaded from them)."""
    hf = randomize(hf_vision_model(cfg), seed)
    ours = build_tower(cfg, **kw).eval()
    ours.load_hf_state_dict(hf.state_dict())
    return hf, ours
