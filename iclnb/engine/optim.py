"""The optimiser of the training loop: :func:`make_optimizer` and the CPU's :class:`LeanAdam`.

Adam on the flat parameter buffer is K independent Adams (it is elementwise). On CUDA it is
torch's fused, capturable Adam (a CUDA graph captures its step); on the CPU it is
:class:`LeanAdam`, torch's fused Adam without its per-step Python bookkeeping (the same numbers).
LeanAdam makes the call torch's own fused step makes to the private kernel
``torch._fused_adam_``; it probes that kernel once with the call it makes, and where this torch
has none, or the call does not fit its signature, it warns once and steps as torch's own Adam
(``torch.optim.Adam.step``, the default implementation, which needs no private kernel). So
torch may be any version in the range of ``pyproject.toml``; CI pins one (``constraints.txt``).
"""

from __future__ import annotations

import warnings

import torch

_PROBED: list = [None, False]  # [the kernel last probed, whether LeanAdam's call fits it]
_WARNED: list = [False]  # the fallback warns once per process


def _kernel_call(kernel, params, grads, exp_avgs, exp_avg_sqs, steps, group) -> None:
    """The call torch's fused Adam step makes (torch/optim/adam.py, ``_fused_adam``), no amsgrad."""
    kernel(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
           beta1=group["betas"][0], beta2=group["betas"][1], weight_decay=0.0, eps=group["eps"],
           maximize=False, grad_scale=None, found_inf=None)


def fused_adam_kernel():
    """``torch._fused_adam_`` when this torch has it and it takes LeanAdam's call (probed once
    on scratch tensors, and again whenever the attribute is another object), else None."""
    kernel = getattr(torch, "_fused_adam_", None)
    if kernel is not _PROBED[0]:
        ok = False
        if kernel is not None:
            group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}
            try:
                _kernel_call(kernel, *([torch.zeros(1)] for _ in range(4)), [torch.zeros(())], group)
                ok = True
            except (TypeError, RuntimeError, NotImplementedError):
                ok = False
        _PROBED[:] = [kernel, ok]
    return kernel if _PROBED[1] else None


class LeanAdam(torch.optim.Adam):
    """torch's fused Adam without its per-step Python bookkeeping, for the CPU (where it costs
    a noticeable share of a small ensemble's step; benchmarks/README.md): the first step sets the
    state up through torch, every later one makes the two calls torch's own fused step makes
    (so the numbers are the same), with the argument lists built once and reused while the
    parameters' gradients and the state are the same tensors (checked every step, so a loaded
    state or another group rebuilds them). Anything but plain fused Adam on one group goes to
    torch. ``step`` is bound per instance, past the wrapper torch puts on every optimizer's step
    (a profiler record and the step hooks; this library registers no optimizer hooks).

    Where the private kernel is missing or does not take the call (:func:`fused_adam_kernel`),
    every step is torch's own Adam step with ``fused`` off (one warning per process)."""

    _lean = None  # (params, grads, exp_avgs, exp_avg_sqs, steps) of the last lean step

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step = self._lean_step

    def __setstate__(self, state):
        super().__setstate__(state)
        self.step = self._lean_step

    def _lean_step(self, closure=None):
        kernel = fused_adam_kernel()
        if kernel is None:
            return self._torch_step(closure)
        g, lean = self.param_groups[0], self._lean
        if (lean is None or not self._plain(closure) or len(g["params"]) != len(lean[0])
                or any(p.grad is not q or self.state[p].get("step") is not s
                       for p, q, s in zip(lean[0], lean[1], lean[4]))):
            lean = self._lean = self._lean_lists(closure)
            if lean is None:
                return torch.optim.Adam.step(self, closure)
        torch._foreach_add_(lean[4], 1)
        _kernel_call(kernel, *lean, g)
        return None

    def _torch_step(self, closure):
        """torch's own Adam step (``fused`` off: torch's fused step calls the same kernel)."""
        if not _WARNED[0]:
            _WARNED[0] = True
            warnings.warn(f"torch {torch.__version__}: torch._fused_adam_ is missing or does not take the call "
                          "LeanAdam makes; training steps with torch's own Adam (fused off)", stacklevel=3)
        for group in self.param_groups:
            group["fused"] = False
        self._lean = None
        return torch.optim.Adam.step(self, closure)

    def _plain(self, closure) -> bool:
        """Plain fused Adam on one group (checked every step: a group's settings may change)."""
        g = self.param_groups[0]
        return (closure is None and len(self.param_groups) == 1 and g["fused"] and not g["amsgrad"]
                and not g["maximize"] and not g["weight_decay"] and not torch.is_tensor(g["lr"]))

    def _lean_lists(self, closure):
        """The lean step's argument lists, or None where torch's own step must run."""
        g = self.param_groups[0]
        params = [p for p in g["params"] if p.grad is not None]
        if not self._plain(closure) or len(params) != len(g["params"]) or any(p not in self.state for p in params):
            return None
        states = [self.state[p] for p in params]
        return (params, [p.grad for p in params], [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states], [s["step"] for s in states])


def make_optimizer(cfg, model) -> torch.optim.Optimizer:
    """The optimizer of ``cfg`` (a :class:`iclnb.engine.train.TrainConfig`) over ``model.flat``,
    as training uses it: plain gradient descent (``optimizer="sgd"``: stateless, so a CUDA graph
    captures it as it is), or fused Adam, capturable on CUDA and :class:`LeanAdam` on the CPU
    (the same numbers)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD([model.flat], lr=cfg.lr)
    cuda = model.flat.device.type == "cuda"
    return (torch.optim.Adam if cuda else LeanAdam)([model.flat], lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                                                    fused=True, capturable=cuda)
