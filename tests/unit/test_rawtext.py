"""Text from bytes that are not UTF-8 (``core/rawtext.py``): shown as ``\\xNN``, command lines
quoted as bash quotes them (checked against bash itself) and read back, and the store finding
a job by such a name (``store/sql.TextConnection``)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess

import pytest

from phalanx.core.rawtext import escaped, is_clean, shell_join, shell_quote, shell_split, show_streams, unescaped

WORDS = [os.fsdecode(b"caf\xe9.txt"), "plain", "a b", "it's", "$HOME", "", "é", os.fsdecode(b"x\xff'\\\n\x01y"),
         os.fsdecode("é".encode() + b"\xc3")]


def test_escaped_shows_each_byte_and_unescaped_gives_it_back():
    assert escaped(os.fsdecode(b"data-\xff\xfe.bin")) == "data-\\xff\\xfe.bin"
    assert escaped("café") == "café" and is_clean("café") and not is_clean(os.fsdecode(b"\xff"))
    assert escaped("\ud800") == "\\xed\\xa0\\x80"  # a surrogate that stands for no byte: its UTF-8, shown
    for word in WORDS:
        assert unescaped(escaped(word)) == word


def test_shell_join_round_trips_and_bash_reads_the_same_bytes():
    line = shell_join(WORDS)
    assert is_clean(line) and shell_split(line) == WORDS
    assert shell_quote(os.fsdecode(b"caf\xe9.txt")) == "$'caf\\xe9.txt'"
    assert shell_join(["a b", "c"]) == "a b".join(["'", "' c"])  # plain words: shlex.join as before
    assert shell_split("train.py 'a b' \"c\\\"d\" e\\ f") == ["train.py", "a b", 'c"d', "e f"]
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    out = subprocess.run(["bash", "-c", "for w in " + line + '; do printf "%s\\0" "$w"; done'],
                         capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [os.fsencode(w) for w in WORDS]


def test_show_streams_never_raise_on_such_text():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    show_streams(stream)
    stream.write("name " + os.fsdecode(b"tr\xffain") + "\n")
    stream.flush()
    assert raw.getvalue() == b"name tr\\xffain\n"


def test_store_finds_a_job_by_a_name_that_is_not_utf8(tmp_path):
    from phalanx.store import Store

    store = Store(tmp_path / "phalanx.db")
    name = os.fsdecode(b"tr\xffain")
    store.insert_job(id="0123abcd", name=name, backend="local", nnodes=1, nproc_per_node=1,
                     command=f"train.py {os.fsdecode(b'caf')}", job_dir=str(tmp_path / "j"), spec_json="{}")
    assert store.find(name).id == "0123abcd" and store.find("tr\\xffain").name == "tr\\xffain"
    assert store.latest(name) is not None
    with pytest.raises(Exception, match="no job with id or name"):
        store.find(os.fsdecode(b"0123\xff"))  # not an id prefix, whatever its first bytes
