"""Gumbel noise and the sampling settings shared by the stochastic operators: Gumbel-Sinkhorn (Mena, Belanger,
Linderman, Snoek, ICLR 2018, §3-4) and stochastic NeuralSort (Grover, Wang, Zweig, Ermon, ICLR 2019, §4).

**When noise is drawn.** ``noise=None`` (the configs' default) follows the module's mode: noise in ``train()``,
none in ``eval()``, so that a model trained by Lightning (or any loop calling ``model.train()`` /
``model.eval()``) samples while it trains and is deterministic while it validates and tests, the two papers'
protocol (Mena et al. 2018, §4; Grover et al. 2019, §6 use the noiseless / hard permutation at test time).
``noise=True`` / ``False`` fix it whatever the mode. :func:`diffrank.operators.load` builds a module in training
mode (torch's default); :mod:`diffrank.functional` builds its operators in evaluation mode.

**Samples.** ``samples = S > 1`` draws S independent perturbations per set: every method then returns a leading
samples dimension, ``(S, B, …)`` (``forward`` → ``(S, B, k or n, n)``, ``soft_sort`` / ``soft_rank`` →
``(S, B, n)``, ``topk_membership`` → ``(S, B, len(ks), n)``), which broadcasts against a ``(B, …)`` target, so a
loss averaged over every element averages over the samples too (the papers' Monte-Carlo estimate of the expected
loss). Without noise the S samples are one computation expanded (identical, no extra cost), so the shape does
not change between training and evaluation. ``samples = 1`` (default) gives the operators' usual shapes.

**Reproducibility.** Noise comes from ``generator`` (a :class:`torch.Generator` on the scores' device) when one
is given, else from torch's global generator, which ``lightning.seed_everything`` / ``torch.manual_seed`` (the
framework's ``seed``) sets: a run is reproducible from its seed. Under ``torch.func.vmap`` noise needs
``randomness="different"`` or ``"same"`` (torch's default ``"error"`` refuses random draws).
"""

from __future__ import annotations

import torch
from torch import Tensor


def gumbel(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Standard Gumbel(0, 1) samples, g = −log(−log U) with U ~ Uniform(0, 1).

    Args:
        shape: the shape of the sample.
        like: a tensor whose dtype (float32 / float64) and device the sample takes.
        generator: the random generator (on ``like``'s device), or None for torch's global one.

    Returns:
        ``shape`` tensor of ``like``'s dtype and device; every value finite (U is kept >= the dtype's smallest
        normal number, so g >= −log(−log tiny) ≈ −4.5 in float32, −6.6 in float64; U < 1 bounds it above).

    Raises:
        TypeError: ``generator`` not a :class:`torch.Generator` or None.
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    u = torch.rand(shape, dtype=like.dtype, device=like.device, generator=generator)
    return -torch.log(-torch.log(u.clamp_min(torch.finfo(like.dtype).tiny)))


class GumbelSampling:
    """The noise settings of a stochastic :class:`~diffrank.operators.base.RankingOperator` (a mixin listed before
    it): ``noise``, ``samples`` and ``generator`` as in the module docstring.

    Raises:
        ValueError: ``noise`` not None / True / False, or ``samples`` not an integer >= 1 (from
            :meth:`_init_sampling`).
        TypeError: ``generator`` not a :class:`torch.Generator` or None.
    """

    def _init_sampling(self, noise: bool | None, samples: int, generator: torch.Generator | None) -> None:
        """Validate and store the settings (called from the operator's ``__init__``)."""
        if noise not in (None, True, False):
            raise ValueError(f"noise must be None (follow train() / eval()), True or False, got {noise!r}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.noise, self.samples, self.generator = noise, samples, generator

    @property
    def noisy(self) -> bool:
        """Whether the next call draws noise: ``noise`` if set, else the module's ``training`` flag."""
        return self.training if self.noise is None else self.noise

    def _samples_out(self, per_sample: Tensor) -> Tensor:
        """``(S · B, …)`` (sample-major) to ``(S, B, …)``; unchanged for S = 1."""
        return per_sample if self.samples == 1 else per_sample.unflatten(0, (self.samples, -1))

    def _expanded(self, out: Tensor) -> Tensor:
        """A noiseless ``(B, …)`` result as the S identical samples ``(S, B, …)`` (a view); unchanged for S = 1."""
        return out if self.samples == 1 else out.expand(self.samples, *out.shape)

    def _empty(self, scores: Tensor, *shape: int) -> Tensor:
        """The result for a batch of zero sets, with the samples dimension when S > 1."""
        out = scores.new_zeros((0, *shape)) + 0 * scores.sum()
        return self._expanded(out)

    def _sampling_repr(self) -> str:
        """The settings as ``extra_repr`` shows them."""
        return f"noise={self.noise}, samples={self.samples}" + ("" if self.generator is None else ", generator=set")
