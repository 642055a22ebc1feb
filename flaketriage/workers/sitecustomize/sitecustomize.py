"""Deterministic settings for a flaketriage replay, applied at interpreter start.

Put on PYTHONPATH by the replay. When the program imports torch, this turns on deterministic
algorithms and cuDNN determinism before the program runs any kernel. Importing torch here would
cost every replay a second, so a finder waits for the program's own import instead. Any other
``sitecustomize`` further down the path still runs.

With ``FLAKETRIAGE_HANG_DUMP=1`` (replays, and captures with a time limit) SIGUSR1 makes
faulthandler write every thread's stack to stderr: what a run that hangs is asked for before it is
killed (`flaketriage.process.hangs`). With ``FLAKETRIAGE_TORCH_PROFILE=PATH`` (a telemetry run's profiled
replay) the torch profiler runs from the program's ``import torch`` to its exit and writes a Chrome
trace to PATH.
"""

import os
import sys

# Only cheap modules at start-up: importlib.abc alone costs ~8 ms, paid by every replay.

_HERE = os.path.dirname(os.path.abspath(__file__))


def _inductor_deterministic(config):  # type: ignore[no-untyped-def]
    config.deterministic = True


def _use_deterministic_algorithms(torch):  # type: ignore[no-untyped-def]
    """``torch.use_deterministic_algorithms(True, warn_only=True)``, without its import of
    ``torch._inductor.config``: that import loads TorchDynamo, seconds of every replay of a program
    that never compiles. The eager switch is set now and Inductor's as soon as the program imports
    it (what the public call sets, in this torch and older ones without that import)."""
    setter = getattr(getattr(torch, "_C", None), "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    setter(True, warn_only=True)
    sys.meta_path.insert(0, _ModuleWatcher("torch._inductor.config", _inductor_deterministic))


def _make_torch_deterministic(torch):  # type: ignore[no-untyped-def]
    try:
        _use_deterministic_algorithms(torch)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    except Exception as exc:  # a partial or exotic torch build must not break the replay
        sys.stderr.write(f"flaketriage: could not enable torch determinism: {exc}\n")


def _start_torch_profile(torch, path):  # type: ignore[no-untyped-def]
    try:
        import atexit

        from torch import profiler

        activities = [profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(profiler.ProfilerActivity.CUDA)
        prof = profiler.profile(activities=activities)
        prof.__enter__()
    except Exception as exc:
        sys.stderr.write(f"flaketriage: could not start the torch profiler: {exc}\n")
        return

    def stop():  # type: ignore[no-untyped-def]
        try:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(path)
        except Exception as exc:
            sys.stderr.write(f"flaketriage: could not write the torch profile: {exc}\n")

    atexit.register(stop)


# Resolved now, in the directory the run starts in: the program may change directory before it
# imports torch.
_TORCH_PROFILE = (
    os.path.abspath(os.environ["FLAKETRIAGE_TORCH_PROFILE"])
    if os.environ.get("FLAKETRIAGE_TORCH_PROFILE")
    else None
)


def _on_torch(torch):  # type: ignore[no-untyped-def]
    if os.environ.get("FLAKETRIAGE_DETERMINISTIC", "1") == "1":
        _make_torch_deterministic(torch)
    if _TORCH_PROFILE:
        _start_torch_profile(torch, _TORCH_PROFILE)


class _ModuleWatcher:
    """A meta path finder (duck-typed) that sees the program's own import of one module and calls
    ``then(module)`` once the module has run."""

    def __init__(self, name, then):  # type: ignore[no-untyped-def]
        self.name = name
        self.then = then

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module
        then = self.then

        def exec_module(module):  # type: ignore[no-untyped-def]
            original_exec(module)
            then(module)

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


def _register_hang_dump() -> None:
    # _signal and faulthandler are built in: the `signal` module (and its enums) would cost every
    # replay's start-up more than everything else here.
    import _signal
    import faulthandler

    if sys.stderr is None:
        return
    try:  # noqa: SIM105 (contextlib is not imported at start-up)
        faulthandler.register(_signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, RuntimeError, OSError):
        pass  # no SIGUSR1 here, or stderr is not a file: the run is killed without a dump


# flaketriage.process.replay_env.DETERMINISTIC_ENV and flaketriage.process.hangs.HANG_DUMP_ENV: this runs
# inside the replayed program, where flaketriage may not be importable, so the names are written out.
if os.environ.get("FLAKETRIAGE_DETERMINISTIC", "1") == "1" or _TORCH_PROFILE:
    if "torch" in sys.modules:
        _on_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _ModuleWatcher("torch", _on_torch))
if os.environ.get("FLAKETRIAGE_HANG_DUMP") == "1":
    _register_hang_dump()
_chain_next_sitecustomize()
