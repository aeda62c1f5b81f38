"""Exporters by name, each module (and its tool) imported only when a job tracks to it."""

from __future__ import annotations

from .base import Exporter


def make(kind: str) -> Exporter:
    """The exporter of ``kind``; its tool is imported only now."""
    if kind == "mlflow":
        from .mlflow import MlflowExporter

        return MlflowExporter()
    if kind == "tensorboard":
        from .tensorboard import TensorBoardExporter

        return TensorBoardExporter()
    if kind == "wandb":
        from .wandb import WandbExporter

        return WandbExporter()
    raise ValueError(f"unknown tracker {kind!r}")
