"""What a deployment was brought up from, recorded with its gate, and ``rollback`` to the last
configuration that passed it. ``up`` records every outcome here, whoever calls it: the CLI, ``ab``
and ``rollback`` pass the ConfigSpec they planned from; callers holding only a Plan record what
the Plan (or the restarted instance's own record) says."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkfleet.config import recipe as recipes
from sparkfleet.config.cluster import load_cluster
from sparkfleet.config.secrets import MASK, is_secret, redact, split_secret_sets
from sparkfleet.config.validation import masked_secrets
from sparkfleet.config.variants import BASE, apply_variant
from sparkfleet.errors import NotFoundError, RecipeError, SparkfleetError, UsageError
from sparkfleet.plan.build import plan
from sparkfleet.plan.model import Overrides, Plan
from sparkfleet.state.deployments import Deployments
from sparkfleet.state.history import Configuration, History
from sparkfleet.state.store import Store

if TYPE_CHECKING:
    from sparkfleet.apply.up import UpResult
    from sparkfleet.nodes.transport.base import Transport

# up, down and the image reader (and httpx, SSH, the runtimes behind them) are imported where they
# are used: `sparkfleet up` plans and opens its node sessions first, and the nodes' agents boot
# while this process loads them (see cli/lifecycle.py).


@dataclass(frozen=True)
class ConfigSpec:
    """Everything a plan is made from, as the user gave it."""

    recipe: Path
    variant: str = BASE
    sets: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cluster: Path | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        # `--set env.X_TOKEN=…` is an --env given another way: masked and never stored.
        sets, env = split_secret_sets(self.sets)
        if env:
            object.__setattr__(self, "sets", sets)
            object.__setattr__(self, "env", (*env, *self.env))

    @property
    def deployment(self) -> str:
        return self.name or recipes.deployment_name(self.recipe)

    def plan(self) -> Plan:
        recipe = recipes.load_recipe(self.recipe, self.sets, self.variant)
        return plan(recipe, load_cluster(self.cluster), recipes.deployment_name(self.recipe),
                    Overrides(env=self.env, name=self.name))  # fmt: skip

    @classmethod
    def of_plan(cls, planned: Plan) -> ConfigSpec:
        """What a Plan says of how it was made (no --set or --env: a Plan does not keep them)."""
        cluster = None if planned.cluster_source.startswith("(") else Path(planned.cluster_source)
        return cls(Path(planned.recipe_source), planned.variant, (), (), cluster, planned.name)


def spec_of_instance(name: str, instance: str | None, store: Store) -> ConfigSpec | None:
    """The ConfigSpec an instance was recorded with (secret --env values masked), or None."""
    config = History(store).current(name, instance)
    return _spec_of(config, config.env) if config is not None else None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _image_ids(planned: Plan, transports: Mapping[str, Transport]) -> dict[str, str | None]:
    from sparkfleet.apply.images import image_ids

    docker = [r for r in planned.ranks if r.runtime == "docker" and r.image]
    if not docker:
        return {}
    return dict(image_ids({r.node.name: transports[r.node.name] for r in docker}, docker[0].image or ""))


def record(spec: ConfigSpec, planned: Plan, ready: bool, store: Store, transports: Mapping[str, Transport],
           note: str | None = None) -> int:  # fmt: skip
    """Record an up of spec (ready: it passed verify and smoke); returns the configuration's id."""
    try:
        file = recipes.recipe_file(spec.recipe)
        digest, data, source = _digest(file), masked_secrets(recipes.read_toml(file)), str(file.resolve())
    except (SparkfleetError, OSError) as exc:  # a Plan made from a recipe that is gone since
        digest, data, source = "", {}, str(spec.recipe)
        note = (note or "") + f" (recipe not read: {exc})"
    current = Deployments(store).get(planned.name)
    try:
        images = _image_ids(planned, transports) if ready else {}
    except SparkfleetError as exc:  # an unreachable node must not lose the record of what ran
        images, note = {}, (note or "") + f" (image IDs not read: {exc.message})"
    return History(store).add(
        name=planned.name, instance=current.instance if current else None, recipe=source,
        recipe_digest=digest, variant=spec.variant, sets=tuple(redact(s) for s in spec.sets),
        env=tuple((k, MASK if is_secret(k) else v) for k, v in spec.env),
        cluster=str(spec.cluster.resolve()) if spec.cluster else None,
        recipe_data=data, image_ids=images, ready=ready, note=note,
    )  # fmt: skip


def quality_gate(store: Store, name: str, passed: int, total: int, run_id: str, minimum: float | None) -> str | None:
    """Record a quality run against name's running configuration; a line saying whether the gate
    still holds (None without a recorded configuration). With ``minimum`` (a pass fraction) the run
    must reach it; without, pass as many tasks as the last earlier passing configuration did."""
    history = History(store)
    current_dep = Deployments(store).get(name)
    current = history.current(name, current_dep.instance if current_dep else None)
    if current is None:
        return None
    if minimum is not None:
        ok, rule = passed >= minimum * total, f"needs {minimum:.0%} of {total}"
    else:
        earlier = next((c for c in history.of(name) if c.id < current.id and c.passed and c.quality), None)
        floor = int(earlier.quality["passed"]) if earlier and earlier.quality else 0
        ok = passed >= floor
        rule = f"needs at least {floor}, what configuration #{earlier.id} passed" if earlier else "no earlier run"
    history.set_quality(current.id, {"run": run_id, "passed": passed, "total": total, "minimum": minimum}, ok)
    verdict = "passes" if ok else "FAILS"
    return f"{name}: configuration #{current.id} {verdict} its quality gate ({passed}/{total}; {rule})"


def _spec_of(config: Configuration, env: tuple[tuple[str, str], ...]) -> ConfigSpec:
    return ConfigSpec(Path(config.recipe), config.variant, config.sets, env,
                      Path(config.cluster) if config.cluster else None, config.name)  # fmt: skip


def _unmasked_spec_of(config: Configuration) -> ConfigSpec:
    """The ConfigSpec a recorded configuration was planned from (secret --env values from this
    environment, since they were never stored)."""
    for key, value in config.env:
        if value == MASK and key not in os.environ:
            raise UsageError(f"configuration #{config.id} was started with --env {key}; set {key} in "
                                  "this environment to roll back to it (secrets are never stored)")  # fmt: skip
    return _spec_of(config, tuple((k, os.environ[k] if v == MASK else v) for k, v in config.env))


def _contains_mask(data: Any) -> bool:
    if isinstance(data, dict):
        return any(_contains_mask(v) for v in data.values())
    if isinstance(data, list):
        return any(_contains_mask(v) for v in data)
    return data == MASK


def _plan_of(config: Configuration, spec: ConfigSpec) -> Plan:
    """The recorded configuration's plan: from the recipe file when it is unchanged, else from the
    copy recorded with it (when that copy holds no masked secret)."""
    path = Path(config.recipe)
    if path.is_file() and _digest(path) == config.recipe_digest:
        return spec.plan()
    if _contains_mask(config.recipe_data):
        raise RecipeError(f"{config.recipe} changed since configuration #{config.id} (digest "
                          f"{config.recipe_digest[:12]}) and its recorded copy has masked secrets: restore that "
                          "version of the file to roll back to it")  # fmt: skip
    source = f"{config.recipe} (as recorded in configuration #{config.id})"
    data = config.recipe_data
    set_by: dict[str, str] = {}
    if config.variant != BASE:
        data, set_by = apply_variant(data, config.variant, source)
    data = recipes.apply_sets(data, config.sets, source) if config.sets else data
    recipe = recipes.parse_recipe(data, source, config.variant, set_by).model_copy(update={"source": config.recipe})
    overrides = Overrides(env=spec.env, name=config.name)
    return plan(recipe, load_cluster(spec.cluster), recipes.deployment_name(path), overrides)


def rollback_target(name: str, store: Store) -> tuple[Configuration, Configuration | None]:
    """The last passing configuration of name other than the running one, and the running one's."""
    history = History(store)
    configs = history.of(name)
    record_ = Deployments(store).get(name)
    current = history.current(name, record_.instance if record_ else None)
    if not configs:
        raise NotFoundError(f"{name}: nothing to roll back to: no configuration of {name!r} was ever recorded "
                              "(configurations are recorded by up, ab and rollback)")  # fmt: skip
    passing = [c for c in configs if c.passed and (current is None or (c.id != current.id and c.key != current.key))]
    if not passing:
        why = ("the only configuration that passed its gate is the one running now" if any(c.passed for c in configs)
               else f"none of its {len(configs)} recorded configuration(s) passed its gate")  # fmt: skip
        raise NotFoundError(f"{name}: nothing to roll back to: {why}")
    return passing[0], current


def rollback(name: str, store: Store | None = None,
             report: Callable[[str], None] = lambda _m: None) -> tuple[Configuration, UpResult]:  # fmt: skip
    """Take name's running configuration down and bring the last passing one back up."""
    from sparkfleet.apply.down import down
    from sparkfleet.apply.up import up

    store = store or Store()
    target, current = rollback_target(name, store)
    spec = _unmasked_spec_of(target)
    planned = _plan_of(target, spec)  # before anything is stopped: a target that cannot plan stops nothing
    report(f"rolling back to {target.describe()}")
    running = Deployments(store).get(name)
    if running is not None and running.status != "stopped":
        # hold: behind a gateway, requests wait for the configuration rolled back to (apply/switch.py).
        stopped = down(running, deployments=Deployments(store), hold=True)
        report(f"took {name} down" + (f" ({current.describe()})" if current else "") + f": {len(stopped)} rank(s)")
    try:
        return target, up(planned, config=spec, deployments=Deployments(store))
    finally:
        from sparkfleet.apply.switch import release

        released = release(name, Deployments(store))
        if released:
            report(f"behind the gateway: {released.describe()}")
