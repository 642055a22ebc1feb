"""Deterministic settings for a flaketriage replay, applied at interpreter start.

Put on PYTHONPATH by the replay. When the program imports torch, this turns on deterministic
algorithms and cuDNN determinism before the program runs any kernel. Importing torch here would
cost every replay a second, so a finder waits for the program's own import instead. Any other
``sitecustomize`` further down the path still runs.
"""

import os
import sys

# Only cheap modules at start-up: importlib.abc alone costs ~8 ms, paid by every replay.

_HERE = os.path.dirname(os.path.abspath(__file__))


def _make_torch_deterministic(torch):  # type: ignore[no-untyped-def]
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    except Exception as exc:  # a partial or exotic torch build must not break the replay
        sys.stderr.write(f"flaketriage: could not enable torch determinism: {exc}\n")


class _TorchWatcher:
    """A meta path finder (duck-typed) that sees the program's own ``import torch``."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            original_exec(module)
            _make_torch_deterministic(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    others = [p for p in sys.path if p and os.path.abspath(p) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None and spec.origin != __file__:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


# flaketriage.replay_env.DETERMINISTIC_ENV: this runs inside the replayed program, where flaketriage
# may not be importable, so the name is written out.
if os.environ.get("FLAKETRIAGE_DETERMINISTIC", "1") == "1":
    if "torch" in sys.modules:
        _make_torch_deterministic(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchWatcher())
_chain_next_sitecustomize()
