"""The listings of ``ps``, the dashboard, ``usage``, ``rm`` and ``prune`` (store/listing.py) give
the same answers on both engines: filters (states, a name glob, tags, search, user, projects),
sorts and their cursors, counts, sums by group, deletion. Each answer is checked against the
rows computed in Python, so a dialect that differs (GLOB, instr, a day, NULL order) fails."""

from __future__ import annotations

import fnmatch
import time

import pytest

from phalanx.store import Store
from phalanx.store.listing import (Filter, Sort, count_jobs, delete_jobs, metric_names, metrics_of, old_jobs, page_jobs,
                                   page_sweeps, save_metrics, set_tags, tag_keys, tags_of, trial_states, usage_sum,
                                   usage_totals)

NAMES = ["resnet-a", "resnet-b", "bert", "Bert-large", "gpt[2]", "x*y", "line\nbreak", "café", "resnet?"]
DAY = 86_400.0


@pytest.fixture
def filled(store_at):
    store = Store(store_at)
    base = 1_700_000_000.0
    rows = []
    for i in range(60):
        rows.append(dict(id=f"{i:04x}abcd", name=NAMES[i % len(NAMES)], backend="local" if i % 3 else "ssh", nnodes=1,
                         nproc_per_node=1, command=f"train.py --seed {i}" if i % 4 else "EVAL.py", job_dir="/tmp/x",
                         spec_json="{}", created_at=base + (i // 2) * DAY / 3, state=("RUNNING", "SUCCEEDED", "FAILED")[i % 3],
                         gpu_hours=None if i % 5 == 0 else float(i % 7), cpu_hours=float(i), cost=None,
                         sweep_id="5eed0001" if i % 10 == 9 else None, trial=i if i % 10 == 9 else None,
                         user_name=None if i % 11 == 0 else f"user{i % 3}", project="vision" if i % 4 == 0 else "default"))
    store.insert_jobs(rows)
    store.sweeps.insert(id="5eed0001", name="sw", strategy="grid", command="t.py", topology="1x1", spec_json="{}",
                        settings_json="{}", sweep_dir="/tmp/s", created_at=base + 5, user_name="user1")
    store.sweeps.insert(id="5eed0002", name="sw2", strategy="grid", command="t.py", topology="1x1", spec_json="{}",
                        settings_json="{}", sweep_dir="/tmp/s", created_at=base + 6, state="SUCCEEDED", project="vision")
    for r in rows[:30]:
        set_tags(store, r["id"], {"team": "vision" if r["trial"] is None and int(r["id"][:4], 16) % 2 else "nlp"})
        save_metrics(store, r["id"], {"loss": {"last": (int(r["id"][:4], 16) * 7) % 11 / 10, "min": 0.0, "max": 1.0,
                                               "count": 3, "last_step": 2}})
    return store, rows


def _all(store, f, sort=Sort(), limit=7):
    """Every page of a listing, following the cursors."""
    seen, after = [], None
    while True:
        page = page_jobs(store, f, sort, limit, after)
        seen += [r.id for r in page.rows]
        if page.next is None:
            return seen
        after = page.next


def _newest(rows):
    return [r["id"] for r in sorted(rows, key=lambda r: (r["created_at"], r["id"]), reverse=True)]


def test_filters_answer_alike_on_both_engines(filled):
    store, rows = filled
    top = [r for r in rows if r["sweep_id"] is None]
    assert _all(store, Filter()) == _newest(top)
    for pattern in ("resnet*", "resnet?", "[bB]ert*", "gpt[[]2]", "x[*]y", "*\n*", "caf?", "[^r]*", "*"):
        want = [r for r in top if fnmatch.fnmatchcase(r["name"], pattern.replace("[^", "[!"))]
        assert _all(store, Filter(name=pattern)) == _newest(want), pattern
    assert _all(store, Filter(name="bert")) == _newest([r for r in top if r["name"] == "bert"])
    assert _all(store, Filter(states=("FAILED",))) == _newest([r for r in top if r["state"] == "FAILED"])
    assert _all(store, Filter(states=("RUNNING", "SUCCEEDED"))) == _newest([r for r in top if r["state"] != "FAILED"])
    assert _all(store, Filter(search="EVAL")) == _newest([r for r in top if "eval" in r["command"].lower()])
    assert _all(store, Filter(search="ber")) == _newest([r for r in top if "ber" in r["name"].lower()])
    assert _all(store, Filter(search="0aab")) == _newest([r for r in top if "0aab" in r["id"]])
    assert _all(store, Filter(user="user1")) == _newest([r for r in top if r["user_name"] == "user1"])
    assert _all(store, Filter(projects=("vision",))) == _newest([r for r in top if r["project"] == "vision"])
    assert _all(store, Filter(backend="ssh", since=rows[30]["created_at"])) == _newest(
        [r for r in top if r["backend"] == "ssh" and r["created_at"] >= rows[30]["created_at"]])
    tagged = tags_of(store, [r["id"] for r in top])
    assert _all(store, Filter(tags=(("team", "vision"),))) == _newest([r for r in top if tagged.get(r["id"], {}).get("team") == "vision"])
    assert _all(store, Filter(tags=(("team", None),))) == _newest([r for r in top if r["id"] in tagged])
    assert _all(store, Filter(sweep="5eed0001")) == _newest([r for r in rows if r["sweep_id"] == "5eed0001"])
    assert count_jobs(store, Filter(states=("RUNNING",))) == sum(1 for r in top if r["state"] == "RUNNING")
    assert count_jobs(store, Filter(user="user2", projects=("default",))) == sum(
        1 for r in top if r["user_name"] == "user2" and r["project"] == "default")


def test_sorts_and_their_cursors_answer_alike(filled):
    store, rows = filled
    top = [r for r in rows if r["sweep_id"] is None]
    for key, value in (("name", lambda r: r["name"].encode()), ("state", lambda r: r["state"]),
                       ("backend", lambda r: r["backend"]), ("gpu_hours", lambda r: -1 if r["gpu_hours"] is None else r["gpu_hours"])):
        for descending in (False, True):
            want = [r["id"] for r in sorted(top, key=lambda r: (value(r), r["id"]), reverse=descending)]
            assert _all(store, Filter(), Sort(key, descending)) == want, (key, descending)
    summaries = metrics_of(store, [r["id"] for r in top])
    have = [r for r in top if r["id"] in summaries]
    want = [r["id"] for r in sorted(have, key=lambda r: (summaries[r["id"]]["loss"]["last"], r["id"]))]
    assert _all(store, Filter(), Sort("metric", False, "loss", "last"), limit=4) == want
    assert metric_names(store) == ["loss"] and tag_keys(store) == ["team"]
    sweeps = page_sweeps(store, Filter(), Sort(), 10).rows
    assert [s.id for s in sweeps] == ["5eed0002", "5eed0001"] and sweeps[1].user_name == "user1"
    assert [s.id for s in page_sweeps(store, Filter(user="user1"), Sort(), 10).rows] == ["5eed0001"]
    assert [s.id for s in page_sweeps(store, Filter(projects=("vision",)), Sort(), 10).rows] == ["5eed0002"]


def test_usage_sums_counts_and_deletion_answer_alike(filled):
    store, rows = filled
    by_user = {g["group"]: g for g in usage_totals(store, "user")}
    assert by_user["-"]["jobs"] == sum(1 for r in rows if r["user_name"] is None)
    assert by_user["user1"]["gpu_hours"] == sum(r["gpu_hours"] or 0 for r in rows if r["user_name"] == "user1")
    days = usage_totals(store, "day")
    assert sum(g["jobs"] for g in days) == len(rows)
    assert all(len(g["group"]) == 10 and g["group"][4] == "-" for g in days), days
    assert len(days) == len({time.strftime("%Y-%m-%d", time.localtime(r["created_at"])) for r in rows}) or \
        store.engine.kind == "postgresql"  # PostgreSQL's day is the session's TimeZone (UTC here), not local
    names = [g["group"] for g in usage_totals(store, "name")]
    assert "sw" in names, "a sweep's trials count under its name"
    gpu = [g["gpu_hours"] for g in usage_totals(store, "backend")]
    assert gpu == sorted(gpu, reverse=True)
    trials = [r for r in rows if r["sweep_id"] == "5eed0001"]
    assert trial_states(store, "5eed0001") == {s: sum(1 for r in trials if r["state"] == s) for s in {r["state"] for r in trials}}
    assert usage_sum(store, sweep_id="5eed0001")["cpu_hours"] == sum(r["cpu_hours"] for r in trials)
    old = old_jobs(store, rows[20]["created_at"], ("SUCCEEDED", "FAILED"))
    assert [r.id for r in old] == [r["id"] for r in sorted(rows, key=lambda r: (r["created_at"], r["id"]))
                                   if r["sweep_id"] is None and r["created_at"] < rows[20]["created_at"] and r["state"] != "RUNNING"]
    gone = [r.id for r in old]
    assert delete_jobs(store, gone) == len(gone)
    assert not metrics_of(store, gone) and not tags_of(store, gone)
    assert store.count() == len(rows) - len(gone)
    draws = store.new_id()
    assert draws not in gone
