"""`make run`'s Ctrl-C: the first stops the platform's processes gently (the worker
finishes its requests); a second, pressed while one is still finishing, stops them at once
instead of leaving them to run on without the embedded Redis."""

import _thread
import io
import subprocess
import sys
import threading
import time

from simulation.management.commands.runplatform import Command

# Like the delivery worker finishing its requests: the first SIGTERM only starts the
# wind-down; a second one ends it (exit code 0, not a kill), unless it comes within 1 s of
# the first, which RQ takes for a repeat of the same signal and ignores.
SLOW_TO_STOP = """
import signal, sys, time
first = []
def on_term(*_):
    if not first:
        first.append(time.monotonic())
    elif time.monotonic() - first[0] >= 1.0:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_second_ctrl_c_stops_a_child_still_finishing_at_once() -> None:
    child = subprocess.Popen([sys.executable, "-c", SLOW_TO_STOP], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    command = Command(stdout=io.StringIO())
    pressed = threading.Timer(0.3, _thread.interrupt_main)  # the second Ctrl-C, soon after
    started = time.monotonic()
    pressed.start()
    try:
        command._stop({"worker": child})
    finally:
        pressed.cancel()
        if child.poll() is None:
            child.kill()
        child.stdout.close()
    # Without a second SIGTERM after RQ's repeat window, it would have been killed (-9).
    assert child.returncode == 0
    assert time.monotonic() - started < 20
    assert "Stopping at once" in command.stdout.getvalue()


def test_children_that_stop_on_the_first_sigterm_are_simply_waited_for() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    command = Command(stdout=io.StringIO())
    command._stop({"receiver": child})
    assert child.returncode == -15  # SIGTERM's default: it ended there
    assert "Stopping at once" not in command.stdout.getvalue()
