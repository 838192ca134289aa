"""Inside a rank forked by launcher/runners/rank_fork.py: become what `python -u -m MODULE ARGV`
with the rank's environment would be, run the worker's main, and end without ever returning into
the agent's code.

What a new interpreter would not have is dropped: the parent's signal handlers (SIGINT gets
Python's KeyboardInterrupt handler back, SIG_IGN stays ignored, as across an exec), its exit
hooks and pending finalizers (which would clean up `launch`'s resources), its multiprocessing
children, its log handlers, its environment; its streams write each line at once. The file
descriptors it held stay open in the rank (the run lock among them, then held until the last
rank ends): closing them here could close a number the rank reuses, once an object of the
parent's that owned it is collected. The parent's stack stays under the rank's (hang reports
show those frames too).
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import logging
import os
import signal
import sys
import traceback
import weakref
from contextlib import suppress
from importlib import import_module
from typing import NoReturn

_PR_SET_NAME = 15


def become_rank(module: str, argv: list[str], env: dict[str, str], ready: int) -> NoReturn:
    """The forked child's whole life. `ready`: a pipe's write end, closed once this process leads
    a session of its own (the agent signals the rank's process group)."""
    code = 1
    # What the agent's process holds (torch's, dynamo's and the launcher's modules: a million
    # objects) is never this rank's garbage: frozen, no collection of the rank walks it again
    # (each full one did, 0.2-0.4 CPU-seconds, writing to every object's pages, which copy-on-write
    # then copies into the rank).
    gc.freeze()
    try:
        os.setsid()  # as torchrun's Popen(start_new_session=True)
        os.close(ready)
        as_new_interpreter(module, argv, env)
        from launcher.worker.__main__ import main

        code = main(argv, worker=module)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            from launcher.lifetime import exit_now

            exit_now(code)
        finally:
            os._exit(code)


def as_new_interpreter(module: str, argv: list[str], env: dict[str, str]) -> None:
    _signals_as_after_exec()
    _drop_exit_hooks()
    os.environ.clear()
    os.environ.update(env)
    for stream in (sys.stdout, sys.stderr):
        # The same objects (what wandb's console capture hooked in `launch` stays hooked), each
        # line out at once as under `python -u`.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with suppress(ValueError):
                reconfigure(line_buffering=True, write_through=True)
    from launcher.logs import setup_logging

    setup_logging(int(env.get("RANK", "0") or 0))  # the parent's handlers talk as `launch`
    main_module = f"{module}.__main__" if module == "launcher.worker" else module
    sys.argv = [getattr(import_module(main_module), "__file__", None) or module, *argv]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` puts it there
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))  # read once at start-up by a new interpreter
    try:
        name = f"rank{env.get('RANK', '')}".encode()[:15]
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _signals_as_after_exec() -> None:
    """An exec resets handled signals to their default and keeps ignored ones; Python then
    installs its KeyboardInterrupt handler for SIGINT unless SIGINT is ignored."""
    for sig in signal.valid_signals():
        handler = signal.getsignal(sig)
        if callable(handler) and sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)


def _drop_exit_hooks() -> None:
    """The parent's exit hooks and finalizers out, the standard ones this process still needs
    back in (their modules are imported already, so nothing would register them again)."""
    import multiprocessing.process
    import multiprocessing.util

    clear = getattr(atexit, "_clear", None)
    if clear is None:
        return
    clear()
    # As multiprocessing's own children start (BaseProcess._bootstrap).
    multiprocessing.process._children = set()  # type: ignore[attr-defined]
    multiprocessing.util._finalizer_registry.clear()  # type: ignore[attr-defined]
    multiprocessing.util._run_after_forkers()  # type: ignore[attr-defined]
    atexit.register(multiprocessing.util._exit_function)  # type: ignore[attr-defined]
    registry = getattr(weakref.finalize, "_registry", None)
    if isinstance(registry, dict):
        registry.clear()  # `launch`'s temporary directories and the like are not this rank's
        weakref.finalize._registered_with_atexit = False  # type: ignore[attr-defined]
    data_utils = sys.modules.get("torch.utils.data._utils")
    if data_utils is not None and hasattr(data_utils, "_set_python_exit_flag"):
        atexit.register(data_utils._set_python_exit_flag)
    atexit.register(logging.shutdown)
