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

``conv_grads="unfold"`` computes the weight gradients of 2-D convolutions differently (:class:`UnfoldConvGrads`):
under ``vmap`` a convolution with per-device weights runs as one grouped convolution, and cuDNN has no fast
weight-gradient kernel for that shape (on an H200 its generic one took 85% of the GPU time of the 64-device CNN
step). The unfold path gets each device's weight gradient from the unfolded input (im2col) and one batched
matrix product over devices instead; the forward pass and the input gradient stay cuDNN's. The result equals
cuDNN's up to float summation order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import grad_and_value, vmap
from torch.nn import functional
from torch.overrides import TorchFunctionMode

CONV_GRADS = ("cudnn", "unfold")
"""How the batched step computes 2-D convolution weight gradients: PyTorch's own (cuDNN on a GPU) or
:class:`UnfoldConvGrads`."""

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


class _UnfoldWeightGradConv2d(torch.autograd.Function):
    """``conv2d(input, weight, bias, stride, padding, dilation)`` (groups 1) whose weight gradient is
    ``sum over samples and positions of grad_output x unfold(input)``: one matrix product, batched over devices
    under ``vmap`` (``generate_vmap_rule``), instead of a grouped convolution's weight-gradient kernel."""

    generate_vmap_rule = True

    @staticmethod
    def forward(input, weight, bias, stride, padding, dilation):  # noqa: A002 - conv2d's own argument names
        return functional.conv2d(input, weight, bias, stride, padding, dilation)

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, weight, bias, stride, padding, dilation = inputs  # noqa: A001
        ctx.save_for_backward(input, weight)
        ctx.geometry = (stride, padding, dilation)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors  # noqa: A001
        stride, padding, dilation = ctx.geometry
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = torch.nn.grad.conv2d_input(input.shape, weight, grad_output, stride, padding, dilation)
        if ctx.needs_input_grad[1]:
            columns = functional.unfold(input, weight.shape[2:], dilation, padding, stride)  # (B, C*kh*kw, L)
            grad_weight = torch.einsum("bol,bkl->ok", grad_output.flatten(2), columns).reshape(weight.shape)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum((0, 2, 3))
        return grad_input, grad_weight, grad_bias, None, None, None


_CONV2D_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class UnfoldConvGrads(TorchFunctionMode):
    """While active, every ``conv2d`` call of 4-D input with groups 1 and numeric padding runs as
    :class:`_UnfoldWeightGradConv2d` (any other call, e.g. ``padding="same"`` or a depthwise convolution, runs as
    written). ``nn.Conv2d`` with a non-zero ``padding_mode`` pads first and then calls ``conv2d`` with padding 0,
    so it is covered too."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is functional.conv2d:
            bound = dict(zip(_CONV2D_ARGS, args, strict=False), **kwargs)
            padding = bound.get("padding", 0)
            if bound.get("groups", 1) == 1 and not isinstance(padding, str) and bound["input"].dim() == 4:
                return _UnfoldWeightGradConv2d.apply(
                    bound["input"],
                    bound["weight"],
                    bound.get("bias"),
                    bound.get("stride", 1),
                    padding,
                    bound.get("dilation", 1),
                )
        return func(*args, **kwargs)


def batched_step(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    param_keys: Sequence[str],
    buffer_keys: Sequence[str],
    conv_grads: str = "cudnn",
) -> Step:
    """The vmapped gradient step of ``model`` with ``loss_fn`` over stacked state (see the module docstring).

    ``step(params, buffers, inputs, targets)``: ``params`` ``(D, *shape)`` per entry of ``param_keys``,
    ``buffers`` likewise per entry of ``buffer_keys``; ``inputs`` ``(batch, D, *sample_shape)`` and ``targets``
    ``(batch, D, *target_shape)`` (vmapped over dimension 1). Returns per-device gradients ordered like
    ``params`` (each ``(D, *shape)``), each device's loss ``(D,)`` and outputs ``(D, batch, ...)``. Buffers
    updated in place by the forward pass (BatchNorm's running statistics) are updated in the tensors passed.
    ``conv_grads`` is one of :data:`CONV_GRADS` (see the module docstring).
    """
    if conv_grads not in CONV_GRADS:
        raise ValueError(f"conv_grads must be one of {', '.join(CONV_GRADS)}, got {conv_grads!r}")
    slots = ModuleSlots(model, [*param_keys, *buffer_keys])
    unfold = conv_grads == "unfold"

    def loss_and_outputs(
        params: tuple[torch.Tensor, ...], buffers: tuple[torch.Tensor, ...], inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if unfold:
            with UnfoldConvGrads():
                outputs = slots.call((*params, *buffers), inputs)
        else:
            outputs = slots.call((*params, *buffers), inputs)
        return loss_fn(outputs, targets), outputs

    return vmap(grad_and_value(loss_and_outputs, has_aux=True), in_dims=(0, 0, 1, 1))
