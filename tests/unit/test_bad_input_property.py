"""Property tests: job files with a value of the wrong type for any key, and random values for any
flag of ``phalanx run``, never end in a traceback; a refused input is one line and exit 2."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.core.optiontypes import BadValue, Bool, Checked, Choice, Custom, Float, Int, ListOf, MappingOf, Str
from phalanx.jobfile.values import all_options

from .test_bad_input import SCRIPT, cli

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# YAML values of every shape; each type below refuses some of them.
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                    st.text(max_size=12))
ANY = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                   max_leaves=6)
CONTAINERS = st.one_of(st.lists(SCALARS, min_size=1, max_size=3), st.dictionaries(st.text(min_size=1, max_size=5),
                                                                                  SCALARS, min_size=1, max_size=3))


def wrong_values(kind: object) -> st.SearchStrategy[object]:
    """Values that ``kind`` must refuse in a job file."""
    if isinstance(kind, Bool):
        return st.one_of(st.none(), st.text(max_size=8), st.integers(), st.floats(), CONTAINERS)
    if isinstance(kind, (Int, Float)):
        return st.one_of(st.none(), st.booleans(), CONTAINERS,
                         st.text(max_size=8).filter(lambda t: _refuses(kind, t)))
    if isinstance(kind, (Str, Custom, Choice)):
        return st.one_of(st.none(), CONTAINERS)
    if isinstance(kind, ListOf):
        return st.one_of(st.none(), st.booleans(), st.dictionaries(st.text(min_size=1, max_size=5), SCALARS, min_size=1))
    if isinstance(kind, Checked):  # a backend's own section (a mapping its validator checks)
        return st.one_of(st.booleans(), st.integers(), st.lists(SCALARS, min_size=1))
    if isinstance(kind, MappingOf):
        return st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.lists(SCALARS, min_size=1))
    raise AssertionError(kind)


def _refuses(kind: object, text: str) -> bool:
    try:
        kind.from_text(text)  # type: ignore[attr-defined]
    except BadValue:
        return True
    return False


FILE_OPTIONS = [o for o in all_options() if o.file_key and o.name not in ("script", "command", "module")]


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("PHALANX_DEBUG", raising=False)
    return tmp_path


@st.composite
def wrong_job_files(draw):
    option = draw(st.sampled_from(FILE_OPTIONS))
    value = draw(wrong_values(option.type))
    data: dict[str, object] = {"script": "t.py", "args": ["--x", "[1, 2]"]}
    section, _, key = option.file_key.rpartition(".")
    if section:
        data[section] = {key: value}
    else:
        data[key] = value
    return option.file_key, yaml.safe_dump(data)


def _check(code: int, err: str, accept_success: bool = False) -> None:
    assert "Traceback" not in err, err
    if accept_success and code == 0:
        assert all(line.startswith("phalanx: warning: ") for line in err.splitlines()), err
        return
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phalanx: error: "), err


@SETTINGS
@given(case=wrong_job_files())
def test_a_value_of_the_wrong_type_in_a_job_file_is_one_line(project, capsys, case):
    key, text = case
    (project / "job.yaml").write_text(text)
    code, _, err = cli(["run", "--dry-run", "-f", "job.yaml"], capsys)
    _check(code, err)
    assert key.split(".")[-1] in err or "job.yaml" in err


@SETTINGS
@given(data=st.data())
def test_any_yaml_anywhere_never_tracebacks(project, capsys, data):
    keys = [o.file_key for o in FILE_OPTIONS] + ["script", "args", "command", "module", "bogus"]
    job = data.draw(st.dictionaries(st.sampled_from(keys), ANY, max_size=4))
    (project / "job.yaml").write_text(yaml.safe_dump({"script": "t.py", **job}))
    code, _, err = cli(["run", "--dry-run", "-f", "job.yaml"], capsys)
    _check(code, err, accept_success=True)


VALUE_FLAGS = [o for o in all_options() if o.takes_value and o.name not in ("job_file",)]
TYPED_FLAGS = [o for o in VALUE_FLAGS if isinstance(o.type, (Int, Float, Choice, Custom)) or
               (isinstance(o.type, ListOf) and o.type.commas)]
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/"), max_size=16)


@SETTINGS
@given(data=st.data())
def test_a_refused_flag_value_is_one_line(project, capsys, data):
    option = data.draw(st.sampled_from(TYPED_FLAGS))
    value = data.draw(TEXT.filter(lambda t: _refuses(option.type, t)))
    code, _, err = cli(["run", "--dry-run", f"{option.flags[0]}={value}" if option.flags[0].startswith("--")
                        else option.flags[0], *([] if option.flags[0].startswith("--") else [value]), "t.py"], capsys)
    _check(code, err)


@SETTINGS
@given(data=st.data())
def test_random_flag_values_never_traceback(project, capsys, data):
    options = data.draw(st.lists(st.sampled_from(VALUE_FLAGS), min_size=1, max_size=3, unique_by=lambda o: o.name))
    argv = ["run", "--dry-run"]
    for option in options:
        argv += [option.flags[0], data.draw(TEXT)]
    code, _, err = cli([*argv, "t.py"], capsys)
    _check(code, err, accept_success=True)
