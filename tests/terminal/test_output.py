"""What the person at the terminal sees, through a real pseudo-terminal, compared with python.

- a tqdm-style ``\\r`` bar appears step by step as it is drawn, not at the next newline (each
  step is let go only after the test saw it on the terminal), with the rank prefix after each
  ``\\r`` when several ranks share the terminal, and colours where the rank writes to a terminal
  (one process: as under python; ``-n 2``: rank 0);
- one process: ``isatty()`` answers as under python (colours kept), stderr stays stderr (here
  redirected to a file, as ``2>err.txt`` would), and the rank's log still gets both streams.
"""

from __future__ import annotations

import re

import pytest

from .conftest import command, last_job
from .term import Tty

BAR = [("python", ""), ("phalanx", ""), ("phalanx-n2", "[0] ")]


@pytest.mark.parametrize("how,prefix", BAR, ids=[b[0] for b in BAR])
def test_a_progress_bar_is_shown_as_it_is_drawn(project, env, how, prefix):
    term = Tty(command(how, "progress.py"), str(project), env)
    for step in (1, 2, 3):
        # the script draws the next step only once this one was seen: no newline has come yet
        term.expect(re.escape(f"{'' if step == 1 else chr(13)}{prefix}training: step {step}/3"), timeout=120)
        (project / f"go{step}").touch()
    assert term.wait() == 0, term.text()
    shown = term.text()
    if how == "phalanx-n2":
        # rank 0 writes to a terminal of its own (torchrun's ranks all write to its terminal)
        assert "[0] \x1b[32mgreen\x1b[0m" in shown and "[1] plain" in shown, shown
    else:
        assert "\x1b[32mgreen\x1b[0m" in shown, shown  # stdout is a terminal: colours, as under python


def test_one_process_sees_the_streams_python_gives_it(project, env, tmp_path):
    seen = {}
    for how in ("python", "phalanx"):
        err = tmp_path / f"err-{how}.txt"
        term = Tty(command(how, "streams.py"), str(project), env, stderr=str(err))
        assert term.wait() == 0, term.text()
        seen[how] = ([line for line in term.text().splitlines() if line.startswith("tty ")],
                     "to-err" in term.text(), [line for line in err.read_text().splitlines() if not line.startswith("phalanx: ")])
    expected = (["tty out=True err=False in=True marker=False size=100"], False, ["to-err"])
    assert seen["python"] == seen["phalanx"] == expected, seen
    log = last_job(env).paths.rank_log(0, 0).read_text()
    assert "tty out=True" in log and "to-err" in log and "\r\n" not in log  # phalanx logs keeps both, as written
