import pytest

from phalanx.core.spec import (
    EntrypointKind,
    Framework,
    Resources,
    Spawn,
    merge_args,
    parse_topology,
    has_template,
    render_template,
)
from phalanx.errors import UsageError
from phalanx.jobfile import RunOptions, build_spec


@pytest.mark.parametrize(
    "text,expected",
    [("4", Resources(1, 4, True)), ("2x4", Resources(2, 4, True)), ("2X1", Resources(2, 1, True)), (" 3 x 2 ", Resources(3, 2, True))],
)
def test_parse_topology(text, expected):
    assert parse_topology(text) == expected


@pytest.mark.parametrize("text", ["2y3", "", "x4", "2x", "0", "0x2", "-1", "a"])
def test_parse_topology_rejects(text):
    with pytest.raises(UsageError, match="-n"):
        parse_topology(text)


def test_merge_args_overrides_and_appends():
    base = ("--lr", "0.01", "--bs=32", "data")
    assert merge_args(base, ("--lr", "0.1", "--bs=64", "--new", "1", "--flag")) == (
        "--lr", "0.1", "--bs=64", "data", "--new", "1", "--flag",
    )


def test_render_template_leaves_other_braces():
    values = {k: i for i, k in enumerate(["node_rank", "num_nodes", "nproc_per_node", "master_addr",
                                          "master_port", "job_id", "state_dir", "output_dir"])}
    out = render_template(("--rank={node_rank}", "{master_addr}:{master_port}", '{"a": 1}', "{unknown}"), values)
    assert out == ("--rank=0", "3:4", '{"a": 1}', "{unknown}")


def test_render_template_escape_keeps_a_literal():
    values = dict.fromkeys(["node_rank", "num_nodes", "nproc_per_node", "master_addr", "master_port", "job_id",
                            "state_dir", "output_dir"], 7)
    out = render_template(("{{node_rank}}", "--fmt={{job_id}}-{job_id}", '{"a": {"b": 1}}', "{{x}}", "@NODE_ADDR_0@",
                           "~/x/{node_rank}"), values)
    assert out == ("{node_rank}", "--fmt={job_id}-7", '{"a": {"b": 1}}', "{{x}}", "@NODE_ADDR_0@", "~/x/7")
    assert has_template(("{{node_rank}}",)) and has_template(("a{master_port}",)) and not has_template(('{"a": 1}', "{x}"))


def test_build_spec_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    spec = build_spec(RunOptions(words=["train.py", "--lr", "0.01"], n="2x2"))
    assert spec.entrypoint.kind is EntrypointKind.SCRIPT
    assert spec.entrypoint.target == str(tmp_path / "train.py")
    assert spec.entrypoint.args == ("--lr", "0.01")
    assert spec.resources == Resources(2, 2, explicit=True)
    assert spec.entrypoint.typed == "train.py"
    assert spec.name == "train"
    assert spec.uses_torchrun


def test_build_spec_single_process_needs_no_torchrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert not build_spec(RunOptions(words=["t.py"])).uses_torchrun
    assert not build_spec(RunOptions(words=["t.py"], n="2x1", framework="jax")).uses_torchrun
    assert not build_spec(RunOptions(words=["t.py"], n="2x4", spawn="self")).uses_torchrun


def test_build_spec_command_and_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = build_spec(RunOptions(words=["bash", "-c", "echo $RANK"]))
    assert cmd.entrypoint.kind is EntrypointKind.COMMAND and cmd.entrypoint.args == ("-c", "echo $RANK")
    mod = build_spec(RunOptions(words=["--epochs", "3"], module="my_pkg.train"))
    assert mod.entrypoint.kind is EntrypointKind.MODULE and mod.name == "train"


@pytest.mark.parametrize(
    "opts,match",
    [
        (RunOptions(words=["missing.py"]), "script 'missing.py' not found"),
        (RunOptions(words=["no-such-command-xyz"]), "neither a Python script nor a command"),
        (RunOptions(words=[]), "nothing to run"),
        (RunOptions(words=["t.py"], n="2", nnodes=2), "-n and --nnodes"),
        (RunOptions(words=["t.py"], framework="mxnet"), "invalid framework 'mxnet'"),
        (RunOptions(words=["t.py"], spawn="never"), "invalid --spawn"),
        (RunOptions(words=["t.py"], env=["NOEQUALS"]), "invalid --env"),
        (RunOptions(words=["t.py"], nnodes=0), "at least 1"),
    ],
)
def test_build_spec_errors(tmp_path, monkeypatch, opts, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    with pytest.raises(UsageError, match=match):
        build_spec(opts)


def test_job_file_with_cli_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text(
        "name: resnet\nscript: train.py\nargs: [--lr, '0.01', --bs, '32']\nn: 2x2\nenv: {A: '1'}\ngrace: 7\n"
    )
    spec = build_spec(RunOptions(job_file="job.yaml", words=["--lr", "0.1"], env=["B=2"], n="1x2"))
    assert spec.name == "resnet"
    assert spec.entrypoint.args == ("--lr", "0.1", "--bs", "32")
    assert spec.resources == Resources(1, 2, explicit=True)
    assert dict(spec.env) == {"A": "1", "B": "2"}
    assert spec.grace == 7.0
    assert spec.framework is Framework.TORCH and spec.spawn is Spawn.AUTO


@pytest.mark.parametrize(
    "content,match",
    [("script: [unclosed\n", "not valid YAML"), ("- a\n- b\n", "must be a mapping"), ("scirpt: t.py\n", "unknown key")],
)
def test_bad_job_files(tmp_path, monkeypatch, content, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(content)
    with pytest.raises(UsageError, match=match):
        build_spec(RunOptions(job_file="job.yaml"))


def test_spec_round_trips_through_dict(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    spec = build_spec(RunOptions(words=["t.py", "--x", "1"], n="2x3", env=["K=V"], framework="tf"))
    from phalanx.core.spec import JobSpec

    assert JobSpec.from_dict(spec.to_dict()) == spec
