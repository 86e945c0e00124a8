"""Read models the dashboard serves as JSON: deployments, bench history, eval runs, doctor.

Every read of another feature's tables goes through this module, so when their schemas move
only this file follows. The results are plain JSON-ready dicts; nothing here writes, except the
two explicit actions at the end (down, restart), which call the lifecycle's library functions
exactly like ``sparkfleet down`` / ``sparkfleet up``.
"""

from __future__ import annotations

import time
from typing import Any

from sparkfleet.apply import observe
from sparkfleet.apply.down import down
from sparkfleet.apply.restart import restart
from sparkfleet.bench.report import TierSummary, summarize
from sparkfleet.bench.store import BenchStore, StoredRun
from sparkfleet.doctor.history import last_doctor
from sparkfleet.errors import NotFoundError, SparkfleetError
from sparkfleet.evals.compare import compare_runs
from sparkfleet.evals.needle import NeedleRun
from sparkfleet.evals.results import QualityRun
from sparkfleet.evals.store import list_runs, load_run
from sparkfleet.nodes.fanout import fan_out
from sparkfleet.nodes.transport import Connector, transport_for
from sparkfleet.state.deployments import Deployment, Deployments
from sparkfleet.state.store import Store

LOG_TAIL = 8  # log lines per rank on the deployments page
LIVE = ("starting", "ready", "failed", "stopping")  # statuses worth asking the nodes about


NotFound = NotFoundError  # a run or deployment the page asked for is not in the store


# ---------------------------------------------------------------- deployments


def _deployment_head(d: Deployment) -> dict[str, Any]:
    return {
        "name": d.name,
        "engine": d.engine,
        "recipe": d.recipe,
        "cluster": d.cluster,
        "endpoint": d.endpoint,
        "served_model": d.served_model,
        "status": d.status,
        "created": d.created,
        "updated": d.updated,
        "ready_at": d.ready_at,
    }


def deployments(store: Store) -> list[dict[str, Any]]:
    """Every recorded deployment, newest first, with each rank's live status and last log lines.

    Stopped deployments are not inspected (their ranks are gone); their ranks show as recorded.
    """
    records = Deployments(store)
    found = records.all()
    # Each deployment's nodes answer in their own time: ask them all at once.
    by_name = {d.name: d for d in found}
    live = fan_out(by_name, lambda name: _ranks(by_name[name]), workers=8).raise_first()
    ranks = [live[d.name] for d in found]
    return [
        {**_deployment_head(d), "ranks": r, "events": records.events(d.name, limit=5)}
        for d, r in zip(found, ranks, strict=True)
    ]


def _ranks(d: Deployment) -> list[dict[str, Any]]:
    if d.status not in LIVE:
        return [
            {"rank": r.rank, "node": r.node.name, "host": r.node.host, "runtime": r.runtime,
             "state": d.status, "uptime": None, "health": "-", "detail": "", "log": []}
            for r in d.ranks
        ]  # fmt: skip
    try:
        live = observe.status(d)
        logs = observe.logs(d, tail=LOG_TAIL)
    except SparkfleetError as exc:
        return [
            {"rank": r.rank, "node": r.node.name, "host": r.node.host, "runtime": r.runtime,
             "state": "unknown", "uptime": None, "health": "-", "detail": str(exc), "log": []}
            for r in d.ranks
        ]  # fmt: skip
    return [
        {
            "rank": s.rank,
            "node": s.node,
            "host": s.host,
            "runtime": s.runtime,
            "state": s.state,
            "uptime": s.uptime,
            "health": s.health,
            "detail": s.detail,
            "log": logs.get(s.rank, "").splitlines()[-LOG_TAIL:],
        }
        for s in live
    ]


def down_deployment(store: Store, name: str) -> list[str]:
    """Stop every rank of a recorded deployment, like ``sparkfleet down NAME``."""
    records = Deployments(store)
    return down(records.require(name), deployments=records)


def restart_deployment(store: Store, name: str, connect: Connector = transport_for) -> str:
    """Stop the deployment and bring its stored Plan up again (``apply.restart.restart``, as a
    watch restart does); returns the endpoint once it serves again."""
    records = Deployments(store)
    return restart(records.require(name), records=records, connect=connect).endpoint


# ---------------------------------------------------------------- bench


def _bench_head(run: StoredRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "kind": run.kind,
        "status": run.status,
        "created_at": run.created_at,
        "label": run.label,
        "endpoint": run.endpoint,
        "model": run.model,
        "engine": run.engine,
        "deployment": run.deployment,
    }


def bench_runs(store: Store, limit: int = 200) -> list[dict[str, Any]]:
    """Stored bench runs, newest first."""
    return [_bench_head(r) for r in BenchStore(store).list_runs(limit=limit)]


def _point(t: TierSummary) -> dict[str, Any]:
    return {"median": t.headline.median, "low": t.headline.low, "high": t.headline.high, "runs": t.runs,
            "failed": t.failed}  # fmt: skip


def bench_run(store: Store, run_id: int) -> dict[str, Any]:
    """One run's chart series: decode tok/s by concurrency per prompt type, or prefill tok/s by length.

    Each point is the median over the tier's measured repeats (decode: the steady aggregate
    tok/s; prefill: prompt tok/s), as ``sparkfleet bench show`` reports it.
    """
    bench = BenchStore(store)
    try:
        run = bench.get_run(run_id)
    except SparkfleetError as exc:
        raise NotFound(str(exc)) from exc
    tiers = summarize(run, bench.samples(run_id, with_requests=False))
    out = _bench_head(run)
    if run.kind == "decode":
        series: dict[str, list[dict[str, Any]]] = {}
        for t in tiers:
            series.setdefault(t.prompt_type or "?", []).append({"x": t.concurrency, **_point(t)})
        out["series"] = series
        out["x_label"] = "concurrency"
    elif run.kind == "serve":
        # x is the achieved rate: finite even for the inf tier, and what the server really got.
        out["series"] = {
            "output tok/s": [{"x": t.figures["achieved_rate"].median, "tier": t.tier, **_point(t)} for t in tiers]
        }
        out["x_label"] = "achieved requests/s"
    else:
        out["series"] = {"prefill": [{"x": t.length, **_point(t)} for t in tiers]}
        out["x_label"] = "prompt tokens"
    out["y_label"] = "tok/s"
    return out


# ---------------------------------------------------------------- evals


def eval_runs(store: Store, kind: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Stored quality and needle runs, newest first."""
    return [
        {"id": r.id, "kind": r.kind, "label": r.label, "endpoint": r.endpoint, "model": r.model,
         "created_utc": r.created_utc, "passed": r.passed, "total": r.total}
        for r in list_runs(store, kind=kind, limit=limit)
    ]  # fmt: skip


def _load(store: Store, run_id: str, kind: str) -> dict[str, Any]:
    try:
        return load_run(store, run_id, kind=kind, files=False)  # by id or label: never a path on this machine
    except SparkfleetError as exc:
        raise NotFound(str(exc)) from exc


def quality_run(store: Store, run_id: str) -> dict[str, Any]:
    """Per-category pass rates and every task's outcome."""
    run = QualityRun.from_json(_load(store, run_id, "quality"))
    return {
        "id": run.id,
        "label": run.label,
        "model": run.model,
        "endpoint": run.endpoint,
        "api": run.api,
        "started_utc": run.started_utc,
        "passed": run.passed,
        "total": run.total,
        "categories": [
            {"category": cat, "passed": p, "total": n, "rate": p / n} for cat, (p, n) in run.by_category().items()
        ],
        "tasks": [{"id": r.id, "category": r.category, "passed": r.passed, "why": r.why} for r in run.results],
    }


def quality_compare(store: Store, a: str, b: str) -> dict[str, Any]:
    """Both runs' category rates, the tasks that flipped and the verdict (B judged against A)."""
    run_a = QualityRun.from_json(_load(store, a, "quality"))
    run_b = QualityRun.from_json(_load(store, b, "quality"))
    cmp = compare_runs(run_a, run_b)
    return {
        "a": quality_run(store, a),
        "b": quality_run(store, b),
        "paired": cmp.paired,
        "flips": [{"id": f.id, "category": f.category, "direction": f.direction, "why": f.why} for f in cmp.flips],
        "blocks": [
            {
                "name": s.name,
                "both_pass": s.both_pass,
                "broke": s.broke,
                "fixed": s.fixed,
                "both_fail": s.both_fail,
                "p": s.p,
            }
            for s in cmp.blocks
        ],
        "verdict": cmp.verdict,
    }


def needle_run(store: Store, run_id: str) -> dict[str, Any]:
    """The heatmap grid: one row per depth, one cell per length (None where not run)."""
    run = NeedleRun.from_json(_load(store, run_id, "needle"))
    grid = []
    for depth in run.depths:
        row = []
        for length in run.lengths:
            c = run.cell(length, depth)
            row.append(None if c is None else {"passed": c.passed, "tokens": c.tokens, "answer": c.answer[:80],
                                               "expected": c.expected})  # fmt: skip
        grid.append({"depth": depth, "cells": row})
    return {
        "id": run.id,
        "label": run.label,
        "model": run.model,
        "started_utc": run.started_utc,
        "lengths": list(run.lengths),
        "depths": list(run.depths),
        "skipped_lengths": list(run.skipped_lengths),
        "passed": run.passed,
        "total": run.total,
        "effective_length": run.effective_length,
        "grid": grid,
    }


# ---------------------------------------------------------------- doctor


def doctor(store: Store) -> list[dict[str, Any]]:
    """Each node's checks from its last ``sparkfleet doctor`` run, failures first."""
    order = {"fail": 0, "warn": 1, "pass": 2}
    now = time.time()
    return [
        {"node": d.node, "run_at": d.run_at, "age_s": now - d.run_at, "seconds": d.seconds, "recipe": d.recipe,
         "counts": d.counts(), "checks": sorted(d.checks, key=lambda c: order.get(c.get("status", ""), 3))}
        for d in last_doctor(store)
    ]  # fmt: skip


def fabric(store: Store) -> dict[str, Any] | None:
    """The last `doctor --fabric` matrix for the heatmap: each direction's Mbit/s with its share of
    the fleet's median, the floor a direction fails below, and the pairs' other figures."""
    from sparkfleet.doctor.history import last_fabric

    report = last_fabric(store)
    if report is None:
        return None
    median = report.get("median_mbps")
    fraction = (report.get("thresholds") or {}).get("fraction", 0.7)
    cells = []
    for p in report.get("pairs", []):
        for src, dst, rate in ((p["a"], p["b"], p.get("forward_mbps")), (p["b"], p["a"], p.get("reverse_mbps"))):
            share = rate / median if rate is not None and median else None
            cells.append({"src": src, "dst": dst, "mbps": rate, "share": share,
                          "below": share is not None and share < fraction})  # fmt: skip
    rdma_median = report.get("rdma_median_gbps")
    rdma_cells = []
    for p in report.get("pairs", []):
        if p.get("rdma_hcas"):
            rate, expected = p.get("rdma_gbps"), p.get("rdma_expected_gbps")
            share = rate / rdma_median if rate is not None and rdma_median else None
            low = (share is not None and share < fraction) or (
                rate is not None and bool(expected) and rate < fraction * expected
            )
            rdma_cells.append({"src": p["a"], "dst": p["b"], "gbps": rate, "share": share, "below": bool(low),
                               "expected_gbps": expected, "lat_us": p.get("rdma_lat_us")})  # fmt: skip
    return {"run_at": report.get("run_at"), "age_s": time.time() - (report.get("run_at") or time.time()),
            "rdma_median_gbps": rdma_median, "rdma_cells": rdma_cells,
            "nodes": report.get("nodes", []), "median_mbps": median, "fraction": fraction, "cells": cells,
            "failed": [c for c in report.get("checks", []) if c.get("status") == "fail"],
            "seconds_per_test": report.get("seconds_per_test")}  # fmt: skip


# ---------------------------------------------------------------- A/B experiments


def experiments(store: Store, limit: int = 100) -> list[dict[str, Any]]:
    """Stored A/B experiments, newest first, with each one's verdict per metric."""
    from sparkfleet.experiments.store import Experiments

    out = []
    for e in Experiments(store).all(limit):
        metrics = (e.report or {}).get("metrics", [])
        out.append({"id": e.id, "created": e.created, "recipe": e.recipe, "deployment": e.name,
                    "variants": list(e.variants), "status": e.status, "rounds": (e.report or {}).get("rounds", 0),
                    "rounds_planned": e.rounds,
                    "verdicts": {m["name"]: m["verdict_text"] for m in metrics}})  # fmt: skip
    return out


def experiment(store: Store, experiment_id: int) -> dict[str, Any]:
    """One experiment's report (metrics with both variants' per-round values, quality, rule)."""
    from sparkfleet.experiments.store import Experiments

    try:
        found = Experiments(store).get(experiment_id)
    except SparkfleetError as exc:
        raise NotFound(str(exc)) from exc
    return found.report or {"experiment": found.id, "status": found.status, "metrics": [], "note": found.note}
