"""Option values with a syntax of their own (a topology, a node range, an endpoint, ...): each
parser takes the user's text and returns the value, or raises BadValue saying what it must be.
Pure."""

from __future__ import annotations

import re

from .optiontypes import MAX_NODES, MAX_PROCS_PER_NODE, BadValue

_TOPOLOGY = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?(\d+)\s*$")


def topology(text: str) -> tuple[int, int]:
    """``"4"`` -> (1, 4); ``"2x4"`` -> (2, 4)."""
    match = _TOPOLOGY.match(text)
    if not match:
        raise BadValue("NPROC or NNODESxNPROC, e.g. 4 or 2x4")
    nnodes, nproc = _count(match.group(1) or "1"), _count(match.group(2))
    _check_counts(nnodes, nproc)
    return nnodes, nproc


def _count(digits: str) -> int:
    return int(digits) if len(digits) <= 12 else 10**12  # beyond any limit below, without a huge int


def _check_counts(nnodes: int, nproc: int) -> None:
    if nnodes < 1 or nproc < 1:
        raise BadValue("counts of at least 1, e.g. 4 or 2x4")
    if nnodes > MAX_NODES or nproc > MAX_PROCS_PER_NODE:
        raise BadValue(f"at most {MAX_NODES:,} nodes of at most {MAX_PROCS_PER_NODE:,} processes each")


def node_range(text: str) -> tuple[int, int]:
    """torchrun's ``--nnodes``: ``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4), an elastic range."""
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise BadValue("a number of nodes, or MIN:MAX for an elastic range (e.g. 2 or 1:4)")
    low = _count(match.group(1))
    high = _count(match.group(2)) if match.group(2) is not None else low
    if low < 1 or high < low or high > MAX_NODES:
        raise BadValue(f"a number of nodes of at least 1 and at most {MAX_NODES:,}, or MIN:MAX with MIN <= MAX")
    return low, high


def procs_per_node(text: str) -> int | str:
    """torchrun's ``--nproc-per-node``: a number, or gpu, cpu, auto (resolved on this machine)."""
    word = text.strip()
    if word in ("gpu", "cpu", "auto"):
        return word
    if not re.fullmatch(r"\d+", word) or not 1 <= _count(word) <= MAX_PROCS_PER_NODE:
        raise BadValue(f"a number of processes from 1 to {MAX_PROCS_PER_NODE:,}, or gpu, cpu, auto")
    return int(word)


def endpoint(text: str) -> str:
    """``host[:port]`` (torchrun's --rdzv-endpoint; its port defaults to 29400)."""
    host, sep, port = text.strip().rpartition(":") if ":" in text and not text.strip().endswith("]") else (text, "", "")
    host = host.strip() if sep else text.strip()
    if not host or " " in host or (sep and not (port.isdigit() and 0 <= int(port) <= 65535)):
        raise BadValue("HOST or HOST:PORT, e.g. node1.example.com:29400")
    return text.strip()


def stream_spec(text: str) -> str:
    """torchrun's ``--redirects``/``--tee``: 0-3 for every rank, or ``RANK:N,...``."""
    word = text.strip()
    if re.fullmatch(r"[0-3]", word) or re.fullmatch(r"\d+:[0-3](,\d+:[0-3])*", word):
        return word
    raise BadValue("0 (none), 1 (stdout), 2 (stderr), 3 (both), or RANK:N pairs such as 0:3,1:0")


def rank_list(text: str) -> tuple[int, ...]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or not all(re.fullmatch(r"\d{1,9}", w) for w in words):
        raise BadValue("rank numbers separated by commas, e.g. 0 or 0,3")
    return tuple(sorted({int(w) for w in words}))


def regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise BadValue("a regular expression", f"{exc}") from None
    return text


def metric_regex(text: str) -> str:
    regex(text)
    if re.compile(text).groups < 1:
        raise BadValue("a regular expression with a group for the number", "e.g. loss=([0-9.eE+-]+)")
    return text


def metric_name(text: str) -> str:
    if not text.strip():
        raise BadValue("NAME=REGEX with a name, e.g. loss=loss=([0-9.]+)")
    return text.strip()


def channel_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", text.strip()):
        raise BadValue("an input name: letters, digits, - and _, starting with a letter")
    return text.strip()


def objective(text: str) -> str:
    name, _, direction = text.strip().partition(":")
    if not name or direction not in ("", "min", "max"):
        raise BadValue("METRIC:min or METRIC:max, e.g. val_loss:min")
    return text.strip()


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms]?)")
_UNIT = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def duration(text: str) -> float:
    """``6h``, ``30m``, ``1h30m``, ``90s``, ``2d``, or seconds (``5400``) -> seconds (above 0)."""
    compact = text.strip().lower().replace(" ", "")
    parts = list(_DURATION_PART.finditer(compact))
    if not compact or "".join(m.group(0) for m in parts) != compact or \
            any(not m.group(2) for m in parts[:-1]):
        raise BadValue("a duration: 6h, 30m, 1h30m, 90s, 2d or a number of seconds")
    seconds = sum(float(m.group(1)) * _UNIT[m.group(2)] for m in parts)
    if seconds <= 0:
        raise BadValue("a duration above 0, e.g. 30m")
    return seconds


def watch_pattern(text: str) -> str:
    """A metric name or a glob of names (``--watch-metric``): ``loss``, ``val/*``."""
    if not text.strip() or any(c.isspace() for c in text.strip()):
        raise BadValue("a metric name or a glob of names, e.g. loss or '*_loss'")
    return text.strip()


def progress_regex(text: str) -> str:
    """``--progress``: a regex with groups done and total (or two groups), or one for a percentage."""
    regex(text)
    compiled = re.compile(text)
    named = set(compiled.groupindex)
    if compiled.groups < 1 or (named & {"done", "total"} and not {"done", "total"} <= named):
        raise BadValue("a regular expression with groups for done and total (or one for a percentage)",
                       r"e.g. 'it (\d+) of (\d+)' or '(?P<percent>[\d.]+)% done'")
    return text


def python_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", text.strip()):
        raise BadValue("a module name such as my_pkg.train")
    return text.strip()


# -- labels and notifications (--tag, --notify) ----------------------------------------------------

_TAG_KEY = re.compile(r"[A-Za-z0-9_.:/@+-]{1,128}")
_MAIL = re.compile(r"[^@\s,]+@[^@\s,]+\.[^@\s,]+|[^@\s,]+@localhost")


_PROJECT = re.compile(r"^[a-z][a-z0-9._-]{0,63}$")


def project_name(text: str) -> str:
    """A project's name: lower-case letters, digits, '.', '_', '-', starting with a letter."""
    if not _PROJECT.match(text):
        raise BadValue("a project name (lower-case letters, digits, '.', '_' and '-', starting with a letter)")
    return text


def tag_key(text: str) -> str:
    """A ``--tag`` key: what SageMaker's Tags and a ``ps --tag`` filter both accept."""
    if not _TAG_KEY.fullmatch(text.strip()):
        raise BadValue("a tag key of 1 to 128 letters, digits and _.:/@+-", "e.g. --tag team=vision")
    return text.strip()


TAG_VALUE_LONGEST = 256  # characters, as SageMaker's Tags allow


def tag_value(text: str) -> str:
    if len(text) > TAG_VALUE_LONGEST:
        raise BadValue(f"a tag value of at most {TAG_VALUE_LONGEST} characters")
    return text


def tag(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (a ``--tag``) -> (key, value)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise BadValue("KEY=VALUE", "e.g. --tag team=vision")
    return tag_key(key), tag_value(value)


def notify_target(text: str) -> str:
    """One ``--notify`` target: a webhook URL, ``mailto:ADDR[,ADDR]`` or ``desktop``."""
    from urllib.parse import urlsplit

    target = text.strip()
    if target == "desktop":
        return target
    if target.lower().startswith("mailto:"):
        addresses = [a.strip() for a in target[len("mailto:"):].split(",")]
        bad = [a for a in addresses if not _MAIL.fullmatch(a)]
        if bad:
            raise BadValue("mailto: and email addresses, e.g. mailto:you@example.com (several: mailto:a@x.org,b@x.org)",
                           f"'{bad[0]}' is not an email address")
        return "mailto:" + ",".join(addresses)
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        example = "a webhook URL, e.g. --notify https://hooks.slack.com/services/..."
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise BadValue(example, "the port is not a number") from None
        if not parts.hostname:
            raise BadValue(example, "no host in the URL")
        return target
    raise BadValue("a webhook URL (https://...), mailto:ADDR or desktop")


def notify_targets(text: str) -> tuple[str, ...]:
    """Targets separated by commas (``--notify``, the ``notify`` setting), keeping ``mailto:a,b``
    together."""
    pieces: list[str] = []
    for piece in str(text).split(","):
        piece = piece.strip()
        if not piece:
            continue
        if pieces and pieces[-1].lower().startswith("mailto:") and "@" in piece and ":" not in piece:
            pieces[-1] += "," + piece
        else:
            pieces.append(piece)
    if not pieces:
        raise BadValue("a webhook URL (https://...), mailto:ADDR or desktop")
    return tuple(dict.fromkeys(notify_target(p) for p in pieces))


# A secret's name (``phalanx secret set NAME``): a team server also knows PROJECT/NAME.
SECRET_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
SECRET_SCOPED = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# What --secret VAR=NAME may name: a local or a server's secret, or (sagemaker --secrets-from aws) a
# secret's name or ARN in AWS Secrets Manager; each store then says whether it holds it.
SECRET_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=@/:-]{0,2047}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def secret_ref(text: str) -> tuple[str, str]:
    """``--secret``: ``HF_TOKEN`` (the variable and the secret share the name) or ``HF_TOKEN=hf``
    (the variable HF_TOKEN holds the secret hf) -> (variable, secret name)."""
    var, sep, name = text.strip().partition("=")
    var, name = var.strip(), name.strip() if sep else var.strip()
    if not _ENV.match(var):
        hint = f"name the variable: SOME_VAR={var}" if not sep and SECRET_NAME.match(var) else None
        raise BadValue("VAR or VAR=SECRET, VAR an environment variable name (letters, digits and _, not starting "
                       "with a digit)", hint or f"{var!r} is not one")
    if var.startswith("PHALANX_"):
        raise BadValue("a variable outside PHALANX_*, which phalanx sets itself", f"{var!r} is one of those")
    if not SECRET_REF.match(name):
        raise BadValue("VAR=SECRET, SECRET a secret's name (letters, digits and _.-; PROJECT/NAME; a name or ARN of "
                       "AWS Secrets Manager)",
                       f"{name!r} is not one")
    return var, name
