"""The hang watchdog's reading of a rank's stack: waiting for a peer, or stuck on its own."""

from __future__ import annotations

from launcher.runners.watchdog import _in_collective

WAITING = """Thread 0x00007f1faad546c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f1fd33beb80 (most recent call first):
  File "/repo/launcher/training/loss.py", line 137 in _arrived
  File "/repo/launcher/training/loss.py", line 146 in scale
  File "/repo/launcher/training/loop.py", line 162 in train_step
  File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367 in wrapper
"""


def test_a_rank_in_its_collective_waits_for_a_peer_one_elsewhere_does_not() -> None:
    assert _in_collective(WAITING)
    stuck = WAITING.replace('loss.py", line 137 in _arrived', 'tokens.py", line 9 in read')
    assert not _in_collective(stuck)  # torch.distributed's wrapper far down does not count
    assert _in_collective(
        stuck.replace("/repo/launcher/training/tokens.py", "/v/torch/distributed/c.py")
    )
