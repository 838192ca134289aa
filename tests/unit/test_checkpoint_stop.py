"""Stop signals: the first asks (a flag read at the next step boundary), a second SIGTERM ends the
process at once, SIGUSR1 only ever asks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from launcher.worker.stop import stop_on_signals
from tests.helpers import REPO


def test_first_signal_sets_the_flag_and_handlers_are_restored() -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    with stop_on_signals() as flag:
        assert not flag.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.requested and flag.signal_name == "SIGUSR1"
        # SIGUSR1 only asks: SIGTERM still gets a graceful first chance...
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.signal_name == "SIGUSR1"
        # ...and after it, the next SIGTERM has its default action (checked, not sent).
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_second_sigterm_stops_at_once() -> None:
    script = textwrap.dedent(
        """
        import os, signal, time
        from launcher.worker.stop import stop_on_signals
        with stop_on_signals() as flag:
            os.kill(os.getpid(), signal.SIGTERM)
            print("requested", flag.requested, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
            print("survived", flush=True)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert "requested True" in proc.stdout
    assert "survived" not in proc.stdout
    assert proc.returncode == -signal.SIGTERM
