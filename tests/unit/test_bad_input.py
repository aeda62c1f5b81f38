"""Bad input, one line per case: what the user typed (argv, or a job file's text), the exit code,
and a fragment of the message. Every case must end with exactly one line on stderr, exit 2, and
no traceback. Cases run in-process (``phalanx.cli.main.main``) so the table stays fast; a few go
through the real ``phalanx`` binary at the end. ``MEANINGS`` holds inputs that are valid and must
keep their sensible meaning (no silent change): what the spec gets.

Add a case: one line in ``ARGV`` or ``FILES``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cli.main import main

SCRIPT = "import sys\nprint('loss=0.5', sys.argv[1:])\n"
ROLE = "arn:aws:iam::123456789012:role/sm"

# (argv after `phalanx`, exit code, fragment of the one-line message). `run` cases run with --dry-run.
ARGV: list[tuple[list[str], int, str]] = [
    # numbers that mean nothing
    (["run", "--grace", "nan", "t.py"], 2, "invalid --grace 'nan'"),
    (["run", "--grace", "inf", "t.py"], 2, "invalid --grace 'inf'"),
    (["run", "--grace", "-1", "t.py"], 2, "of at least 0"),
    (["run", "--stall-timeout", "nan", "t.py"], 2, "invalid --stall-timeout 'nan'"),
    (["run", "--stall-timeout", "0", "t.py"], 2, "above 0"),
    (["run", "--sample-interval", "nan", "t.py"], 2, "invalid --sample-interval 'nan'"),
    (["run", "--sample-interval", "-inf", "t.py"], 2, "invalid --sample-interval"),
    (["run", "--monitor-interval", "0", "t.py"], 2, "invalid --monitor-interval '0'"),
    (["run", "--max-retries", "three", "t.py"], 2, "invalid --max-retries 'three'; use an integer"),
    (["run", "--max-retries", "-1", "t.py"], 2, "from 0 to 10,000"),
    (["run", "--max-restarts", "1.5", "t.py"], 2, "invalid --max-restarts"),
    (["run", "--trials", "-3", "t.py", "--x", "[1, 2]"], 2, "invalid --trials '-3'"),
    (["run", "--trials", "0", "t.py", "--x", "[1, 2]"], 2, "of at least 1"),
    (["run", "--parallel", "0", "t.py", "--x", "[1, 2]"], 2, "invalid --parallel"),
    (["run", "--seed", "x", "t.py", "--x", "[1, 2]"], 2, "invalid --seed 'x'"),
    # topologies
    (["run", "-n", "99999999999999999999", "t.py"], 2, "at most 100,000 nodes"),
    (["run", "-n", "2y3", "t.py"], 2, "invalid -n '2y3'"),
    (["run", "-n", "0", "t.py"], 2, "at least 1"),
    (["run", "-n", "2x0", "t.py"], 2, "at least 1"),
    (["run", "-n", "4096", "t.py"], 2, "at most 1,024 processes"),
    (["run", "--nnodes", "0", "t.py"], 2, "at least 1"),
    (["run", "--nnodes", "two", "t.py"], 2, "invalid --nnodes 'two'"),
    (["run", "--nnodes", "4:1", "t.py"], 2, "MIN <= MAX"),
    (["run", "--nnodes", "1:4", "t.py"], 2, "needs a rendezvous other machines can join"),
    (["run", "--nproc-per-node", "0", "t.py"], 2, "invalid --nproc-per-node '0'"),
    (["run", "--nproc-per-node", "1.5", "t.py"], 2, "invalid --nproc-per-node '1.5'"),
    (["run", "--nproc_per_node", "many", "t.py"], 2, "gpu, cpu, auto"),
    (["run", "--nproc-per-node", "gpu", "t.py"], 2, "this machine has no GPU"),
    (["run", "-n", "2", "--nnodes", "2", "t.py"], 2, "-n and --nnodes"),
    (["run", "--nnodes", "2", "--node-rank", "2", "t.py"], 2, "--node-rank 2 is not a node of 2"),
    (["run", "--node-rank", "-1", "t.py"], 2, "invalid --node-rank '-1'"),
    (["run", "--master-port", "70000", "t.py"], 2, "from 1 to 65,535"),
    (["run", "--rdzv-endpoint", "a b:1", "t.py"], 2, "HOST:PORT"),
    (["run", "--rdzv-endpoint", "host:port", "t.py"], 2, "invalid --rdzv-endpoint"),
    (["run", "--nnodes", "2", "--node-rank", "0", "--framework", "jax", "t.py"], 2, "does not run torchrun"),
    (["run", "--standalone", "--nnodes", "1:2", "t.py"], 2, "--standalone runs one node"),
    (["run", "--backend", "ssh", "--node-rank", "0", "t.py"], 2, "applies only to the local backend"),
    # exit codes, env, regexes, names
    (["run", "--retry-on-exit-codes", "a,b", "t.py"], 2, "invalid --retry-on-exit-codes 'a,b'; use a list of exit codes"),
    (["run", "--retry-on-exit-codes", "256", "t.py"], 2, "from 0 to 255"),
    (["run", "--retry-on-exit-codes", "-1", "t.py"], 2, "from 0 to 255"),
    (["run", "--retry-on-exit-codes", ",", "t.py"], 2, "invalid --retry-on-exit-codes"),
    (["run", "-e", "NOEQUALS", "t.py"], 2, "invalid --env 'NOEQUALS'; use KEY=VALUE"),
    (["run", "-e", "=1", "t.py"], 2, "environment variable name"),
    (["run", "--cold=yes", "t.py"], 2, "option '--cold' does not take a value"),
    (["run", "-e", "1A=x", "t.py"], 2, "environment variable name"),
    (["run", "-e", "A B=x", "t.py"], 2, "environment variable name"),
    (["run", "--env", "A-B=x", "t.py"], 2, "environment variable name"),
    (["run", "--metric", "loss", "t.py"], 2, "invalid --metric 'loss'; use NAME=REGEX"),
    (["run", "--metric", "loss=(", "t.py"], 2, "regular expression"),
    (["run", "--metric", "loss=abc", "t.py"], 2, "a group for the number"),
    (["run", "--metric", "=x(1)", "t.py"], 2, "with a name"),
    (["run", "--no-retry-on", "(", "t.py"], 2, "invalid --no-retry-on '('"),
    (["run", "--input", "x", "t.py"], 2, "invalid --input 'x'; use NAME=URI"),
    (["run", "--input", "1x=data", "t.py"], 2, "input name"),
    (["run", "--input", "x=ftpx://b/x", "t.py"], 2, "unknown scheme 'ftpx'"),
    (["run", "--input", "x=./missing", "t.py"], 2, "does not exist"),
    (["run", "--state", "ftpx://b/x", "t.py"], 2, "unknown scheme"),
    (["run", "--output", "gopher://b", "t.py"], 2, "unknown scheme"),
    (["run", "--log-dir", "/tmp/a", "--output", "/tmp/b", "t.py"], 2, "name different places"),
    (["run", "--name", "", "t.py"], 2, "invalid --name ''"),
    (["run", "--name", " ", "t.py"], 2, "non-empty"),
    (["run", "--framework", "mxnet", "t.py"], 2, "invalid framework 'mxnet'"),
    (["run", "--spawn", "never", "t.py"], 2, "invalid --spawn 'never'; use one of auto, self"),
    (["run", "--local-rank-arg", "--lr", "t.py"], 2, "invalid --local-rank-arg '--lr'"),
    (["run", "--redirects", "5", "t.py"], 2, "invalid --redirects '5'"),
    (["run", "--tee", "0:9", "t.py"], 2, "invalid --tee"),
    (["run", "--ranks", "a", "t.py"], 2, "invalid --ranks 'a'"),
    (["run", "--local-ranks-filter", "-1", "t.py"], 2, "invalid --local-ranks-filter '-1'"),
    (["run", "-m", "bad name!"], 2, "invalid --module 'bad name!'"),
    (["run", "--no-python", "-m", "x"], 2, "--no-python and -m"),
    (["run", "--workdir", "/nonexistent-phx", "t.py"], 2, "does not exist"),
    # backends
    (["run", "--backend", "nosuch", "t.py"], 2, "unknown backend 'nosuch'"),
    (["run", "--partition", "gpu", "t.py"], 2, "--partition is an option of the slurm backend, not of local"),
    (["run", "--hosts", "a,b", "t.py"], 2, "option of the ssh backend"),
    (["run", "--backend", "slurm", "--gpus-per-node", "many", "t.py"], 2, "invalid --gpus-per-node 'many'"),
    (["run", "--backend", "slurm", "--time", "4h", "t.py"], 2, "invalid --time '4h'"),
    (["run", "--backend", "slurm", "--hosts", "a", "t.py"], 2, "option of the ssh backend, not of slurm"),
    # backends' declared options (their modules' OPTIONS: rules in the table, the rest in each backend's plan)
    (["run", "--backend", "sagemaker", "--region", "us-east-1", "t.py"], 2, "the sagemaker backend needs an IAM role"),
    (["run", "--backend", "sagemaker", "--role", "sm-role", "t.py"], 2, "invalid --role 'sm-role'; use an IAM role ARN"),
    (["run", "--backend", "sagemaker", "--region", "us-east-1", "--role", ROLE, "--instance-type", "ml.g5.13xlarge",
      "t.py"], 2, "SageMaker offers no instance type 'ml.g5.13xlarge'"),
    (["run", "--backend", "sagemaker", "--max-run", "0", "t.py"], 2, "invalid --max-run '0'; use a number of seconds of at least 1"),
    (["run", "--backend", "sagemaker", "--max-wait", "1h", "t.py"], 2, "invalid --max-wait '1h'"),
    (["run", "--backend", "sagemaker", "--volume-size", "-1", "t.py"], 2, "invalid --volume-size '-1'; use a size in GB"),
    (["run", "--backend", "sagemaker", "--tag", "novalue", "t.py"], 2, "invalid --tag 'novalue'; use KEY=VALUE"),
    (["run", "--backend", "sagemaker", "--s3-prefix", "bkt/phx", "t.py"], 2, "invalid --s3-prefix 'bkt/phx'; use an s3:// URI"),
    (["run", "--backend", "sagemaker", "--region", "us-east-1", "--role", ROLE, "--max-wait", "60", "t.py"], 2,
     "--max-wait applies to spot training only"),
    (["run", "--role", ROLE, "t.py"], 2, "--role is an option of the sagemaker backend, not of local"),
    (["run", "--backend", "ray", "--instance-type", "x", "t.py"], 2, "--instance-type is an option of the sagemaker, skypilot backend, not of ray"),
    (["run", "--backend", "skypilot", "--disk-size", "0", "t.py"], 2, "invalid --disk-size '0'; use a size in GB of at least 1"),
    (["run", "--backend", "skypilot", "--cpus", "many", "t.py"], 2, "invalid --cpus 'many'"),
    (["run", "--backend", "skypilot", "--memory", "-4", "t.py"], 2, "invalid --memory '-4'"),
    (["run", "--backend", "skypilot", "--managed", "--max-retries", "2", "t.py"], 2, "--managed lets SkyPilot recover the job"),
    (["run", "--backend", "ray", "--pending-timeout", "0", "t.py"], 2, "invalid --pending-timeout '0'; use a number of seconds above 0"),
    (["run", "--backend", "ray", "--pending-timeout", "nan", "t.py"], 2, "invalid --pending-timeout 'nan'"),
    (["run", "--backend", "ray", "--cpus-per-node", "-1", "t.py"], 2, "invalid --cpus-per-node '-1'"),
    (["run", "--backend", "ray", "--gpus-per-node", "-1", "t.py"], 2, "invalid --gpus-per-node '-1'"),
    (["run", "--backend", "ray", "--ray", "{}", "t.py"], 2, "no such option: --ray"),
    (["run", "--address", "http://head:8265", "t.py"], 2, "--address is an option of the ray backend, not of local"),
    # k8s: each option's rule (backends/kubernetes/options.py), before anything is planned
    (["run", "--backend", "k8s", "--k8s-kind", "mpijob", "t.py"], 2,
     "invalid --k8s-kind 'mpijob'; use one of job, pytorchjob, trainjob, jobset"),
    (["run", "--backend", "k8s", "--namespace", "Team_A", "t.py"], 2, "invalid --namespace 'Team_A'; use a Kubernetes name"),
    (["run", "--backend", "k8s", "--namespace", "a" * 64, "t.py"], 2, "invalid --namespace 'aaaa"),
    (["run", "--backend", "k8s", "--namespace", "team.a", "t.py"], 2, "invalid --namespace 'team.a'; use a Kubernetes name"),
    (["run", "--backend", "k8s", "--queue", "-q", "t.py"], 2, "invalid --queue '-q'; use a Kubernetes name"),
    (["run", "--backend", "k8s", "--image", "PyTorch", "t.py"], 2, "invalid --image 'PyTorch'; use an image reference"),
    (["run", "--backend", "k8s", "--memory", "lots", "t.py"], 2, "invalid --memory 'lots'; use a memory quantity (e.g. 64Gi"),
    (["run", "--backend", "k8s", "--memory", "0", "t.py"], 2, "invalid --memory '0'; use a memory quantity"),
    (["run", "--backend", "k8s", "--code-uri", "bucket/prefix", "t.py"], 2, "invalid --code-uri 'bucket/prefix'; use an object store prefix"),
    (["run", "--backend", "k8s", "--pending-timeout", "0", "t.py"], 2, "invalid --pending-timeout '0'; use a number of seconds above 0"),
    (["run", "--backend", "k8s", "--gpus-per-node", "-1", "t.py"], 2, "invalid --gpus-per-node '-1'; use a GPU count"),
    (["run", "--keep-failed", "t.py"], 2, "--keep-failed is an option of the k8s backend, not of local; add --backend k8s"),
    (["run", "--namespace", "team-a", "t.py"], 2, "--namespace is an option of the k8s backend, not of local"),
    (["run", "--backend", "ray", "--memory", "64Gi", "t.py"], 2, "--memory is an option of the k8s, skypilot backend, not of ray"),
    (["run", "--backend", "k8s", "--pod", "{}", "t.py"], 2, "no such option: --pod"),
    # sweeps
    (["run", "t.py", "--lr", "[0.1, 0.01"], 2, "--lr '[0.1, 0.01' is not a valid search space"),
    (["run", "t.py", "--lr", "logunifrom(1e-4, 1e-1)"], 2, "did you mean loguniform?"),
    (["run", "t.py", "--lr=[0.1, [0.2]]"], 2, "nested lists are not values"),
    (["run", "t.py", "--x", "range(1e8)"], 2, "the grid has 100,000,000 trials"),
    (["run", "t.py", "--x", "uniform(0, 1)"], 2, "a grid needs finite values"),
    (["run", "--strategy", "bayes", "t.py", "--x", "[1, 2]"], 2, "invalid --strategy 'bayes'"),
    (["run", "--strategy", "random", "t.py", "--x", "[1, 2]"], 2, "needs --trials"),
    (["run", "--early-stop", "mean", "t.py", "--x", "[1, 2]"], 2, "invalid --early-stop"),
    (["run", "--objective", "loss:up", "t.py", "--x", "[1, 2]"], 2, "invalid --objective 'loss:up'"),
    (["run", "--objective", "val_los:min", "t.py", "--x", "[1, 2]"], 2, "no trial would report it"),
    (["run", "--objective", "acc", "--no-auto-metrics", "t.py", "--x", "[1, 2]"], 2, "not a metric phalanx reads"),
    (["run", "--trials", "3", "t.py"], 2, "needs a search space"),
    (["run", "--clean-state", "t.py", "--x", "[1, 2]"], 2, "--clean-state does not apply to sweeps"),
    # the command line itself
    (["run"], 2, "nothing to run"),
    (["run", "--"], 2, "nothing to run"),
    (["run", "missing.py"], 2, "script 'missing.py' not found"),
    (["run", "no-such-command-xyz"], 2, "neither a Python script nor a command"),
    (["run", "--nprc-per-node", "2", "t.py"], 2, "did you mean --nproc-per-node?"),
    (["run", "--dryrun", "t.py"], 2, "did you mean --dry-run?"),
    (["run", "-f", "nope.yaml"], 2, "job file 'nope.yaml' not found"),
    (["run", "-f"], 2, "requires an argument"),
    (["run", "--grace"], 2, "requires an argument"),
    (["frobnicate"], 2, "no such command 'frobnicate'"),
    (["stauts", "x"], 2, "did you mean 'status'?"),
    (["help", "nosuch"], 2, "no such command or backend 'nosuch'"),
    (["--bogus"], 2, "no such option"),
    (["status", ""], 2, "a job id, id prefix or name is needed, got ''"),
    (["logs", " "], 2, "a job id, id prefix or name is needed"),
    (["status", "deadbeef"], 2, "no job with id or name 'deadbeef'"),
    (["sweep", "show", ""], 2, "a job id, id prefix or name is needed"),
    (["logs"], 2, "missing argument"),
    (["wait", "x", "--timeout", "nan"], 2, "invalid --timeout nan"),
    (["stop", "x", "--timeout", "-1"], 2, "invalid --timeout -1"),
    (["top", "x", "--interval", "0"], 2, "invalid --interval"),
    (["top", "x", "--interval", "inf"], 2, "invalid --interval"),
    (["ps", "--limit", "-1"], 2, "invalid --limit -1"),
    (["logs", "x", "--rank", "-2"], 2, "invalid --rank -2"),
    (["metrics", "x", "--attempt", "-1"], 2, "invalid --attempt -1"),
    (["ui", "--port", "99999"], 2, "not in the range"),
    (["ps", "--limit", "many"], 2, "'many' is not a valid integer"),
    # --tag and --notify (labels and notifications, every backend)
    (["run", "--tag", "team", "t.py"], 2, "invalid --tag 'team'; use KEY=VALUE"),
    (["run", "--tag", "=vision", "t.py"], 2, "invalid --tag '=vision'; use a tag key of 1 to 128 letters"),
    (["run", "--tag", "team vision=x", "t.py"], 2, "invalid --tag 'team vision=x'; use a tag key"),
    (["run", "--tag", "team=" + "v" * 257, "t.py"], 2, "use a tag value of at most 256 characters"),
    (["run", "--notify", "ftp://example.org/x", "t.py"], 2,
     "invalid --notify 'ftp://example.org/x'; use a webhook URL (https://...), mailto:ADDR or desktop"),
    (["run", "--notify", "mailto:nobody", "t.py"], 2, "'nobody' is not an email address"),
    (["run", "--notify", "https://:443/x", "t.py"], 2, "no host in the URL"),
    (["run", "--notify", "http://host:port/x", "t.py"], 2, "the port is not a number"),
    (["run", "--notify", " , ", "t.py"], 2, "invalid --notify ' , '"),
    (["run", "--notify", "slack", "t.py"], 2, "invalid --notify 'slack'"),
]

# (job-file text, exit code, fragment). Run as `phalanx run --dry-run -f job.yaml`.
FILES: list[tuple[str, int, str]] = [
    ("script: t.py\nmax_retries: three\n", 2, "job.yaml:2: max_retries: expected an integer from 0 to 10,000, got 'three'"),
    ("script: t.py\ngrace: soon\n", 2, "job.yaml:2: grace: expected a number of seconds of at least 0, got 'soon'"),
    ("script: t.py\nnnodes: two\n", 2, "job.yaml:2: nnodes: expected a number of nodes"),
    ("script: t.py\nenv: [A=1]\n", 2, "job.yaml:2: env: expected a mapping, got a list ['A=1']"),
    ("script: t.py\nargs: ['--x', '[1, 2]']\nsweep: {trials: many}\n", 2, "job.yaml:3: sweep.trials: expected an integer"),
    ("script: t.py\nsnapshot: 'false'\n", 2, "job.yaml:2: snapshot: expected true or false, got 'false'; a boolean is written without quotes"),
    ("script: t.py\nauto_metrics: \"no\"\n", 2, "job.yaml:2: auto_metrics: expected true or false, got 'no'"),
    ("script: t.py\nauto_metrics: 0\n", 2, "auto_metrics: expected true or false, got 0"),
    ("script: t.py\nwarm: 'off'\n", 2, "job.yaml:2: warm: expected true or false, got 'off'"),
    ("script: t.py\nnproc_per_node: 1.5\n", 2, "job.yaml:2: nproc_per_node: expected a number of processes from 1 to 1,024, or gpu, cpu, auto, got 1.5"),
    ("script: t.py\nname: {a: 1}\n", 2, "job.yaml:2: name: expected a string, got a mapping {a: 1}"),
    ("script: t.py\nmetrics: [loss]\n", 2, "job.yaml:2: metrics: expected a mapping of metric name to regular expression, got a list ['loss']"),
    ("script: t.py\nmetrics: {loss: 'loss=(x'}\n", 2, "job.yaml:2: metrics.loss: expected a regular expression, got 'loss=(x'; missing )"),
    ("script: t.py\nargs: [--lr\n", 2, "job.yaml:3:1: not valid YAML"),
    ("script: t.py\n  grace: 3\n", 2, "job.yaml:2:8: not valid YAML"),
    ("script: t.py\n\tgrace: 3\n", 2, "not valid YAML"),
    ("scirpt: t.py\n", 2, "job.yaml:1: unknown key scirpt; did you mean script?"),
    ("script: t.py\nmax_retry: 3\n", 2, "did you mean max_retries?"),
    ("script: t.py\ndry_run: true\n", 2, "unknown key dry_run; --dry-run is a command-line option only"),
    ("script: t.py\nhosts: a\n", 2, "unknown key hosts"),
    ("script: t.py\ngrace: 3\ngrace: 4\n", 2, "job.yaml:3: grace is set twice (first on line 2)"),
    ("script: t.py\nsweep: 5\n", 2, "job.yaml:2: sweep: expected a mapping, got 5"),
    ("script: t.py\nsweep: {trails: 3}\n", 2, "unknown key sweep.trails; did you mean sweep.trials?"),
    ("script: t.py\nbackend_options: {partitoin: x}\n", 2, "did you mean backend_options.partition?"),
    ("script: t.py\nbackend_options: [a]\n", 2, "backend_options: expected a mapping"),
    ("script: t.py\nretry_on_exit_codes: [1, 300]\n", 2, "job.yaml:2: retry_on_exit_codes[1]: expected an exit code from 0 to 255, got 300"),
    ("script: t.py\nretry_on_exit_codes: {a: 1}\n", 2, "retry_on_exit_codes: expected a list of exit codes"),
    ("script: t.py\nenv: {1A: x}\n", 2, "environment variable name"),
    ("script: t.py\nenv: {A: [1, 2]}\n", 2, "job.yaml:2: env.A: expected a string, got a list [1, 2]"),
    ("script: t.py\nargs: [--x, [1]]\n", 2, "job.yaml:2: args[1]: expected a string, got a list [1]"),
    ("script: t.py\nenv:\n  A: 1\n  B: {c: d}\n", 2, "job.yaml:4: env.B: expected a string"),
    ("script: t.py\nstall_timeout: .nan\n", 2, "stall_timeout: expected a number of seconds above 0, got nan"),
    ("script: t.py\ngrace: -5\n", 2, "grace: expected a number of seconds of at least 0, got -5"),
    ("script: t.py\nsample_interval: .inf\n", 2, "sample_interval: expected"),
    ("script: t.py\nsample_interval: true\n", 2, "sample_interval: expected a number of seconds above 0, got true"),
    ("script: t.py\ninputs: [a]\n", 2, "inputs: expected a mapping of input name to URI"),
    ("script: t.py\nframework: mxnet\n", 2, "framework: expected one of torch, tf, jax, got 'mxnet'"),
    ("script: t.py\nspawn: true\n", 2, "spawn: expected one of auto, self, got true"),
    ("script: t.py\nargs: {a: 1}\n", 2, "args: expected a list of strings"),
    ("script: t.py\nargs: \"--lr 'unclosed\"\n", 2, "split like a shell"),
    ("script: t.py\nargs: [\"a\\0b\"]\n", 2, "without NUL characters"),
    ("script: t.py\ncommand: [bash]\n", 2, "sets script and command"),
    ("args: [--x]\n", 2, "args without a script, module or command"),
    ("script: t.py\nn: 2y3\n", 2, "n: expected NPROC or NNODESxNPROC"),
    ("script: t.py\nn: 0\n", 2, "n: expected counts of at least 1"),
    ("script: t.py\nn: 99999999999999999999\n", 2, "at most 100,000 nodes"),
    ("script: t.py\nn: [2, 2]\n", 2, "n: expected a topology, got a list [2, 2]"),
    ("script: t.py\nmax_restarts: 1e9\n", 2, "max_restarts: expected an integer"),
    ("script: t.py\nmax_restarts: null\n", 2, "max_restarts: expected an integer"),
    ("", 2, "must be a mapping"),
    ("- a\n- b\n", 2, "must be a mapping"),
    ("just text\n", 2, "must be a mapping"),
    ("script: t.py\nsweep: {strategy: bayes}\n", 2, "sweep.strategy: expected one of grid, random, tpe"),
    ("script: t.py\nsweep: {trials: -3}\n", 2, "sweep.trials: expected an integer of at least 1"),
    ("script: t.py\nsweep: {objective: 'loss:up'}\n", 2, "sweep.objective: expected METRIC:min or METRIC:max"),
    ("script: t.py\nsweep: {fail_fast: 'yes'}\n", 2, "sweep.fail_fast: expected true or false"),
    ("script: t.py\nsweep: {trials: 3}\n", 2, "job.yaml:2: sweep.trials needs a search space"),
    ("script: t.py\nworkdir: /nonexistent-phx\n", 2, "does not exist"),
    ("script: t.py\nlocal_rank_arg: --lr\n", 2, "local_rank_arg: expected one of --local-rank, --local_rank"),
    ("script: t.py\nmaster_port: 70000\n", 2, "master_port: expected an integer from 1 to 65,535"),
    ("script: t.py\nstate: 'ftpx://b'\n", 2, "unknown scheme"),
    ("script: t.py\noutput: ''\n", 2, "output: expected a non-empty URI"),
    ("script: t.py\nname: ''\n", 2, "name: expected a non-empty string"),
    ("1: x\n", 2, "job.yaml:1: keys are names, got 1"),
    ("script: !!python/object:os.system {}\n", 2, "not valid YAML"),
    ("script: t.py\nbackend: slurm\nbackend_options: {gpus_per_node: many}\n", 2,
     "job.yaml:3: backend_options.gpus_per_node: expected an integer, got 'many'"),
    ("script: t.py\nbackend: ssh\nbackend_options: {shared_fs: 'yes'}\n", 2, "backend_options.shared_fs: expected true or false"),
    ("script: t.py\nbackend_options: {hosts: a}\n", 2, "job.yaml:2: backend_options.hosts is an option of the ssh backend, not of local"),
    # a backend's own section (sagemaker:), checked by its validator; backend_options.ray by ray's
    ("script: t.py\nbackend: sagemaker\nsagemaker: {spot: 'yes'}\n", 2, "job.yaml:3: sagemaker.spot: expected true or false"),
    ("script: t.py\nbackend: sagemaker\nsagemaker: {volume_size: big}\n", 2, "job.yaml:3: sagemaker: volume_size must be a positive whole number"),
    ("script: t.py\nbackend: sagemaker\nsagemaker: {role: sm-role}\n", 2, "job.yaml:3: sagemaker.role: expected an IAM role ARN, got 'sm-role'"),
    ("script: t.py\nbackend: sagemaker\nsagemaker: {rol: x}\n", 2, "unknown key(s) rol in the job file's 'sagemaker' section"),
    ("script: t.py\nbackend: sagemaker\nsagemaker: [a]\n", 2, "job.yaml:3: sagemaker: the job file's 'sagemaker' section must be a mapping"),
    ("script: t.py\nbackend: sagemaker\nsagemaker: {vpc: {subnets: [a], extra: 1}}\n", 2, "vpc must be a mapping with subnets and security_groups"),
    ("script: t.py\nsagemaker: {role: 'arn:aws:iam::123456789012:role/sm'}\n", 2,
     "job.yaml:2: sagemaker is an option of the sagemaker backend, not of local"),
    ("script: t.py\nbackend: ray\nbackend_options: {ray: {pip: 3}}\n", 2, "job.yaml:3: backend_options.ray: ray.pip must be a list"),
    ("script: t.py\nbackend: ray\nbackend_options: {ray: {pipp: [x]}}\n", 2, "unknown key(s) pipp in the job file's 'ray' section"),
    ("script: t.py\nbackend: ray\nbackend_options: {pending_timeout: .nan}\n", 2, "backend_options.pending_timeout: expected a number of seconds above 0"),
    ("script: t.py\nbackend: skypilot\nbackend_options: {disk_size: big}\n", 2,
     "job.yaml:3: backend_options.disk_size: expected a size in GB of at least 1, got 'big'"),
    # k8s: the kubernetes: section (its own validator, the line of the key it refuses) and its options
    ("script: t.py\nbackend: k8s\nkubernetes: [a]\n", 2, "job.yaml:3: kubernetes: must be a mapping"),
    ("script: t.py\nbackend: k8s\nkubernetes:\n  labels: {team: ml}\n  node_selecter: {pool: gpu}\n", 2,
     "job.yaml:5: kubernetes.node_selecter: unknown key; valid keys: node_selector"),
    ("script: t.py\nbackend: k8s\nkubernetes:\n  tolerations:\n  - key: gpu\n    operator: Exist\n", 2,
     "job.yaml:6: kubernetes.tolerations[0].operator: 'Exist' is not Equal or Exists"),
    ("script: t.py\nbackend: k8s\nkubernetes:\n  env: {PHX_ROOT: /x}\n", 2, "job.yaml:4: kubernetes.env.PHX_ROOT: PHX_ROOT is phalanx's"),
    ("script: t.py\nbackend: k8s\nkubernetes:\n  resources: {limits: {memory: lots}}\n", 2,
     "job.yaml:4: kubernetes.resources.limits.memory: 'lots' is not a quantity"),
    ("script: t.py\nkubernetes: {labels: {team: ml}}\n", 2, "job.yaml:2: kubernetes is an option of the k8s backend, not of local"),
    ("script: t.py\nbackend: k8s\nbackend_options: {pod: {volumes: [{name: dshm}]}}\n", 2,
     "job.yaml:3: backend_options.pod.volumes[0].name: 'dshm' is taken"),
    ("script: t.py\nbackend: k8s\nbackend_options: {k8s_kind: mpijob}\n", 2,
     "job.yaml:3: backend_options.k8s_kind: expected one of job, pytorchjob, trainjob, jobset, got 'mpijob'"),
    ("script: t.py\nbackend: k8s\nbackend_options: {keep_failed: 'yes'}\n", 2, "backend_options.keep_failed: expected true or false"),
    ("script: t.py\nbackend: k8s\nbackend_options: {namespace: Team_A}\n", 2,
     "job.yaml:3: backend_options.namespace: expected a Kubernetes name, got 'Team_A'"),
    # tags: and notify:
    ("script: t.py\ntags: [team=vision]\n", 2, "job.yaml:2: tags: expected a mapping of tag key to value, got a list"),
    ("script: t.py\ntags: {'team vision': x}\n", 2, "job.yaml:2: tags.team vision: expected a tag key of 1 to 128 letters"),
    ("script: t.py\ntags: {team: null}\n", 2, "job.yaml:2: tags.team: expected a tag value"),
    ("script: t.py\ntags: {team: " + "v" * 257 + "}\n", 2, "tags.team: expected a tag value of at most 256 characters"),
    ("script: t.py\nnotify: ftp://example.org/x\n", 2,
     "job.yaml:2: notify: expected a webhook URL (https://...), mailto:ADDR or desktop, got 'ftp://example.org/x'"),
    ("script: t.py\nnotify: [desktop, mailto:nobody]\n", 2, "job.yaml:2: notify[1]: expected mailto: and email addresses"),
    ("script: t.py\nnotify: {url: 'https://h/x'}\n", 2, "job.yaml:2: notify: expected a list of"),
    ("script: t.py\nnotify: true\n", 2, "job.yaml:2: notify: expected a list of"),
]


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PHALANX_HOME", str(tmp_path / "home"))
    for var in ("PHALANX_DEBUG", "PHALANX_BACKEND", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here, whatever the machine has
    return tmp_path


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``phalanx ARGV`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


def with_dry_run(argv: list[str]) -> list[str]:
    return ["run", "--dry-run", *argv[1:]] if argv[:1] == ["run"] else argv


def assert_one_line_error(code: int, err: str, expected_code: int, fragment: str) -> None:
    assert "Traceback" not in err, err
    assert code == expected_code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("phalanx: error: ") and fragment in lines[0], lines[0]


@pytest.mark.parametrize("argv,code,fragment", ARGV, ids=[" ".join(a)[:60] for a, _, _ in ARGV])
def test_bad_argv(project, capsys, argv, code, fragment):
    exit_code, _, err = cli(with_dry_run(argv), capsys)
    assert_one_line_error(exit_code, err, code, fragment)


@pytest.mark.parametrize("text,code,fragment", FILES, ids=[t[:50] for t, _, _ in FILES])
def test_bad_job_file(project, capsys, text, code, fragment):
    (project / "job.yaml").write_text(text)
    exit_code, _, err = cli(["run", "--dry-run", "-f", "job.yaml"], capsys)
    assert_one_line_error(exit_code, err, code, fragment)


def test_binary_job_file(project, capsys):
    (project / "job.yaml").write_bytes(b"script: t.py\n\x00\x01\xff\xfe")
    exit_code, _, err = cli(["run", "--dry-run", "-f", "job.yaml"], capsys)
    assert_one_line_error(exit_code, err, 2, "job file 'job.yaml' is not a text file (byte 0x00 at offset 13)")
    (project / "job.yaml").write_bytes(b"script: t.py\nname: \xff\n")
    exit_code, _, err = cli(["run", "--dry-run", "-f", "job.yaml"], capsys)
    assert_one_line_error(exit_code, err, 2, "not a text file (byte 0xff at offset 19)")


# -- valid input keeps its meaning: (job-file text or None, argv after `run`, spec attribute path, value) --

MEANINGS: list[tuple[str | None, list[str], str, object]] = [
    ("script: t.py\nargs: \"--lr 0.1 --name 'a b'\"\n", [], "entrypoint.args", ("--lr", "0.1", "--name", "a b")),
    ("script: t.py\nno_retry_on: CUDA\n", [], "no_retry_on", ("CUDA",)),
    ("script: t.py\nname: 010\n", [], "name", "010"),
    ("script: t.py\nname: yes\n", [], "name", "yes"),
    ("script: t.py\nenv: {A: 010, B: 1:30, C: no}\n", [], "env", {"A": "010", "B": "1:30", "C": "no"}),
    ("script: t.py\nargs: [--x, 010, 1:30, yes]\n", [], "entrypoint.args", ("--x", "010", "1:30", "yes")),
    ("script: t.py\nsnapshot: false\n", [], "snapshot", False),
    ("script: t.py\nauto_metrics: false\n", [], "auto_metrics", False),
    ("script: t.py\nwarm: false\n", [], "warm", False),
    ("script: t.py\nwarm: true\n", [], "warm", True),
    ("script: t.py\nwarm: true\n", ["--cold"], "warm", False),
    (None, ["--no-warm", "t.py"], "warm", False),
    ("script: t.py\nretry_on_exit_codes: '1,137'\n", [], "retry_on_exit_codes", (1, 137)),
    ("script: t.py\nretry_on_exit_codes: 137\n", [], "retry_on_exit_codes", (137,)),
    ("script: t.py\nbackend: slurm\nbackend_options: {time: 4:00:00}\n", [], "backend_options", {"time": "4:00:00"}),
    ("script: t.py\nnnodes: 2\n", [], "resources.explicit", True),
    ("script: t.py\nn: 4\n", [], "resources.nproc_per_node", 4),
    ("script: t.py\n", [], "resources.explicit", False),
    ("script: t.py\ngrace: 7\n", ["--grace", "3"], "grace", 3.0),
    (None, ["-n", "1", "t.py"], "resources.explicit", True),
    (None, ["t.py"], "resources.explicit", False),
    (None, ["--nproc-per-node", "cpu", "t.py"], "resources.nproc_per_node", os.cpu_count()),
    (None, ["--nproc_per_node=2", "t.py"], "resources.nproc_per_node", 2),
    (None, ["-n2x2", "t.py"], "resources.nnodes", 2),
    (None, ["-m", "pkg.train", "--seed", "3", "-n", "4"], "entrypoint.args", ("--seed", "3", "-n", "4")),
    (None, ["t.py", "--grace", "nan", "-n", "x"], "entrypoint.args", ("--grace", "nan", "-n", "x")),
    (None, ["--local-rank-arg", "--local_rank", "-n", "2", "t.py", "--lr", "1"], "entrypoint.args",
     ("--local_rank=${local_rank}", "--lr", "1")),
    (None, ["--local-rank-arg=--local-rank", "t.py"], "entrypoint.args", ("--local-rank=0",)),
    (None, ["--no-python", "true"], "entrypoint.kind.value", "command"),
    (None, ["--log-dir", "logs", "t.py"], "output_uri", "{cwd}/logs"),
    (None, ["--monitor-interval", "0.5", "t.py"], "monitor_interval", 0.5),
    (None, ["-e", "A=", "-e", "B=x=y", "t.py"], "env", {"A": "", "B": "x=y"}),
    # a backend's section, under backend_options, under flags; each value read by its backend's rules
    ("script: t.py\nbackend: sagemaker\nsagemaker:\n  role: 'arn:aws:iam::123456789012:role/sm'\n  volume_size: 50\n"
     "  max_run: 100\n  spot: true\n  tags: {team: ml}\n  vpc: {subnets: [s-1, s-2], security_groups: sg-1}\n"
     "backend_options: {volume_size: 60}\n", ["--max-run", "200"], "backend_options",
     {"role": ROLE, "volume_size": 60, "max_run": 200, "spot": True, "tag": ["team=ml"], "subnets": "s-1,s-2",
      "security_groups": "sg-1"}),
    (None, ["--backend", "skypilot", "--instance-type", "n2-standard-8", "--spot", "t.py"], "backend_options",
     {"instance_type": "n2-standard-8", "spot": True}),
    ("script: t.py\nbackend: ray\nbackend_options: {ray: {pip: einops==0.8.0, env_vars: {A: 1}}}\n", [],
     "backend_options", {"ray": {"pip": ["einops==0.8.0"], "env_vars": {"A": "1"}}}),
    # k8s: the kubernetes: section is the pod option, under backend_options.pod, under flags
    ("script: t.py\nbackend: k8s\nkubernetes: {labels: {team: a}, env: {A: 1}}\nbackend_options: {namespace: team-a}\n",
     ["--memory", "64Gi", "--k8s-kind", "jobset"], "backend_options",
     {"pod": {"labels": {"team": "a"}, "env": [{"name": "A", "value": "1"}]}, "namespace": "team-a", "memory": "64Gi",
      "k8s_kind": "jobset"}),
    ("script: t.py\nbackend: k8s\nkubernetes: {labels: {team: a}}\nbackend_options: {pod: {labels: {team: b}}}\n", [],
     "backend_options", {"pod": {"labels": {"team": "b"}}}),
    # --tag / tags: and --notify / notify: (labels and notifications, every backend)
    ("script: t.py\ntags: {team: vision, run: 3}\n", ["--tag", "team=audio", "--tag", "empty="], "tags",
     {"team": "audio", "run": "3", "empty": ""}),
    ("script: t.py\ntags: {gpu: yes, id: 010, at: 1:30}\n", [], "tags", {"gpu": "yes", "id": "010", "at": "1:30"}),
    (None, ["--tag", "a/b:c@d=x=y", "t.py"], "tags", {"a/b:c@d": "x=y"}),
    (None, ["--backend", "sagemaker", "--tag", "team=ml", "t.py"], "tags", {"team": "ml"}),
    (None, ["--backend", "sagemaker", "--tag", "team=ml", "t.py"], "backend_options", {}),
    (None, ["--notify", "https://hooks.example/x, mailto:a@x.org,b@x.org", "--notify", "desktop", "--notify",
            "desktop", "t.py"], "notify", ("https://hooks.example/x", "mailto:a@x.org,b@x.org", "desktop")),
    ("script: t.py\nnotify: mailto:me@x.org\n", [], "notify", ("mailto:me@x.org",)),
    ("script: t.py\nnotify: [desktop, 'https://hooks.example/y']\n", [], "notify", ("desktop", "https://hooks.example/y")),
    ("script: t.py\nnotify: [desktop]\n", ["--notify", "mailto:me@x.org"], "notify", ("mailto:me@x.org",)),
    (None, ["t.py"], "notify", ()),
    (None, ["t.py"], "tags", {}),
]


def _attr(obj: object, path: str) -> object:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("text,argv,path,value", MEANINGS, ids=[f"{t!r}{a}"[:60] for t, a, _, _ in MEANINGS])
def test_valid_input_keeps_its_meaning(project, text, argv, path, value):
    from phalanx.jobfile import build_spec

    args = list(argv)
    if text is not None:
        (project / "job.yaml").write_text(text)
        args = ["-f", "job.yaml", *args]
    opts = _run_options(args)
    got = _attr(build_spec(opts), path)
    expected = value.replace("{cwd}", str(project)) if isinstance(value, str) else value
    assert got == expected


def test_notify_defaults_to_the_setting_and_a_flag_replaces_it(project, monkeypatch, capsys):
    from phalanx.jobfile import build_spec

    monkeypatch.setenv("PHALANX_NOTIFY", "https://hooks.example/x, mailto:a@x.org,b@x.org")
    assert build_spec(_run_options(["t.py"])).notify == ("https://hooks.example/x", "mailto:a@x.org,b@x.org")
    assert build_spec(_run_options(["--notify", "desktop", "t.py"])).notify == ("desktop",)
    monkeypatch.setenv("PHALANX_NOTIFY", "ftp://x")
    exit_code, _, err = cli(["run", "--dry-run", "t.py"], capsys)
    assert_one_line_error(exit_code, err, 2, "invalid --notify 'ftp://x'")


def test_warm_defaults_to_the_setting_and_cold_turns_it_off(project, monkeypatch):
    from phalanx.jobfile import build_spec

    monkeypatch.delenv("PHALANX_WARM", raising=False)  # the suite's conftest sets it to 0
    assert build_spec(_run_options(["t.py"])).warm is True  # the setting's default
    assert build_spec(_run_options(["--cold", "t.py"])).warm is False
    monkeypatch.setenv("PHALANX_WARM", "0")
    assert build_spec(_run_options(["t.py"])).warm is False
    (project / "job.yaml").write_text("script: t.py\nwarm: true\n")
    assert build_spec(_run_options(["-f", "job.yaml"])).warm is True  # the job file over the setting


def _run_options(args: list[str]):
    """What the CLI would build, through click (so flags parse exactly as on the command line)."""
    import typer

    from phalanx.cli.main import app
    from phalanx.cli.runflow import _backend_options
    from phalanx.jobfile import RunOptions

    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    ctx = command.make_context("run", list(args))
    given = dict(ctx.params)
    words = list(given.pop("words"))
    backend = {o.name for o in _backend_options()}
    return RunOptions(words=words, backend_options={k: v for k, v in given.items() if k in backend},
                      **{k: v for k, v in given.items() if k not in backend})


# -- the real binary, for a few ----------------------------------------------------------------

BINARY = [ARGV[0], ARGV[15], ARGV[38], (["--version"], 0, "phalanx "), ([], 0, "Usage: phalanx")]


@pytest.mark.parametrize("argv,code,fragment", BINARY, ids=[" ".join(a)[:40] or "bare" for a, _, _ in BINARY])
def test_through_the_real_binary(project, argv, code, fragment):
    exe = Path(sys.executable).parent / "phalanx"
    proc = subprocess.run([str(exe), *with_dry_run(argv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == code and "Traceback" not in proc.stderr
    if code == 0:
        assert fragment in proc.stdout and proc.stderr == ""
    else:
        assert_one_line_error(proc.returncode, proc.stderr, code, fragment)
