"""Where things are: the training container's ``/opt/ml`` tree and a job's S3 prefixes. Pure.

In the container (the contract of "How Amazon SageMaker Provides Training Information" and
"How Amazon SageMaker Processes Training Output" in the SageMaker developer guide):

    /opt/ml/input/config/resourceconfig.json   hosts algo-1..N, the current host, the network interface
    /opt/ml/input/data/<channel>/               each input channel (File mode: copied before start)
    /opt/ml/input/data/phalanx/                 phalanx's own channel: bundle.tar.gz + launch.json
    /opt/ml/checkpoints/                        synced with CheckpointConfig.S3Uri: PHALANX_STATE_DIR
    /opt/ml/model/                              -> model.tar.gz: PHALANX_OUTPUT_DIR, SM_MODEL_DIR
    /opt/ml/output/data/                        -> output.tar.gz: SM_OUTPUT_DATA_DIR
    /opt/ml/output/failure                      the failure reason SageMaker reports (first 1024 chars)
    /opt/ml/phalanx/{code,lib}/                 the unpacked bundle: the job's code and phalanx
    /opt/ml/phalanx/job/                        the job directory of the attempt on this instance

Under ``--s3-prefix`` (``s3://bucket/prefix``):

    jobs/<job id>/a<attempt>/phalanx/           the phalanx channel of one attempt
    jobs/<job id>/output/                       OutputDataConfig: <training job>/output/{model,output}.tar.gz
    channels/<digest>/  channels/<digest>.json  a local input, uploaded once per content; .json written last
    state/<job name>/                           CheckpointConfig, unless --state names an s3:// URI
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.paths import safe_name

ML = "/opt/ml"
RESOURCE_CONFIG = f"{ML}/input/config/resourceconfig.json"
DATA = f"{ML}/input/data"
CHECKPOINTS = f"{ML}/checkpoints"
MODEL = f"{ML}/model"
OUTPUT_DATA = f"{ML}/output/data"
FAILURE = f"{ML}/output/failure"
UNPACKED = f"{ML}/phalanx"
CODE = f"{UNPACKED}/code"
LIB = f"{UNPACKED}/lib"
JOB_DIR = f"{UNPACKED}/job"

CHANNEL = "phalanx"  # phalanx's own input channel; a user's channel may not take this name
BUNDLE = "bundle.tar.gz"
LAUNCH = "launch.json"
RDZV_PORT = 7777  # the port SageMaker's own training toolkit gives torchrun (hosts are the job's alone)
LOG_GROUP = "/aws/sagemaker/TrainingJobs"

# Tests run many "instances" on one machine: each gets its own root, and every /opt/ml path
# above is read below it. Unset on SageMaker.
ROOT_ENV = "PHALANX_SM_ROOT"

# The container's command: unpack the bundle, then run the in-container entry. Every argument of
# ContainerArguments may hold at most 256 characters (the service model), so it stays this short.
ENTRYPOINT = ("/bin/bash", "-c")
COMMAND = (
    f'R="${{{ROOT_ENV}:-}}";mkdir -p "$R{UNPACKED}"&&tar -xzf "$R{DATA}/{CHANNEL}/{BUNDLE}" -C "$R{UNPACKED}"'
    f'&&PYTHONPATH="$R{LIB}" exec python3 -m phalanx.backends.sagemaker.entry'
)


def training_job_name(job_id: str, attempt: int) -> str:
    """One training job per attempt: SageMaker names are unique per account and region."""
    return f"phx-{job_id}-a{attempt}"


def channel_dir(name: str) -> str:
    return f"{DATA}/{name}"


@dataclass(frozen=True)
class JobS3:
    """A job's S3 prefixes under ``--s3-prefix``."""

    prefix: str  # s3://bucket/prefix, no trailing slash
    job_id: str

    @property
    def bucket(self) -> str:
        return self.prefix[len("s3://"):].split("/", 1)[0]

    def code(self, attempt: int) -> str:
        return f"{self.prefix}/jobs/{self.job_id}/a{attempt}/{CHANNEL}/"

    @property
    def output(self) -> str:
        return f"{self.prefix}/jobs/{self.job_id}/output"

    def artifacts(self, training_job: str) -> tuple[str, str]:
        """Where SageMaker puts the model and output archives of ``training_job``."""
        return (f"{self.output}/{training_job}/output/model.tar.gz", f"{self.output}/{training_job}/output/output.tar.gz")

    def channel(self, digest: str) -> str:
        return f"{self.prefix}/channels/{digest}/"

    def channel_marker(self, digest: str) -> str:
        return f"{self.prefix}/channels/{digest}.json"

    def state(self, job_name: str) -> str:
        return f"{self.prefix}/state/{safe_name(job_name)}/"


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key)."""
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def log_stream_prefix(training_job: str) -> str:
    """CloudWatch streams of a training job: ``<job>/algo-<n>-<epoch seconds>``, one per instance start."""
    return f"{training_job}/"


def host_of_stream(training_job: str, stream: str) -> int | None:
    """The node rank (``algo-<n>`` is node n-1) a log stream belongs to; None for other streams."""
    rest = stream[len(training_job) + 1:] if stream.startswith(training_job + "/") else ""
    if not rest.startswith("algo-"):
        return None
    number = rest[len("algo-"):].split("-", 1)[0]
    return int(number) - 1 if number.isdigit() and int(number) >= 1 else None
