"""What the automatic pick-up takes from a line a job printed: ``name=value`` and
``name: value`` numbers that look like metrics, and the step and epoch they belong to.

Taken: ``loss=0.31``, ``acc: 0.9``, ``'eval_loss': 2.1`` (a printed dict, as the HF Trainer logs),
``train_loss=0.512`` inside a progress bar's postfix (Lightning). ``step``, ``global_step``,
``iter``, ``iteration`` and ``epoch`` (also ``step 12``, ``Epoch [3/10]``) are not metrics: they
are the step and epoch of the other numbers of their line.

Never taken, because they only look like metrics:

- a source location, as logging prefixes print it (``[INFO|<module>.py:4115]``, the HF Trainer's): a
  name ending in a source file's extension;
- a progress bar's percentage: ``Map: 45%|████``;
- the last word of a label of several words: ``Writing model shards: 100%``, ``Trainable params:
  5``, ``Modules in train mode: 1`` (a ``name: value`` whose name follows other words from the
  start of its line or field; ``name=value`` is always a pair);
- a line of pretty-printed JSON, ``  "n_embd": 768,`` (a model's configuration, as libraries log it);
- a name on the ignore list (``IGNORED``): identities and settings that scripts and libraries
  print (``rank``, ``pid``, ``seed``, ``world_size``...), launchers' counters (``attempt``,
  ``restart``, ``allreduce``), Lightning's ``v_num``, its "TPU available: False, using: 0".

The ignore list is the ``metrics_ignore`` setting: names or globs (``eval_*``), comma-separated,
replacing ``IGNORED``; a list starting with ``+`` adds to it (``PHALANX_METRICS_IGNORE=+lr,mom*``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

STEP_KEYS = ("global_step", "step", "iteration", "iter")
EPOCH_KEYS = ("epoch",)
# Numbers scripts, libraries and launchers print that are identities, settings or counters, not
# measurements (docs/metrics.md lists them).
IGNORED = ("rank", "local_rank", "global_rank", "group_rank", "world_size", "local_world_size", "node_rank",
           "nproc_per_node", "num_nodes", "pid", "port", "master_port", "seed", "gpu", "device", "attempt",
           "restart", "restarts", "restart_count", "allreduce", "v_num", "using", "version", "trial")
# Where a name ending like a source file is a logging prefix (``trainer.py:4115``), not a metric.
_SOURCE = re.compile(r"\.(?:py|pyx|pyi|c|cc|cpp|cu|h|hpp|rs|go|java|js|ts|sh)$", re.IGNORECASE)

# A number as scripts print it; junk the class admits (1.2.3) is dropped by float(). nan and inf
# are read too (as Python, NumPy and torch print them) so that a diverging loss is seen.
NUMBER = r"[-+]?(?:\d[\d.]*|\.\d+|(?i:nan|inf(?:inity)?)\b)(?:[eE][-+]?\d+)?"
# One pass per line finds both metrics and step/epoch: ``name=value`` or ``name: value``
# (groups: name, separator, number), or ``name value`` / ``Name [3/10]`` (no separator), which
# counts only for step and epoch. The name must start a token (so --lr=1 or a/b=1 do not
# half-match) and the number must end one (so 12:30:01, 1.5x or 10ms are not numbers); names
# longer than 100 characters are data, not names.
SCAN = re.compile(
    r"""(?:^|(?<=[\s,;({\[|'"]))([A-Za-z_][\w@./-]{0,99}+)['"]?(?:([=:])[ \t]*|[ \t]+)\[?[ \t]*("""
    + NUMBER
    + r""")(?:/\d+)?(?=[\s,;|)\]}'"%]|$)"""
)
CONTEXT = {**{k: "step" for k in STEP_KEYS}, **{k: "epoch" for k in EPOCH_KEYS}}
STEP, EPOCH, METRIC, DEF = 0, 1, 2, 3
# (kind, name start, name end, JSON name or None when the name has digits, number start, number end)
Match = tuple[int, int, int, "str | None", int, int]


@dataclass(frozen=True)
class Ignored:
    """The names the pick-up leaves out: exact names (any case) and globs."""

    names: frozenset[str]
    globs: tuple[str, ...] = ()

    @classmethod
    def of(cls, patterns: Iterable[str]) -> "Ignored":
        words = [p.strip().lower() for p in patterns if p.strip()]
        return cls(frozenset(w for w in words if not any(c in w for c in "*?[")),
                   tuple(w for w in words if any(c in w for c in "*?[")))

    @classmethod
    def from_setting(cls, text: str | None) -> "Ignored":
        """``metrics_ignore``: empty means the defaults; ``+a,b`` adds to them; ``a,b`` replaces them."""
        text = (text or "").strip()
        if not text:
            return DEFAULT_IGNORED
        if text.startswith("+"):
            return cls.of([*IGNORED, *text[1:].split(",")])
        return cls.of(text.split(","))

    def __contains__(self, low: object) -> bool:
        return isinstance(low, str) and (low in self.names or any(fnmatch.fnmatchcase(low, g) for g in self.globs))


DEFAULT_IGNORED = Ignored.of(IGNORED)


def digit_agnostic(pattern: str) -> bool:
    """Does the regex treat every digit alike? True when its only digits are in ``0-9``
    ranges (``\\d`` has none): then its matches in a line depend only on the line's shape."""
    return not any(c.isdigit() for c in pattern.replace("0-9", ""))


def maybe_context(line: str) -> bool:
    """Could ``line`` name a step or an epoch? (Cheap substring tests before the regex.)"""
    low = line.lower()
    return "step" in low or "epoch" in low or "iter" in low


def looks_like_a_metric(shape: str, found: "re.Match[str]", ignored: Ignored) -> bool:
    """Is this ``name=value`` / ``name: value`` of the scan a metric (see the module docstring)?"""
    name, sep = found.group(1), found.group(2)
    if not sep or name.lower() in ignored or _SOURCE.search(name):
        return False
    if shape.startswith("%|", found.end(3)):  # a progress bar's percentage
        return False
    if sep == ":" and shape[:found.start(1)].strip() == '"' and shape[found.end(3):].strip() in ("", ","):
        return False  # a line of pretty-printed JSON: a configuration's dump
    return sep != ":" or not _label(shape, found.start(1))


def _label(shape: str, start: int) -> bool:
    """Is the name at ``start`` the last word of a label of several words that starts its line or
    its field (``Trainable params: 5``, ``Writing model shards: 100%``, ``Modules in train mode: 1``)?"""
    at = start
    while at > 0 and (shape[at - 1].isalpha() or shape[at - 1] in " -_"):
        at -= 1
    words = shape[at:start].split()
    return bool(words) and (at == 0 or shape[at - 1] in _FIELD_STARTS)


_FIELD_STARTS = "|[(<>,;:\u2022\t"


def plan_shape(shape: str, shape_defs: Sequence[tuple["re.Pattern[str]", str]], def_names: frozenset[str],
               ignored: Ignored) -> tuple[Match, ...]:
    """What the digit-agnostic definitions and the scan find in a line of this shape (digits
    replaced by 0): per match its kind, the name's span, its JSON name (None if the name has
    digits), and the number's span.

    Those regexes treat all digits alike, so lines of one shape have their names and numbers at
    the same places: they run once per shape, not once per line.
    """
    plan: list[Match] = []
    taken: list[tuple[int, int]] = []
    for rx, def_name in shape_defs:
        for d in rx.finditer(shape):
            if d.group(1) is not None:
                plan.append((DEF, 0, 0, def_name, *d.span(1)))
                taken.append(d.span(1))
    for m in SCAN.finditer(shape):
        name, number = m.group(1), m.group(3)
        key = CONTEXT.get(name.lower())
        if key is not None:
            if number.isdigit():
                plan.append((STEP if key == "step" else EPOCH, 0, 0, None, *m.span(3)))
            continue
        if not looks_like_a_metric(shape, m, ignored):
            continue
        start, end = m.span(3)
        if any(s < end and start < e for s, e in taken):
            continue  # a definition reports this number
        known: str | None = None
        if "0" not in name:
            if name in def_names:
                continue
            known = name
        plan.append((METRIC, *m.span(1), known, *m.span(3)))
    return tuple(plan)


def names_in(line: str, ignored: Ignored = DEFAULT_IGNORED) -> list[str]:
    """The metric names the pick-up takes from ``line``, in order (no step or epoch)."""
    shape = line.translate(_TEXT_DIGITS)
    return list(dict.fromkeys(line[ns:ne] for kind, ns, ne, _, _, _ in plan_shape(shape, (), frozenset(), ignored)
                              if kind == METRIC))


_TEXT_DIGITS = str.maketrans("123456789", "000000000")
