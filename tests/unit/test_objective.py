"""A sweep's --objective must be a metric the job declares or one the script prints as a metric,
matched as a whole name: `loss` is refused for a script that prints `val_loss` (and has a
variable `loss`), a typo is refused with the name it meant (issue 21)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from phalanx.jobfile.objective import printed

VAL_LOSS = """
import argparse
p = argparse.ArgumentParser(); p.add_argument("--lr", type=float); a = p.parse_args()
loss = 1.0 / a.lr
for step in range(3):
    print(f"step={step} val_loss={loss / (step + 1):.3f}", flush=True)
"""


def _dry_run(tmp_path: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "t.py").write_text(source)
    return subprocess.run([sys.executable, "-m", "phalanx", "run", "--dry-run", *options, "t.py", "--lr", "[0.1, 0.2]"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PHALANX_HOME": str(tmp_path / "home")})


@pytest.mark.parametrize("objective, said", [
    ("loss", "nothing in t.py prints it as a metric, so no trial would report it (t.py prints val_loss); "
             "did you mean --objective val_loss?"),
    ("val_los", "did you mean --objective val_loss?"),
])
def test_an_objective_the_script_never_prints_is_refused(tmp_path, objective, said):
    refused = _dry_run(tmp_path, VAL_LOSS, "--objective", f"{objective}:min")
    assert refused.returncode == 2, refused.stdout
    assert refused.stderr.startswith(f"phalanx: error: --objective '{objective}': ") and said in refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "Traceback" not in refused.stderr


def test_a_printed_or_declared_objective_is_taken(tmp_path):
    assert _dry_run(tmp_path, VAL_LOSS, "--objective", "val_loss:min").returncode == 0
    declared = _dry_run(tmp_path, VAL_LOSS, "--objective", "loss:min", "--metric", r"loss=loss is (\S+)")
    assert declared.returncode == 0, declared.stderr


@pytest.mark.parametrize("source, names", [
    ('print(f"epoch={e} loss={l:.3f} acc: {a}")', {"loss", "acc"}),
    ('print(f"{val_loss=}")', {"val_loss"}),  # Python's self-documenting f-string prints val_loss=0.5
    ('print("loss=%.4f top1: %s" % (l, t))', {"loss", "top1"}),
    ('print("loss={:.3f}".format(l))', {"loss"}),
    ('print("val_acc:", acc)', {"val_acc"}),
    ('print({"eval_bleu": b})', {"eval_bleu"}),  # a printed dict, as the HF Trainer logs
    ('self.log("val_loss", loss, prog_bar=True)', {"val_loss"}),  # Lightning's progress bar shows val_loss=...
    ('print(dict(wer=w))', {"wer"}),
    ('print(f"Validation loss: {v}")', set()),  # a label of several words is no metric name, printed or read
    ('print(f"[rank={r}] attempt={a} loss={l}")', {"loss"}),  # identities and counters are not metrics
    ("loss = criterion(out, y)\nprint('done')", set()),  # a variable is not something printed
    ('torch.save({"model": m.state_dict(), "optimizer": o}, p)\nprint(f"loss={l}")', {"loss"}),  # a checkpoint's keys
])
def test_names_the_script_can_print(source, names):
    found, _ = printed(textwrap.dedent(source))
    assert found == names


def test_the_hf_trainers_own_metrics_count_when_the_script_uses_it(tmp_path):
    hf = ("import transformers\n"
          "def compute_metrics(p):\n    return {'accuracy': 0.5}\n"
          "import argparse\np = argparse.ArgumentParser(); p.add_argument('--lr'); p.parse_args()\n")
    for objective in ("eval_loss", "eval_accuracy", "train_loss", "loss"):
        taken = _dry_run(tmp_path, hf, "--objective", f"{objective}:min")
        assert taken.returncode == 0, (objective, taken.stderr)
    assert _dry_run(tmp_path, hf, "--objective", "eval_acuracy:max").returncode == 2


def test_modules_the_script_imports_count_and_the_projects_other_files_do_not(tmp_path):
    """Run from a project's root: what the script's own modules print counts (here through a relative
    import in a package under src/), what its tests print does not (they may print any name)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(
        "import argparse\nfrom mypkg import loop\n"
        "p = argparse.ArgumentParser(); p.add_argument('--lr'); p.parse_args()\nloop.run()\n")
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "mypkg" / "loop.py").write_text("from .report import show\ndef run():\n    show(0.5)\n")
    (tmp_path / "src" / "mypkg" / "report.py").write_text("def show(a):\n    print(f'val_acc={a}')\n")
    (tmp_path / "tests" / "test_train.py").write_text("print('val_loss=0.1')\n")

    def dry(objective: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "phalanx", "run", "--dry-run", "--objective", objective,
                               "scripts/train.py", "--lr", "[0.1, 0.2]"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PHALANX_HOME": str(tmp_path / "home")})

    taken = dry("val_acc:max")
    assert taken.returncode == 0, taken.stderr
    refused = dry("val_loss:min")
    assert refused.returncode == 2 and "(they print val_acc)" in refused.stderr, refused.stderr
