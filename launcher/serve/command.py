"""`launch generate` and `launch serve`: parse, load the run, hand over to generate.py or
server.py. Every bad input is one line on stderr and exit status 2, before any model loads
where it can be found earlier."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from launcher.config.serve import ServeConfig
from launcher.errors import ConfigError, LauncherError
from launcher.exit_codes import ABORTED, CONFIG_ERROR
from launcher.logs import get_logger, setup_logging
from launcher.serve.options import CommandLine, apply_overrides, parse_argv

GENERATE_USAGE = """\
usage: launch generate RUN_DIR_OR_CHECKPOINT PROMPTS.jsonl [--output FILE] [overrides]

Batched offline generation from a run's newest complete checkpoint (or the checkpoints/step_<N>
given), with continuous batching. Each input line is {"prompt": "...", "max_new_tokens": N}
("max_new_tokens", "stop" and "seed" optional); each output line is the input object plus
"completion", in input order, on stdout or in FILE. Progress and tokens/s go to stderr.

overrides: serve.slots serve.max_new_tokens serve.temperature serve.top_k serve.top_p
           serve.seed serve.max_prompt_tokens train.device=auto|cpu|cuda
"""

SERVE_USAGE = """\
usage: launch serve RUN_DIR_OR_CHECKPOINT [overrides]

An OpenAI-compatible server on a run's checkpoint: POST /v1/completions and
/v1/chat/completions (streaming too), GET /v1/models and /health (docs/serve.md has the table).
Needs the serve extra: pip install 'launcher[serve]'. SIGTERM or Ctrl-C: answer new requests
503, finish the requests held, then exit 0; a second signal stops at once (exit 130).

overrides: serve.host serve.port serve.slots serve.queue serve.max_new_tokens
           serve.max_prompt_tokens serve.temperature serve.top_k serve.top_p serve.seed
           serve.model_name serve.max_body_bytes serve.header_timeout_seconds
           serve.body_timeout_seconds serve.keep_alive_seconds train.device=auto|cpu|cuda
"""

SERVE_INSTALL = "pip install 'launcher[serve]'"


def _device(name: str) -> Any:
    from launcher.distributed import pick_device

    return pick_device(name, 0)


def _positionals(line: CommandLine, names: list[str], usage: str) -> list[str]:
    if len(line.positionals) != len(names):
        given = " ".join(line.positionals) or "nothing"
        raise ConfigError(
            names[len(line.positionals)] if len(line.positionals) < len(names) else "arguments",
            f"expected {' '.join(names)}, got {given}.",
            usage.splitlines()[0].removeprefix("usage: ") + ".",
        )
    return line.positionals


def _refused(exc: LauncherError) -> int:
    get_logger().error(str(exc))
    return exc.exit_code or CONFIG_ERROR


def generate_main(argv: list[str]) -> int:
    setup_logging(0)
    try:
        line = parse_argv(argv, "generate", takes_output=True)
        if line.help:
            print(GENERATE_USAGE, end="")
            return 0
        run_arg, prompts_arg = _positionals(
            line, ["RUN_DIR_OR_CHECKPOINT", "PROMPTS.jsonl"], GENERATE_USAGE
        )
        from launcher.serve.generate import (
            build_engine,
            check_failures,
            generate,
            prompt_limit,
            to_requests,
        )
        from launcher.serve.load import find_checkpoint, load_run
        from launcher.serve.prompts import read_prompts
        from launcher.userpath import check_output_file

        apply_overrides(ServeConfig(), line.overrides, "generate")  # keys and types, early
        find_checkpoint(run_arg)  # a missing run is named before the prompts are read
        lines = read_prompts(prompts_arg)
        if line.output == "-":
            line.output = None  # `-`: stdout
        if line.output:  # before the model loads
            check_output_file(Path(line.output).expanduser(), "--output")
        threads = apply_thread_rule()
        run = load_run(run_arg, _device("cpu"))
        serve, device_name = apply_overrides(run.cfg.serve, line.overrides, "generate")
        device = _device(device_name)
        run.model.to(device)
        engine = build_engine(run, serve, device)
        requests = to_requests(lines, run, serve, prompt_limit(serve, engine.context))
        print(  # stderr: stdout is the output
            f"generating {len(lines)} prompts from {run.checkpoint.path} ({serve.slots} slots, "
            f"{threads} CPU threads)",
            file=sys.stderr,
        )
        if line.output:
            _generate_to_file(engine, requests, Path(line.output).expanduser(), generate)
        else:
            _generate_to_stdout(engine, requests, generate)
        check_failures(requests)
    except LauncherError as exc:
        return _refused(exc)
    return 0


def _generate_to_file(engine: Any, requests: Any, path: Path, generate: Any) -> None:
    """--output FILE by launcher/userpath's rule: a regular file (or a link's file) replaced
    when every request is answered, with its permission bits; a FIFO, a device or a descriptor's
    name written in place."""
    from launcher.userpath import open_output

    with open_output(path, "--output") as out:
        generate(engine, requests, out)


def _generate_to_stdout(engine: Any, requests: Any, generate: Any) -> None:
    """The output on stdout; a reader that went away (`| head`) ends the command quietly, a full
    disk behind `>` is one error."""
    from launcher.serve.generate import GenerationFailed
    from launcher.userpath import write_failed

    try:
        generate(engine, requests, sys.stdout)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        raise GenerationFailed("stdout was closed before every line was written.") from None
    except OSError as exc:
        failed = write_failed(exc, "stdout", "the output to stdout")
        if failed is None:
            raise
        raise failed from None


def serve_main(argv: list[str]) -> int:
    setup_logging(0)
    try:
        line = parse_argv(argv, "serve", takes_output=False)
        if line.help:
            print(SERVE_USAGE, end="")
            return 0
        (run_arg,) = _positionals(line, ["RUN_DIR_OR_CHECKPOINT"], SERVE_USAGE)
        _require_serve_extra()
        from launcher.config.load import load_config_file
        from launcher.rundir import CONFIG_FILE
        from launcher.serve.lifecycle import bind
        from launcher.serve.load import find_checkpoint, load_run

        apply_overrides(ServeConfig(), line.overrides, "serve")
        run_dir, _ = find_checkpoint(run_arg)
        early, _ = apply_overrides(
            load_config_file(run_dir / CONFIG_FILE).serve, line.overrides, "serve"
        )
        sock = bind(early.host, early.port)  # a port in use is named before the model loads
        threads = apply_thread_rule()
        run = load_run(run_arg, _device("cpu"))
        serve, device_name = apply_overrides(run.cfg.serve, line.overrides, "serve")
        name = serve.model_name or run_dir.name
        return _serve(run, serve, _device(device_name), name, sock, threads)
    except LauncherError as exc:
        return _refused(exc)


def apply_thread_rule() -> int:
    """Training's rule (launcher/runners/local.py): OMP_NUM_THREADS when set, else this
    machine's cores for the one process; a loaded machine's default threads oversubscribe."""
    import torch

    from launcher.host import local_cpu_count

    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or local_cpu_count()
    torch.set_num_threads(max(1, threads))
    return torch.get_num_threads()


def _require_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "launch serve",
            f"needs the serve extra (FastAPI, uvicorn), which is not installed ({exc.name} is "
            "missing).",
            f"{SERVE_INSTALL}.",
        ) from None


def _serve(run: Any, serve: Any, device: Any, name: str, sock: Any, threads: int) -> int:
    from launcher.serve.adapters import vocab_of
    from launcher.serve.generate import build_engine, prompt_limit
    from launcher.serve.lifecycle import DrainingServer
    from launcher.serve.server import ServeState, create_app
    from launcher.serve.timeouts import uvicorn_config
    from launcher.serve.worker import EngineThread

    run.model.to(device)
    engine = build_engine(run, serve, device, queue=serve.queue)
    worker = EngineThread(engine)
    limit = prompt_limit(serve, engine.context)
    state = ServeState(worker, run.codec, serve, limit, name, vocab=vocab_of(run.model))
    config = uvicorn_config(create_app(state), serve)
    server = DrainingServer(config, state)
    # uvicorn re-raises the signal that stopped it once it is done; these handlers make that
    # a no-op, so a graceful stop exits 0 instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    worker.start()
    log = get_logger()
    log.info(
        f"serving {run.checkpoint.path} as {name!r} on http://{serve.host}:{serve.port} "
        f"({serve.slots} slots, queue {serve.queue}, {threads} CPU threads); "
        "POST /v1/completions /v1/chat/completions, GET /v1/models /health"
    )
    try:
        server.run(sockets=[sock])
    finally:
        state.accepting = False
        worker.stop()
    if worker.error is not None:
        log.error(f"the engine failed: {type(worker.error).__name__}: {worker.error}")
        return 1
    if server.force_exit:  # a second signal: uvicorn dropped the open connections
        log.warning("stopped at once (a second signal): requests still open were not answered.")
        return ABORTED
    if not server.started:
        log.error(f"the server did not start on {serve.host}:{serve.port}.")
        return 1
    log.info("stopped: every request held was answered.")
    return 0
