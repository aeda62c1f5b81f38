"""The MLflow exporter's calls through the ``mlflow`` package's own client, for tracking URIs that
are not a server (a directory, ``sqlite:///...``, ``databricks``): the same REST paths and bodies
``mlflow.Rest`` sends, mapped onto ``MlflowClient`` methods, so the exporter has one code path.
Needs ``phalanx[mlflow]``; imported only for such URIs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import TrackerRefused, TrackerUnavailable

_REFUSED = ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST")


class ClientApi:
    def __init__(self, uri: str, workdir: str) -> None:
        from mlflow.tracking import MlflowClient

        if uri and "://" not in uri and not uri.startswith("databricks") and not os.path.isabs(uri):
            uri = str(Path(workdir) / uri)  # a relative directory is the job's, as for its script
        self.client = MlflowClient(tracking_uri=uri or None)

    def call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
             raw: bytes | None = None) -> dict[str, Any]:
        from mlflow.exceptions import MlflowException

        try:
            return self._call(path, body or {}, query or {})
        except MlflowException as exc:
            code = str(getattr(exc, "error_code", ""))
            if code in _REFUSED:
                raise TrackerRefused(f"MLflow refused: {exc.message}"[:300], code) from None
            raise TrackerUnavailable(f"MLflow: {exc.message}"[:300]) from None
        except OSError as exc:
            raise TrackerUnavailable(f"MLflow: {exc}"[:300]) from None

    def _call(self, path: str, body: dict[str, Any], query: dict[str, str]) -> dict[str, Any]:
        from mlflow.entities import Metric, Param, RunTag

        c = self.client
        name = path.rsplit("/mlflow/", 1)[-1]
        if name == "experiments/get-by-name":
            found = c.get_experiment_by_name(query["experiment_name"])
            if found is None:
                raise TrackerRefused("no such experiment", "RESOURCE_DOES_NOT_EXIST")
            return {"experiment": {"experiment_id": found.experiment_id}}
        if name == "experiments/create":
            return {"experiment_id": c.create_experiment(body["name"])}
        if name == "runs/create":
            tags = {t["key"]: t["value"] for t in body.get("tags", ())}
            run = c.create_run(body["experiment_id"], start_time=body.get("start_time"), tags=tags,
                               run_name=body.get("run_name"))
            return {"run": {"info": {"run_id": run.info.run_id, "artifact_uri": run.info.artifact_uri}}}
        if name == "runs/update":
            if body.get("end_time"):
                c.set_terminated(body["run_id"], body["status"], end_time=body["end_time"])
            else:
                c.update_run(body["run_id"], status=body["status"])
            return {}
        if name == "runs/log-batch":
            c.log_batch(body["run_id"],
                        metrics=[Metric(m["key"], m["value"], m["timestamp"], m["step"]) for m in body.get("metrics", ())],
                        params=[Param(p["key"], p["value"]) for p in body.get("params", ())],
                        tags=[RunTag(t["key"], t["value"]) for t in body.get("tags", ())])
            return {}
        raise TrackerRefused(f"no client mapping for {path}", "BAD_REQUEST")

    def log_artifacts(self, run_id: str, files: Sequence[tuple[Path, str]]) -> None:
        for path, name in files:
            folder = os.path.dirname(name)
            self.client.log_artifact(run_id, str(path), folder or None)

    def close(self) -> None:
        pass
