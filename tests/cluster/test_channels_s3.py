"""Data in, results out, against a real S3-compatible server (moto_server on 127.0.0.1):
input channels, caching, extraction, outputs, chaining, --skip-if-done, download, and
transfers cut off mid-way by a proxy that drops the connection."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import phalanx

pytestmark = pytest.mark.cluster

SHOW_INPUTS = """
import json, os, pathlib
def tree(p):
    p = pathlib.Path(p)
    return {str(f.relative_to(p)): f.read_text() for f in sorted(p.rglob("*")) if f.is_file()} if p.is_dir() else p.read_text()
names = json.loads(os.environ["SM_CHANNELS"])
print("INPUTS " + json.dumps({n: {"path": os.environ["PHALANX_CHANNEL_" + n.upper()],
                                   "sm": os.environ["SM_CHANNEL_" + n.upper()],
                                   "files": tree(os.environ["PHALANX_CHANNEL_" + n.upper()])} for n in names}))
"""

WRITE_OUTPUT = """
import os, pathlib, sys
out = pathlib.Path(os.environ["PHALANX_OUTPUT_DIR"])
assert os.environ["SM_MODEL_DIR"] == str(out)
(out / "model.bin").write_bytes(os.urandom(int(os.environ.get("SIZE", "3000"))))
(out / "eval" ).mkdir()
(out / "eval" / "metrics.json").write_text('{"acc": 0.9}')
print("wrote outputs", flush=True)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture
def s3(s3_env):
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


@pytest.fixture
def proj(tmp_path):
    """The working directory of the jobs (snapshotted): only the scripts, nothing the test changes."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "show.py").write_text(SHOW_INPUTS)
    (d / "write.py").write_text(WRITE_OUTPUT)
    return d


def _inputs(proc) -> dict:
    line = next(l for l in proc.stdout.splitlines() if l.startswith("INPUTS "))
    return json.loads(line[len("INPUTS "):])


def test_channels_from_s3_and_local_are_staged_and_cached(phx_home, s3_env, s3, proj, tmp_path):
    s3.pipe_file(f"{s3_env}/imagenet/train/a.txt", b"A")
    s3.pipe_file(f"{s3_env}/imagenet/train/sub/b.txt", b"B")
    s3.pipe_file(f"{s3_env}/labels.csv", b"x,y\n")
    local = tmp_path / "val"
    local.mkdir()
    (local / "v.txt").write_text("V")
    args = ["run", "--input", f"train=s3://{s3_env}/imagenet/train", "--input", f"labels=s3://{s3_env}/labels.csv",
            "--input", f"val={local}", "show.py"]
    first = phalanx(*args, cwd=proj, check=True)
    seen = _inputs(first)
    assert seen["train"]["files"] == {"a.txt": "A", "sub/b.txt": "B"}
    assert seen["train"]["path"] == seen["train"]["sm"] and seen["train"]["path"].startswith(str(phx_home / "cache" / "channels"))
    assert seen["labels"]["files"] == {"labels.csv": "x,y\n"}  # a single object: one file in the directory
    assert seen["val"]["path"] == str(local)  # a local path is used in place
    assert "input train: 2 file(s)" in first.stderr

    second = phalanx(*args, cwd=proj, check=True)
    assert "input train: 2 file(s) unchanged since the last download (cache)" in second.stderr
    s3.pipe_file(f"{s3_env}/imagenet/train/a.txt", b"AA")  # changed
    s3.rm(f"{s3_env}/imagenet/train/sub/b.txt")  # gone at the source
    third = phalanx(*args, cwd=proj, check=True)
    assert _inputs(third)["train"]["files"] == {"a.txt": "AA"}
    assert "input train: 1 file(s), 2 B from" in third.stderr
    assert not list((phx_home / "cache" / "channels").glob("*.partial"))


def test_archive_on_s3_is_extracted_on_arrival(phx_home, s3_env, s3, proj):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in {"val/0.txt": b"zero", "val/1.txt": b"one"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    s3.pipe_file(f"{s3_env}/val.tar.gz", buf.getvalue())
    args = ["run", "--input", f"val=s3://{s3_env}/val.tar.gz#extract", "show.py"]
    out = phalanx(*args, cwd=proj, check=True)
    assert _inputs(out)["val"]["files"] == {"val/0.txt": "zero", "val/1.txt": "one"}
    assert "unchanged since it was last extracted" in phalanx(*args, cwd=proj, check=True).stderr


def test_outputs_and_logs_are_uploaded_listed_and_downloaded(phx_home, s3_env, s3, proj, tmp_path):
    out = phalanx("run", "--name", "train", "--output", f"s3://{s3_env}/runs/", "write.py", cwd=proj, check=True)
    job = json.loads(phalanx("status", "train", "--json", check=True).stdout)
    prefix = f"{s3_env}/runs/train-{job['id']}"
    assert f"uploaded to s3://{prefix}" in out.stderr
    manifest = json.loads(s3.cat(f"{prefix}/_phalanx_artifacts.json"))
    assert set(manifest["output"]) == {"model.bin", "eval/metrics.json"}
    assert s3.cat(f"{prefix}/output/eval/metrics.json") == b'{"acc": 0.9}'
    assert "wrote outputs" in s3.cat(f"{prefix}/logs/attempt_0/rank_0/output.log").decode()

    listed = json.loads(phalanx("artifacts", "train", "--json", check=True).stdout)
    assert listed["uploaded"] and listed["location"] == f"s3://{prefix}/output"
    assert {f["path"]: f["size"] for f in listed["files"]} == {"eval/metrics.json": 12, "model.bin": 3000}
    assert "model.bin" in phalanx("artifacts", "train", check=True).stdout

    dest = tmp_path / "here"
    phalanx("download", "train", "-o", str(dest), "--logs", check=True)
    local_out = Path(job["job_dir"]) / "output"
    assert (dest / "output" / "model.bin").read_bytes() == (local_out / "model.bin").read_bytes()
    assert "wrote outputs" in (dest / "logs" / "attempt_0" / "rank_0" / "output.log").read_text()

    # Integrity: a copy that differs from what was uploaded is refused, and nothing half-done is left.
    s3.pipe_file(f"{prefix}/output/model.bin", os.urandom(3000))
    bad = phalanx("download", "train", "-o", str(tmp_path / "bad"))
    assert bad.returncode == 1 and "different sha256" in bad.stderr
    assert not (tmp_path / "bad" / "output" / "model.bin").exists()


def test_failed_job_uploads_what_it_has(phx_home, s3_env, s3, proj):
    proc = phalanx("run", "--name", "crash", "--output", f"s3://{s3_env}/runs", "write.py", cwd=proj, env={"EXIT": "3"})
    assert proc.returncode == 3
    job = json.loads(phalanx("status", "crash", "--json", check=True).stdout)
    assert job["state"] == "FAILED"
    prefix = f"{s3_env}/runs/crash-{job['id']}"
    assert s3.exists(f"{prefix}/output/model.bin") and s3.exists(f"{prefix}/_phalanx_artifacts.json")


def test_chaining_and_skip_if_done(phx_home, s3_env, s3, proj):
    (proj / "prep.py").write_text(
        "import os, pathlib\n"
        "raw = pathlib.Path(os.environ['PHALANX_CHANNEL_RAW'], 'raw.txt').read_text()\n"
        "pathlib.Path(os.environ['PHALANX_OUTPUT_DIR'], 'clean.txt').write_text(raw.upper())\n"
        "pathlib.Path(os.environ['PHALANX_STATE_DIR'], 'seen.txt').write_text('prep state')\n"
        "print('prep ran', flush=True)\n"
    )
    s3.pipe_file(f"{s3_env}/raw/raw.txt", b"hello")
    prep = ["run", "--name", "prep", "--skip-if-done", "--input", f"raw=s3://{s3_env}/raw", "--output", f"s3://{s3_env}/prep", "prep.py"]
    first = phalanx(*prep, cwd=proj, check=True)
    assert "prep ran" in first.stdout
    first_id = json.loads(phalanx("status", "prep", "--json", check=True).stdout)["id"]

    again = phalanx(*prep, cwd=proj, check=True)
    assert "prep ran" not in again.stdout and f"skipped: job {first_id}" in again.stderr
    detached = phalanx(*prep[:1], "-d", *prep[1:], cwd=proj, check=True)
    assert detached.stdout.strip() == first_id

    train = phalanx("run", "--input", "data=job:prep", "--input", "st=job:prep/state", "show.py", cwd=proj, check=True)
    seen = _inputs(train)
    assert seen["data"]["files"] == {"clean.txt": "HELLO"} and seen["st"]["files"] == {"seen.txt": "prep state"}

    s3.pipe_file(f"{s3_env}/raw/raw.txt", b"changed")  # new input data: the step runs again
    rerun = phalanx(*prep, cwd=proj, check=True)
    assert "prep ran" in rerun.stdout
    train = phalanx("run", "--input", "data=job:prep", "show.py", cwd=proj, check=True)
    assert _inputs(train)["data"]["files"] == {"clean.txt": "CHANGED"}


class CuttingProxy:
    """A TCP proxy to the S3 server that resets the first ``cuts`` connections carrying more than
    ``after`` bytes in one direction ("up": requests, "down": responses): a transfer cut mid-way.
    With ``rate`` (bytes/s), that direction is also slowed down to it: a slow link."""

    def __init__(self, target: str, after: int, cuts: int, direction: str = "up", rate: float | None = None) -> None:
        self.target = ("127.0.0.1", int(target.rsplit(":", 1)[1]))
        self.after, self.cuts_left, self.direction, self.rate = after, cuts, direction, rate
        self.cut = 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._pump, args=(client,), daemon=True).start()

    def _pump(self, client: socket.socket) -> None:
        """Both directions of one connection in one thread, so a cut closes sockets nobody waits on."""
        import select

        upstream = socket.create_connection(self.target)
        peer = {client: (upstream, "up"), upstream: (client, "down")}
        moved = {"up": 0, "down": 0}
        try:
            while True:
                ready, _, _ = select.select([client, upstream], [], [], 30)
                if not ready:
                    return
                for src in ready:
                    dst, way = peer[src]
                    data = src.recv(65536)
                    if not data:
                        return
                    moved[way] += len(data)
                    if way == self.direction and moved[way] > self.after and self._take_cut():
                        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
                        return
                    dst.sendall(data)
                    if self.rate and way == self.direction:
                        time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    def _take_cut(self) -> bool:
        with self.lock:
            if self.cuts_left <= 0:
                return False
            self.cuts_left -= 1
            self.cut += 1
            return True

    def close(self) -> None:
        self.server.close()


def test_upload_interrupted_mid_way_is_retried_and_completes(phx_home, s3_env, s3, proj, s3_server):
    proxy = CuttingProxy(s3_server, after=1_000_000, cuts=3)
    try:  # the S3 client's own retries are off: each cut costs one of phalanx's 4 attempts
        env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "1", "SIZE": str(4_000_000)}
        phalanx("run", "--name", "cut", "--output", f"s3://{s3_env}/runs", "write.py", cwd=proj, env=env, check=True)
    finally:
        proxy.close()
    assert proxy.cut == 3
    job = json.loads(phalanx("status", "cut", "--json", check=True).stdout)
    remote = f"{s3_env}/runs/cut-{job['id']}/output/model.bin"
    assert s3.cat(remote) == (Path(job["job_dir"]) / "output" / "model.bin").read_bytes()


def test_upload_that_keeps_failing_fails_the_job_and_publishes_nothing_partial(phx_home, s3_env, s3, proj, s3_server):
    proxy = CuttingProxy(s3_server, after=1_000_000, cuts=10_000)
    try:
        env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "1", "SIZE": str(4_000_000)}
        proc = phalanx("run", "--name", "dead", "--output", f"s3://{s3_env}/runs", "write.py", cwd=proj, env=env)
    finally:
        proxy.close()
    assert proc.returncode == 1
    job = json.loads(phalanx("status", "dead", "--json", check=True).stdout)
    assert job["state"] == "FAILED" and "uploading the outputs to" in job["root_cause"]["message"]
    prefix = f"{s3_env}/runs/dead-{job['id']}"
    assert not s3.exists(f"{prefix}/output/model.bin") and not s3.exists(f"{prefix}/_phalanx_artifacts.json")
    listed = phalanx("artifacts", "dead", check=True).stdout
    assert "on this machine" in listed and "the upload failed" in listed


def test_stop_waits_for_the_outputs_to_upload_after_the_ranks_stopped(phx_home, s3_env, s3, proj, s3_server):
    # 2 MB over a 320 kB/s link: the upload takes 6 s, twice stop's --timeout for the ranks.
    proxy = CuttingProxy(s3_server, after=0, cuts=0, rate=320_000)
    (proj / "wait.py").write_text(WRITE_OUTPUT.replace("sys.exit", "import time; time.sleep(600); sys.exit"))
    try:
        env = {"AWS_ENDPOINT_URL": proxy.url, "SIZE": str(2_000_000)}
        job = json.loads(phalanx("run", "-d", "--json", "--name", "slow", "--grace", "2", "--output", f"s3://{s3_env}/runs",
                                 "wait.py", cwd=proj, env=env, check=True).stdout)["id"]
        log = phx_home / "jobs" / job / "attempt_0" / "rank_0" / "output.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and "wrote outputs" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        stopped = phalanx("stop", "slow", "--timeout", "3", env=env)
    finally:
        proxy.close()
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.split() == [job, "CANCELLED"]
    assert "is saving the outputs and the state" in stopped.stderr
    remote = f"{s3_env}/runs/slow-{job}/output/model.bin"
    assert s3.cat(remote) == (phx_home / "jobs" / job / "output" / "model.bin").read_bytes()


def test_download_interrupted_mid_way_is_retried(phx_home, s3_env, s3, proj, s3_server):
    payload = os.urandom(3_000_000)
    s3.pipe_file(f"{s3_env}/big/blob.bin", payload)
    proxy = CuttingProxy(s3_server, after=500_000, cuts=8, direction="down")
    try:
        env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "1"}
        (proj / "size.py").write_text("import os, pathlib\nprint('SIZE', pathlib.Path(os.environ['PHALANX_CHANNEL_BIG'], 'blob.bin').stat().st_size)\n")
        out = phalanx("run", "--input", f"big=s3://{s3_env}/big", "size.py", cwd=proj, env=env, check=True)
    finally:
        proxy.close()
    assert proxy.cut == 8 and "SIZE 3000000" in out.stdout
    staged = next((phx_home / "cache" / "channels").glob("*/blob.bin"))
    assert staged.read_bytes() == payload
    assert not list((phx_home / "cache" / "channels").glob("*.partial"))


@pytest.mark.parametrize("args,code,message", [
    (["--input", "x=ftpx://bucket/x"], 2, "--input x 'ftpx://bucket/x' has an unknown scheme 'ftpx'"),
    (["--input", "x"], 2, "invalid --input 'x'; use NAME=URI"),
    (["--input", "x=./no/such/dir"], 2, "input 'x': {cwd}/no/such/dir does not exist; check the path given to --input x"),
    (["--input", "x=job:nojob"], 2, "no job with id or name 'nojob'"),
    (["--input", "x=s3://no-such-bucket-phx/data"], 1,
     "bucket 'no-such-bucket-phx' of 's3://no-such-bucket-phx/data' does not exist; create it, or fix --input x"),
    (["--input", "x=s3://{bucket}/missing/prefix"], 1, "input 'x': nothing at 's3://{bucket}/missing/prefix'; check the URI"),
    (["--output", "s3://no-such-bucket-phx/runs"], 1,
     "bucket 'no-such-bucket-phx' of 's3://no-such-bucket-phx/runs' does not exist; create it, or fix --output"),
])
def test_bad_uris_and_missing_buckets_fail_before_the_job_starts(phx_home, s3_env, proj, args, code, message):
    args = [a.replace("{bucket}", s3_env) for a in args]
    proc = phalanx("run", *args, "show.py", cwd=proj)
    assert proc.returncode == code, proc.stderr
    assert message.replace("{bucket}", s3_env).replace("{cwd}", str(proj)) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert json.loads(phalanx("ps", "--all", "--json").stdout) == []


def test_http_inputs_and_a_local_output_directory(phx_home, proj, tmp_path):
    import functools
    import http.server

    www = tmp_path / "www"
    www.mkdir()
    (www / "labels.csv").write_text("a,b\n")
    with tarfile.open(www / "val.tar.gz", "w:gz") as tf:
        info = tarfile.TarInfo("v.txt")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"vv"))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        out = phalanx("run", "--name", "web", "--input", f"labels={base}/labels.csv", "--input", f"val={base}/val.tar.gz#extract",
                      "--output", str(tmp_path / "results"), "show.py", cwd=proj, check=True)
    finally:
        server.shutdown()
    seen = _inputs(out)
    assert seen["labels"]["files"] == {"labels.csv": "a,b\n"} and seen["val"]["files"] == {"v.txt": "vv"}
    job = json.loads(phalanx("status", "web", "--json", check=True).stdout)
    uploaded = tmp_path / "results" / f"web-{job['id']}"
    assert (uploaded / "_phalanx_artifacts.json").exists() and (uploaded / "logs" / "spec.json").exists()
    assert not list(uploaded.rglob("*.part"))
