"""Which function prices which strategy: built-in formulas and users' replacements, by strategy name.

Why this module exists: a strategy's cost formula registers against its
descriptor (`gnnc.plan.strategies`) with `@cost_formula(name)` in the module
of its family, and the planner asks `planner_cost` for a segment's cost; a
user's `@gnnc.register_cost(name)` (README.md: a `--plugin` module) replaces
the built-in formula of a plannable strategy wherever the planner evaluates
it. A per-layer formula is `fn(layer, shape, **options)`, a segment one
`fn(start, end, shapes, **options)`; a user's is always `fn(start, end,
shapes)`. The family modules register on import (`gnnc.passes.cost`'s
`__init__` imports them all). What the planner prices is the formula's cost
with the run's evaluation pass appended (gnnc.passes.cost.epoch).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from gnnc.errors import GnncError
from gnnc.passes.cost.epoch import with_evaluation
from gnnc.passes.cost.symbols import LayerShape, Cost
from gnnc.plan.strategies import names, strategy


Formula = Callable[..., Cost]
# (strategy name, batching) -> its built-in formula; batching is "full" or "sampled"
# (gnnc.plan.strategies.BATCHING): P3's push-pull has one of each
_FORMULAS: dict[tuple[str, str], Formula] = {}
_USER_COSTS: dict[str, Formula] = {}  # strategy name -> a user's replacement (gnnc.register_cost)


def cost_formula(name: str, batching: str = "full") -> Callable[[Formula], Formula]:
    """Decorator: the built-in formula of strategy `name` (a registered descriptor, priced once per batching)."""
    sd = strategy(name)
    if batching not in sd.batching:
        raise ValueError(f"strategy {name!r} does not train {batching!r} (its descriptor: {sd.batching})")
    if (name, batching) in _FORMULAS:
        raise ValueError(f"strategy {name!r} already has a {batching} cost formula "
                         f"({_FORMULAS[(name, batching)].__qualname__})")

    def deco(fn: Formula) -> Formula:
        _FORMULAS[(sd.name, batching)] = fn
        return fn

    return deco


def has_formula(name: str, batching: str = "full") -> bool:
    """Whether strategy `name` has a built-in formula for `batching` (every runnable strategy has one for
    each way it trains: tests/test_strategies.py)."""
    return (name, batching) in _FORMULAS


def sampled_formula(name: str) -> Formula:
    """The built-in formula of strategy `name` on sampled minibatches (gnnc.passes.cost.sampled)."""
    fn = _FORMULAS.get((name, "sampled"))
    if fn is None:
        raise ValueError(f"no sampled cost formula for strategy {name!r}")
    return fn


def register_cost(strategy_name: str) -> Callable[[Formula], Formula]:
    """Decorator: `fn(start, end, shapes) -> Cost` prices `strategy_name` for the planner.

    It replaces the built-in formula of that strategy (one of the plannable
    ones) wherever the planner evaluates it; `--explain` names the function.
    """
    if strategy_name not in names(plannable=True):
        raise GnncError(f"register_cost: '{strategy_name}' is not a strategy the planner chooses "
                        f"({', '.join(names(plannable=True))})")

    def deco(fn: Formula) -> Formula:
        _USER_COSTS[strategy_name] = fn
        return fn

    return deco


def user_cost(name: str) -> Formula | None:
    """The user's cost function of strategy `name`, None when the built-in formula prices it."""
    return _USER_COSTS.get(name)


def segment_cost(strategy_name: str, start: int, end: int, shapes: Sequence[LayerShape], **options: Any) -> Cost:
    """The built-in formula of `strategy_name` on layers [start, end) (per-layer strategies: end = start + 1),
    with the evaluation pass's stages (a whole-model strategy's stages are its own: none added).

    Built once per (strategy, span, shapes, options) and kept: a formula holds symbols only, no graph or cluster
    figure, so one compile's planner, hybrid selection and schedule, and every later compile of the same
    model, share it (building it is sympy work, evaluating it is numpy's: gnnc.passes.cost.evaluation)."""
    key = tuple(sorted(options.items()))
    try:
        return _built_segment_cost(strategy_name, start, end, tuple(shapes), key)
    except TypeError:  # an option that cannot be a key (a list): built afresh
        return _build_segment_cost(strategy_name, start, end, shapes, **options)


@functools.lru_cache(maxsize=16384)
def _built_segment_cost(strategy_name: str, start: int, end: int, shapes: tuple[LayerShape, ...],
                        options: tuple[tuple[str, Any], ...]) -> Cost:
    return _build_segment_cost(strategy_name, start, end, shapes, **dict(options))


def _build_segment_cost(strategy_name: str, start: int, end: int, shapes: Sequence[LayerShape],
                        **options: Any) -> Cost:
    fn = _FORMULAS.get((strategy_name, "full"))
    if fn is None:
        raise ValueError(f"no cost formula for strategy {strategy_name!r}")
    sd = strategy(strategy_name)
    if sd.span == "layer":
        if end != start + 1 or len(shapes) != 1:
            raise ValueError(f"{strategy_name} runs one layer at a time; got layers [{start}, {end})")
        return with_evaluation(fn(start, shapes[0], **options), start, end)
    cost = fn(start, end, shapes, **options)
    return cost if sd.whole_model else with_evaluation(cost, start, end)


def planner_cost(strategy_name: str, start: int, end: int, shapes: Sequence[LayerShape]) -> Cost:
    """What the planner prices a segment with: the user's function where one is registered, else the built-in
    (either with the evaluation pass's stages)."""
    user = _USER_COSTS.get(strategy_name)
    if user is not None:
        cost = user(start, end, shapes)
        return cost if strategy(strategy_name).whole_model else with_evaluation(cost, start, end)
    return segment_cost(strategy_name, start, end, shapes)
