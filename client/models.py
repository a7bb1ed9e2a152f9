"""The models a client process trains, built once and handed out again to each task, reset to their initial state.

A task's local update starts from a model that the task overwrites (the global weights loaded into it); building
it again for every task (a deep copy of the built-in model: every module and parameter allocated anew) cost about a
quarter of a small task's time, and at a thousand clients a task trains a handful of samples. The pool keeps one
model object per set of build arguments and restores its initial state with `load_state_dict` (parameters and
buffers copied in place), its gradients cleared and every parameter trainable again, so a task sees what a fresh
build gives it: the same values, the same mode.

Only the built-in models are kept: an imported factory may mean to be called each time. Within one task the
n-th build with given arguments gets the n-th kept model, so an algorithm that builds two models at once (one
to train, one for reference) never gets the same object twice. One pool per training thread (a `Worker`'s):
a model is used by one task at a time.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

import torch
from torch import nn

from fl_services.shared.core.config import is_import_path
from fl_services.shared.core.models import build_model

ModelFactory = Callable[..., nn.Module]


class ModelPool:
    """Built models kept across tasks, for the `kept` most recent sets of build arguments (runs of other
    models or shapes served by the same process)."""

    def __init__(self, kept: int = 8):
        self.kept = kept
        self._models: OrderedDict[Hashable, list[tuple[nn.Module, dict[str, torch.Tensor]]]] = OrderedDict()

    def for_task(self, factory: ModelFactory) -> ModelFactory:
        """`factory` as one task calls it: each call hands out a kept model of those arguments, reset, or builds
        (and keeps) one; `factory` itself where its models are not to be kept."""
        if not _reusable(factory):
            return factory
        assert isinstance(factory, partial)
        handed: dict[Hashable, int] = {}

        def build(*args: Any, **kwargs: Any) -> nn.Module:
            key = (factory.args, tuple(sorted(factory.keywords.items())), args, tuple(sorted(kwargs.items())))
            try:
                hash(key)
            except TypeError:  # unhashable options: built each time
                return factory(*args, **kwargs)
            nth = handed.get(key, 0)
            handed[key] = nth + 1
            return self._take(key, nth, partial(factory, *args, **kwargs))

        return build

    def _take(self, key: Hashable, nth: int, build: Callable[[], nn.Module]) -> nn.Module:
        models = self._models.setdefault(key, [])
        self._models.move_to_end(key)
        while len(self._models) > self.kept:
            self._models.popitem(last=False)
        if nth < len(models):
            model, initial = models[nth]
            reset(model, initial)
            return model
        model = build()
        models.append((model, {name: t.detach().clone() for name, t in model.state_dict().items()}))
        return model


def reset(model: nn.Module, initial: dict[str, torch.Tensor]) -> None:
    """`model` as it was built: its parameters and buffers `initial`, no gradients, all trainable, training mode."""
    model.load_state_dict(initial)
    for p in model.parameters():
        p.grad = None
        p.requires_grad_(True)
    model.train()


def _reusable(factory: ModelFactory) -> bool:
    return (isinstance(factory, partial) and factory.func is build_model and bool(factory.args)
            and not is_import_path(factory.args[0].name))
