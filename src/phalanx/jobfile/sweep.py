"""A search space in the script's arguments + the sweep options -> sweep settings, checked
before any trial starts (an objective nothing prints would waste every trial)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..core.options import SWEEP_OPTIONS
from ..core.spec import JobSpec
from ..errors import UsageError
from .values import RunOptions, Values, resolve


def build_sweep(opts: RunOptions, spec: JobSpec, values: Values | None = None) -> tuple[JobSpec, Any]:
    """Find a search space in the script args. Returns the spec (literal escapes applied) and
    the sweep settings, or None when the job is not a sweep. Validates before anything starts."""
    from ..sweeps.space import parse_space

    v = values or resolve(opts)
    space = parse_space(spec.entrypoint.args)
    spec = spec.with_(entrypoint=replace(spec.entrypoint, args=space.args))
    given = [k for k in SWEEP_OPTIONS if v.given(k)]
    if not space.is_sweep:
        if given:
            raise UsageError(f"{v.where(given[0])} needs a search space in the script arguments",
                             'e.g. --lr "[0.001, 0.01]" or --lr "loguniform(1e-5, 1e-1)"')
        return spec, None
    from ..sweeps.settings import SweepSettings, check, parse_objective

    objective, direction = parse_objective(v["objective"])
    settings = SweepSettings(
        strategy=str(v["strategy"] or ("grid" if space.all_discrete else "random")), trials=v["trials"],
        seed=v["seed"] if v.given("seed") else None, objective=objective, direction=direction,
        early_stop=v["early_stop"], parallel=v["parallel"], fail_fast=bool(v["fail_fast"]),
    )
    check(spec, space, settings)
    if objective:
        from .objective import check_objective

        check_objective(spec, objective)
    return spec, settings
