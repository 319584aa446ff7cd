"""Flax is lsjax's model layer: the target and every draft are linen modules, run through `init` / `apply`.

A model subclasses `Model` and states its parameters once, in `schema()` ({path: ParamSpec}: shape, dtype, one
logical axis per dimension, how random init fills it). Its methods read them with `self.weights()`:

* under `init`, `weights()` declares them (`self.param`, random values, each boxed as `nn.LogicallyPartitioned`
  with its logical axes), so `model.init(key, method="weights")` gives the variables with Flax's partitioning
  metadata, and a user's module that holds an lsjax model as a submodule gets them under its name;
* under `apply`, `weights()` returns the variables passed in. The target also runs from its decode layouts
  (`lsjax.models.target.prepare_for_decode`, a documented transformation of these variables), so the read is
  not tied to the declared tree; `check_variables` checks a tree against the declaration where one enters.

Why linen and not NNX (docs/design/flax.md): the engine's programs are pure functions of a params pytree that
is donated, sharded and stored; `apply(variables, ...)` is exactly that call, with the module a frozen, hashable
config that can be a static argument, and loaders fill a dict. NNX's split/merge would give the same pair at
the price of a graph walk in every traced step and a second object model beside it.

Sharding: `logical_axes(model)` reads the partitioning metadata of the declared variables (abstractly: nothing
is allocated) and `lsjax.sharding` maps it to mesh axes; no other table of axes exists.
"""

from __future__ import annotations

from collections.abc import Mapping

import flax.linen as nn
import jax
import numpy as np

from lsjax.errors import ShapeMismatchError
from lsjax.models.layers import ParamSpec, flatten, unflatten


class Model(nn.Module):
    """An lsjax model as a linen module: `schema()` declares its parameters, `weights()` reads them."""

    def schema(self) -> dict[str, ParamSpec]:
        """{path: ParamSpec} of every parameter ("a/b" nests b under a)."""
        raise NotImplementedError

    def random_weights(self, key: jax.Array) -> dict:
        """Random values for `schema()` as a nested dict (what `init` stores). Models override it to keep the
        key order their tests' tiny models were made with."""
        from lsjax.models.layers import init_from_specs

        specs = self.schema()
        keys = dict(zip(specs, jax.random.split(key, len(specs))))
        return init_from_specs(specs, keys, 0.02)

    def setup(self):
        # Only `init` declares (random values, boxed with their logical axes): `apply` may pass a decode layout,
        # which `self.param`'s shape check against the declaration would refuse.
        if self.is_initializing():
            specs = self.schema()
            values = flatten(self.random_weights(self.make_rng("params")))
            boxed = unflatten(
                {path: nn.LogicallyPartitioned(values[path], spec.logical_axes) for path, spec in specs.items()}
            )
            for name, tree in boxed.items():
                self.param(name, lambda _, tree=tree: tree, unbox=False)

    def weights(self) -> dict:
        """This module's parameters: declared under `init`, the passed variables under `apply`."""
        return nn.meta.unbox(dict(self.variables.get("params", {})))


def abstract_variables(model: Model) -> dict:
    """`model`'s declared params as shapes (`jax.ShapeDtypeStruct` leaves, boxed with their logical axes)."""
    return jax.eval_shape(lambda: model.init(jax.random.key(0), method="weights"))["params"]


def logical_axes(model: Model) -> dict:
    """{path: logical axes} of `model`'s parameters, read from the Flax partitioning metadata it declares."""
    boxed = abstract_variables(model)
    leaves = jax.tree_util.tree_leaves_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    return {_path(p): tuple(leaf.names) for p, leaf in leaves}


def shapes(model: Model) -> dict:
    """{path: shape} of `model`'s declared parameters."""
    boxed = nn.meta.unbox(abstract_variables(model))
    return {_path(p): tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(boxed)}


def _path(key_path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)


def variables_problem(model: Model, params, what: str = "") -> str | None:
    """Why `params` (a params collection, boxed or not) cannot be `model`'s declared parameters: one line naming
    the variable path and both shapes, or None. Shapes only, so it is free at trace time."""
    if not isinstance(params, Mapping):
        return f"expected {what or type(model).__name__}'s params (a {{name: array}} dict), got {type(params).__name__}"
    want = shapes(model)
    got = {path: tuple(np.shape(x)) for path, x in flatten(dict(nn.meta.unbox(dict(params)))).items()}
    owner = what or type(model).__name__
    if missing := sorted(want.keys() - got.keys()):
        return f"{owner}: variable {missing[0]} is missing (the module declares shape {want[missing[0]]})"
    if extra := sorted(got.keys() - want.keys()):
        return f"{owner}: variable {extra[0]} (shape {got[extra[0]]}) is not a parameter of this module"
    for path, shape in want.items():
        if got[path] != shape:
            return f"{owner}: variable {path} has shape {got[path]}, the module declares {shape}"
    return None


def check_variables(model: Model, params, what: str = "") -> None:
    """`variables_problem` as a `ShapeMismatchError`."""
    if problem := variables_problem(model, params, what):
        raise ShapeMismatchError(problem)
