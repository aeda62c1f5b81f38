"""The k8s options and the job file's kubernetes: section, checked without a cluster: one line
naming the file, line and key, and the fix."""

from __future__ import annotations

import pytest

from phalanx.backends.kubernetes import options
from phalanx.errors import UsageError
from tests.conftest import phalanx

GOOD_IMAGES = [
    "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "python", "python:3.11-slim", "localhost:5000/ml/train",
    "registry.example.com:5000/team/train:v3", "nvcr.io/nvidia/pytorch:25.08-py3",
    "ghcr.io/org/img@sha256:" + "a" * 64, "[::1]:5000/img:tag",
]
BAD_IMAGES = ["", "PyTorch", "pytorch/PyTorch", "pytorch/pytorch:", "image:tag:tag", "a//b", "img@sha256:short", "-img", "img:ta g"]


@pytest.mark.parametrize("image", GOOD_IMAGES)
def test_k8s_image_references_that_parse(image):
    assert options.image_problem(image) is None


def _validated(opts):
    from phalanx.backends.options import validate

    return validate("k8s", options.OPTIONS, opts)


@pytest.mark.parametrize("image", BAD_IMAGES)
def test_k8s_image_references_that_do_not(image):
    assert options.image_problem(image)
    with pytest.raises(UsageError, match="invalid --image"):
        _validated({"image": image})


def test_k8s_unknown_kind_lists_the_known_ones():
    with pytest.raises(UsageError, match="invalid --k8s-kind 'mpijob'") as err:
        _validated({"k8s_kind": "mpijob", "image": "python"})
    assert "job, pytorchjob, trainjob, jobset" in err.value.hint


@pytest.mark.parametrize("opts, message", [
    ({"namespace": "Team_A"}, "invalid --namespace"),
    ({"queue": "x" * 64}, "invalid --queue"),
    ({"pending_timeout": 0}, "invalid --pending-timeout"),
    ({"gpus_per_node": -1}, "invalid --gpus-per-node"),
    ({"code_uri": "bucket/prefix"}, "invalid --code-uri"),
    ({"memory": "lots"}, "invalid --memory"),
    ({"memory": "-1Gi"}, "invalid --memory"),
    ({"memory": "0"}, "invalid --memory"),
])
def test_k8s_option_values_are_checked(opts, message):
    with pytest.raises(UsageError, match=message):
        _validated({"image": "python", **opts})


def test_k8s_good_values_are_kept():
    opts = _validated({"namespace": "team-a", "queue": "q1", "memory": "64Gi", "code_uri": "s3://b/p", "k8s_kind": "jobset"})
    assert (opts["namespace"], opts["queue"], opts["memory"], opts["code_uri"], opts["k8s_kind"]) == (
        "team-a", "q1", "64Gi", "s3://b/p", "jobset")
    assert opts["image"] == options.DEFAULT_IMAGE


SECTION = """\
name: train
script: train.py
backend: k8s
kubernetes:
  node_selector: {pool: gpu}
  tolerations:
  - key: nvidia.com/gpu
    operator: Exists
    effect: NoSchedule
  volumes:
  - name: data
    mountPath: /data
    persistentVolumeClaim: {claimName: data}
  env: {HF_HOME: /data/hf}
"""


def _section_node(path):
    from phalanx.jobfile.values import load_job_file

    return load_job_file(str(path)).node("kubernetes")


def test_k8s_section_is_normalised(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(SECTION)
    section = options.check_section(_section_node(path))
    assert section["env"] == [{"name": "HF_HOME", "value": "/data/hf"}]
    assert section["volumes"][0]["persistentVolumeClaim"] == {"claimName": "data"}


@pytest.mark.parametrize("old, new, line, message", [
    ("    effect: NoSchedule", "    effect: NoScheduel", 9, r"kubernetes\.tolerations\[0\]\.effect: 'NoScheduel' is not a taint effect"),
    ("  node_selector: {pool: gpu}", "  node_selecter: {pool: gpu}", 5, r"kubernetes\.node_selecter: unknown key"),
    ("    mountPath: /data", "    mountPath: /phx/data", 12, r"kubernetes\.volumes\[0\]\.mountPath: '/phx/data' overlaps"),
    ("  - name: data", "  - name: dshm", 11, r"kubernetes\.volumes\[0\]\.name: 'dshm' is taken"),
    ("  env: {HF_HOME: /data/hf}", "  env: {PYTHONPATH: /x}", 14, r"kubernetes\.env\.PYTHONPATH: PYTHONPATH is phalanx's"),
    ("    persistentVolumeClaim: {claimName: data}", "    persistentVolumeClaim: {claimName: data}\n    nfs: {server: x, path: /}",
     11, r"kubernetes\.volumes\[0\]: needs exactly one volume source"),
])
def test_k8s_section_errors_name_file_line_and_key(tmp_path, old, new, line, message):
    text = SECTION.replace(old, new)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as err:
        options.check_section(_section_node(path))
    assert err.value.line == line, str(err.value)
    from phalanx.jobfile import RunOptions, build_spec

    with pytest.raises(UsageError) as through:  # the job file's reader puts the file and that line in front
        build_spec(RunOptions(job_file=str(path)))
    assert str(through.value).startswith(f"{path}:{line}: kubernetes."), str(through.value)


def test_k8s_section_error_through_the_cli_is_one_line_exit_2(tmp_path, phx_home):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text(SECTION.replace("operator: Exists", "operator: Exist"))
    proc = phalanx("run", "--dry-run", "-f", str(tmp_path / "job.yaml"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"phalanx: error: {tmp_path / 'job.yaml'}:8: kubernetes.tolerations[0].operator: "
                                  "'Exist' is not Equal or Exists"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_k8s_section_is_refused_on_other_backends(tmp_path, phx_home):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text(SECTION.replace("backend: k8s", "backend: local"))
    proc = phalanx("run", "--dry-run", "-f", str(tmp_path / "job.yaml"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"phalanx: error: {tmp_path / 'job.yaml'}:5: kubernetes is an option of the k8s backend, not of local; "
        "add --backend k8s, or drop it"), proc.stderr


def test_k8s_unknown_kind_on_the_cli_is_one_line_exit_2(tmp_path, phx_home):
    (tmp_path / "train.py").write_text("print('hi')\n")
    proc = phalanx("run", "--backend", "k8s", "--k8s-kind", "mpijob", "--dry-run", "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "phalanx: error: invalid --k8s-kind 'mpijob'; use one of job, pytorchjob, trainjob, jobset"), proc.stderr


def test_k8s_every_option_is_a_flag_and_documented():
    from pathlib import Path

    from typer.testing import CliRunner

    from phalanx.cli.main import app

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "kubernetes.md").read_text()
    helptext = " ".join(CliRunner().invoke(app, ["run", "--help-all"], terminal_width=200).output.split())
    for option in options.OPTIONS:
        if option.name == "pod":  # the job file's section (or backend_options.pod), not a flag
            assert "kubernetes:" in page
            continue
        assert option.flag in helptext, f"{option.flag} is not a flag of phalanx run"
        assert f"`{option.flag}" in page and f"`{option.name}`" in page, f"document {option.flag} in docs/kubernetes.md"
    for key in options.SECTION_KEYS:
        assert f"  {key}:" in page, f"show kubernetes.{key} in docs/kubernetes.md"


def test_k8s_help_imports_only_the_options_module():
    import subprocess
    import sys

    probe = ("import sys\nfrom typer.testing import CliRunner\nfrom phalanx.cli.main import app\n"
             "CliRunner().invoke(app, ['--help']); CliRunner().invoke(app, ['run', '--help-all'])\n"
             "print(sorted(m for m in sys.modules if 'kubernetes' in m or m.split('.')[0] in ('yaml', 'jsonschema', 'fsspec')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "['phalanx.backends.kubernetes', 'phalanx.backends.kubernetes.options']", out
