"""One process has the terminal's stdin, as under python: ``input()`` and ``breakpoint()`` (pdb)
at a real pseudo-terminal, the same keystrokes for python and ``phalanx run``."""

from __future__ import annotations

import pytest

from .conftest import command
from .term import Tty


@pytest.mark.parametrize("how", ["python", "phalanx"])
def test_input_and_pdb_work_at_the_terminal(project, env, how):
    term = Tty(command(how, "interactive.py"), str(project), env)
    term.expect("name\\? ", timeout=120)
    term.send(b"ada\n")
    term.expect("hello ada")
    at = term.expect(r"\(Pdb\) ").end()
    term.send(b"p x + 1\n")
    at = term.expect("42", start=at).end()
    term.send(b"x = 7\n")
    term.expect(r"\(Pdb\) ", start=at)
    term.send(b"c\n")
    term.expect("x is 7")
    assert term.wait() == 0, term.text()
