"""The batched trainer's step function over flat tuples of stacked tensors, without per-step key lookups.

:func:`batched_step` builds ``step(params, buffers, inputs, targets) -> (grads, (loss, outputs))``: one
``torch.func.vmap`` of ``torch.func.grad_and_value`` of the module's forward and the task's loss, where ``params``
and ``buffers`` are tuples of stacked tensors, ``(D, *shape)`` each, in the order of the keys given. It computes
what ``vmap(grad_and_value(functional_call(...)))`` over dicts computes (the same operations in the same order,
so bit for bit the same values), with less Python around it: tuples instead of dicts for the pytree code of
``vmap`` and ``grad``, and the tensors put into the module by :class:`ModuleSlots` (each name resolved to its
owning submodule once, at build time) instead of ``functional_call``'s per-call name parsing, tie checks and
write-back. (Passing the parameters as one flat ``(D, P)`` tensor split into views inside cut the Python calls
of a step further, 2,800 to 1,300, but was slower: the split weights are not contiguous per device, and the
batching rules copy them every step.)

The returned callable is the unit a compiler may wrap (``torch.compile(step)``); its interface is the tuples
above and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import grad_and_value, vmap

Step = Callable[
    [tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor],
    tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor]],
]


class ModuleSlots:
    """Where each named parameter or buffer of a module lives: ``(submodule, "_parameters" or "_buffers",
    attribute)``, every alias of a tied tensor included, resolved once.

    :meth:`call` runs the module with the given tensors in those places and puts the module's own tensors
    back afterwards (also on error). Tensors are placed as they are (not wrapped in ``nn.Parameter``), as
    ``functional_call`` does; a forward that updates a buffer in place (BatchNorm's running statistics)
    updates the tensor passed in.
    """

    def __init__(self, model: nn.Module, names: Sequence[str]):
        self.model = model
        self.names = list(names)
        position = {name: i for i, name in enumerate(self.names)}
        aliases: dict[int, int] = {}
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name in position:
                aliases[id(tensor)] = position[name]
        self.sites: list[tuple[dict, str, int]] = []
        missing = set(self.names)
        for kind in ("_parameters", "_buffers"):
            for module_name, module in model.named_modules(remove_duplicate=False):
                table = getattr(module, kind)
                for attr, tensor in table.items():
                    if tensor is None:
                        continue
                    name = f"{module_name}.{attr}" if module_name else attr
                    index = position.get(name, aliases.get(id(tensor)))
                    if index is not None:
                        self.sites.append((table, attr, index))
                        missing.discard(name)
        if missing:
            raise ValueError(f"not parameters or buffers of the model: {sorted(missing)}")

    def call(self, tensors: Sequence[torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
        """``model(*args)`` with ``tensors[i]`` (ordered like ``names``) in place of the model's own."""
        saved = [(table, attr, table[attr]) for table, attr, _ in self.sites]
        try:
            for table, attr, index in self.sites:
                table[attr] = tensors[index]
            return self.model(*args)
        finally:
            for table, attr, original in saved:
                table[attr] = original


def batched_step(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    param_keys: Sequence[str],
    buffer_keys: Sequence[str],
) -> Step:
    """The vmapped gradient step of ``model`` with ``loss_fn`` over stacked state (see the module docstring).

    ``step(params, buffers, inputs, targets)``: ``params`` ``(D, *shape)`` per entry of ``param_keys``,
    ``buffers`` likewise per entry of ``buffer_keys``; ``inputs`` ``(batch, D, *sample_shape)`` and ``targets``
    ``(batch, D, *target_shape)`` (vmapped over dimension 1). Returns per-device gradients ordered like
    ``params`` (each ``(D, *shape)``), each device's loss ``(D,)`` and outputs ``(D, batch, ...)``. Buffers
    updated in place by the forward pass (BatchNorm's running statistics) are updated in the tensors passed.
    """
    slots = ModuleSlots(model, [*param_keys, *buffer_keys])

    def loss_and_outputs(
        params: tuple[torch.Tensor, ...], buffers: tuple[torch.Tensor, ...], inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = slots.call((*params, *buffers), inputs)
        return loss_fn(outputs, targets), outputs

    return vmap(grad_and_value(loss_and_outputs, has_aux=True), in_dims=(0, 0, 1, 1))
