"""The automatic pick-up takes what looks like a metric from what popular trainers really print,
and nothing else: not logging prefixes, progress-bar labels, configuration dumps, nor the counters
of launchers (issue 21)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.core.paths import JobPaths
from phalanx.monitor.autometrics import DEFAULT_IGNORED, IGNORED, Ignored, names_in
from phalanx.monitor.metrics import MetricsCollector, read_metrics

DATA = Path(__file__).parent / "data"

# The HF Trainer's output at log level info (transformers 4.4x, examples/pytorch/language-modeling/
# run_clm.py): its logging prefix, a model configuration, tokenizer progress bars, the training
# banner, the dicts Trainer.log prints, a checkpoint save and the final metrics block.
HF_TRAINER = """\
[INFO|configuration_utils.py:733] 2024-06-12 09:41:02,118 >> loading configuration file config.json from cache
[INFO|configuration_utils.py:796] 2024-06-12 09:41:02,120 >> Model config GPT2Config {
  "activation_function": "gelu_new",
  "attn_pdrop": 0.1,
  "n_embd": 768,
  "n_head": 12,
  "vocab_size": 50257
}
[INFO|modeling_utils.py:3474] 2024-06-12 09:41:02,500 >> loading weights file model.safetensors from cache
Running tokenizer on dataset: 100%|██████████| 4358/4358 [00:00<00:00, 9876.54 examples/s]
Grouping texts in chunks of 1024: 100%|██████████| 4358/4358 [00:00<00:00, 12345.67 examples/s]
[INFO|trainer.py:2078] 2024-06-12 09:41:05,001 >> ***** Running training *****
[INFO|trainer.py:2079] 2024-06-12 09:41:05,001 >>   Num examples = 2,318
[INFO|trainer.py:2080] 2024-06-12 09:41:05,001 >>   Num Epochs = 3
[INFO|trainer.py:2081] 2024-06-12 09:41:05,001 >>   Instantaneous batch size per device = 8
[INFO|trainer.py:2085] 2024-06-12 09:41:05,001 >>   Gradient Accumulation steps = 1
[INFO|trainer.py:2086] 2024-06-12 09:41:05,001 >>   Total optimization steps = 870
[INFO|trainer.py:2087] 2024-06-12 09:41:05,002 >>   Number of trainable parameters = 124,439,808
  0%|          | 0/870 [00:00<?, ?it/s]
{'loss': 3.4012, 'grad_norm': 2.8712, 'learning_rate': 4.4252873563218394e-05, 'epoch': 0.34}
 33%|███▎      | 290/870 [01:10<02:21,  4.10it/s]
[INFO|trainer.py:3719] 2024-06-12 09:42:15,400 >> ***** Running Evaluation *****
[INFO|trainer.py:3721] 2024-06-12 09:42:15,400 >>   Num examples = 240
[INFO|trainer.py:3724] 2024-06-12 09:42:15,400 >>   Batch size = 8
{'eval_loss': 3.1254, 'eval_accuracy': 0.4172, 'eval_runtime': 2.31, 'eval_samples_per_second': 103.9, 'eval_steps_per_second': 12.99, 'epoch': 1.0}
[INFO|trainer.py:3410] 2024-06-12 09:42:17,800 >> Saving model checkpoint to out/checkpoint-290
[INFO|modeling_utils.py:2590] 2024-06-12 09:42:18,900 >> Model weights saved in out/checkpoint-290/model.safetensors
Writing model shards: 100%|██████████| 1/1 [00:00<00:00,  2.51it/s]
{'train_runtime': 212.4, 'train_samples_per_second': 32.74, 'train_steps_per_second': 4.096, 'train_loss': 3.2101, 'epoch': 3.0}
***** train metrics *****
  epoch                    =        3.0
  total_flos               =  1061623GF
  train_loss               =     3.2101
  train_runtime            = 0:03:32.40
  train_samples_per_second =     32.74
"""
HF_METRICS = {"loss", "grad_norm", "learning_rate", "eval_loss", "eval_accuracy", "eval_runtime",
              "eval_samples_per_second", "eval_steps_per_second", "train_runtime", "train_samples_per_second",
              "train_steps_per_second", "train_loss"}

# Lightning's TQDM progress bar (without rich), which shows its logger's version as v_num.
LIGHTNING_TQDM = "Epoch 1: 100%|██████████| 8/8 [00:00<00:00, 90.12it/s, v_num=0, train_loss=0.858, val_loss=0.674]\n"


def _picked(tmp_path: Path, text: str, ignored: Ignored = DEFAULT_IGNORED) -> dict[str, list[float]]:
    paths = JobPaths(tmp_path / "job")
    log = paths.rank_log(0, 0)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text)
    MetricsCollector(paths, 0, ignored=ignored).stop()
    found: dict[str, list[float]] = {}
    for record in read_metrics(paths):
        found.setdefault(record["name"], []).append(record["value"])
    return found


def test_hf_trainer_output_gives_its_metrics_and_no_junk(tmp_path):
    found = _picked(tmp_path, HF_TRAINER)
    assert set(found) == HF_METRICS
    assert found["learning_rate"] == [4.4252873563218394e-05] and found["eval_loss"] == [3.1254]


def test_lightning_output_gives_its_metrics_and_no_junk(tmp_path):
    """A real run's output (lightning 2.6, its rich progress bar and model summary), then its TQDM bar."""
    recorded = (DATA / "lightning_2.6_fit.log").read_text()
    assert "Trainable params: 5" in recorded and "using: 0 TPU cores" in recorded
    assert set(_picked(tmp_path, recorded)) == {"train_loss", "val_loss"}
    assert set(_picked(tmp_path / "tqdm", LIGHTNING_TQDM)) == {"train_loss", "val_loss"}


@pytest.mark.parametrize("line, names", [
    ("attempt=1 restart=0 allreduce=3 rank=1 loss=0.2", ["loss"]),  # launchers' counters, identities
    ("[INFO|trainer.py:4115] 2024-05-01 12:00:00,000 >> loss: 0.3", ["loss"]),
    ("Loading checkpoint shards: 100%|██████████| 2/2", []),
    ("Map: 45%|████▌     | 450/1000", []),
    ("acc: 95% loss: 0.1", ["acc", "loss"]),  # a percentage a script prints is a value
    ("epoch 3 loss: 0.5 val loss: 0.4", ["loss"]),  # "val loss" is a label, never a second "loss"
    ("| train/loss: 0.25 | val.acc=0.9 |", ["train/loss", "val.acc"]),
    ('  "hidden_size": 768,', []),
    ('{"loss": 0.3, "acc": 0.9}', ["loss", "acc"]),
])
def test_what_looks_like_a_metric(line, names):
    assert names_in(line) == names


def test_the_ignore_list_is_a_setting(tmp_path):
    assert "v_num" in IGNORED and "attempt" in IGNORED and "allreduce" in IGNORED
    line = "{'loss': 3.4, 'grad_norm': 2.8, 'learning_rate': 4e-05, 'eval_loss': 3.1, 'v_num': 0}"
    assert names_in(line) == ["loss", "grad_norm", "learning_rate", "eval_loss"]
    assert names_in(line, Ignored.from_setting("+grad_norm,EVAL_*")) == ["loss", "learning_rate"]
    assert names_in(line, Ignored.from_setting("loss")) == ["grad_norm", "learning_rate", "eval_loss", "v_num"]
    assert Ignored.from_setting("") is DEFAULT_IGNORED and Ignored.from_setting(None) is DEFAULT_IGNORED
    found = _picked(tmp_path, "loss=0.5 grad_norm=2.0\n", Ignored.from_setting("+grad_norm"))
    assert set(found) == {"loss"}
