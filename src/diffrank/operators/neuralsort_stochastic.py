"""Stochastic NeuralSort (Grover, Wang, Zweig, Ermon, ICLR 2019, §4): a relaxed sample of the Plackett-Luce
distribution over permutations.

The scores are the Plackett-Luce log-weights, log s (any real numbers; s = exp(scores)). A permutation drawn
from PL(s) is the sort of the Gumbel-perturbed log-weights s̃ = log s + g, g i.i.d. Gumbel(0, 1) (Grover et al.
2019, §4, Prop. 5, the Gumbel-max reparameterisation of Yellott 1977), and its relaxation is NeuralSort's P̂ of
s̃ (Eq. 5 of the same paper; :class:`~diffrank.operators.neuralsort.NeuralSort`). With ``hard=True`` the forward
is the exact permutation matrix of s̃'s order and the gradient that of P̂ (straight-through, Grover et al. 2019,
§3 "hard" variant: P_hard + (P̂ − P̂.detach())); where P̂'s rows are unimodal, the hard matrix is their row-wise
argmax (Grover et al. 2019, Thm. 4), and it is taken from the sort here so that it is always a permutation.

Noise, samples and reproducibility: :mod:`diffrank.operators.gumbel` (noise follows ``train()`` / ``eval()``
unless ``noise`` is set; ``samples`` > 1 adds a leading samples dimension). Without noise the operator is
NeuralSort of the scores (with ``hard``, its straight-through version).
"""

from __future__ import annotations

import torch
from torch import Tensor

from diffrank.operators.gumbel import GumbelSampling, gumbel
from diffrank.operators.neuralsort import NeuralSort


class NeuralSortStochastic(GumbelSampling, NeuralSort):
    """Stochastic NeuralSort: NeuralSort's P̂ of Gumbel-perturbed log-scores, rows = ranks (rank 1 = largest).

    Args:
        beta: inverse temperature β = 1/τ of the relaxation (Grover et al.'s τ), as in
            :class:`~diffrank.operators.neuralsort.NeuralSort` (learnable there and here).
        hard: straight-through: the forward value is the hard permutation matrix of the perturbed scores, the
            gradient that of P̂ (Grover et al. 2019, §3).
        noise: None (Gumbel noise in ``train()``, none in ``eval()``), True or False (:mod:`diffrank.operators.gumbel`).
        samples: PL samples per set, S >= 1; S > 1 adds a leading dimension to every result.
        generator: a :class:`torch.Generator` for the noise (on the scores' device), or None for torch's global one.
        backend: as NeuralSort's (the perturbed scores go through the same kernels).

    Shapes: ``forward(scores (B, n), k)`` → ``(B, k or n, n)``, or ``(S, B, k or n, n)`` for S > 1; each row sums
    to 1. ``soft_sort`` is ``P @ s`` of the unperturbed scores, ``soft_rank`` Σ_r r · P[r, j].

    Raises:
        ValueError: as NeuralSort, and a bad ``noise`` / ``samples``.
        TypeError: a ``generator`` that is not a :class:`torch.Generator`.
    """

    paper = ("Grover, Wang, Zweig, Ermon, ICLR 2019, §4 "
             "(Plackett-Luce via Gumbel-perturbed log-scores, NeuralSort Eq. 5)")
    parameter = "τ = 1/β"

    def __init__(self, beta: float | Tensor = 0.5, hard: bool = False, noise: bool | None = None, samples: int = 1,
                 generator: torch.Generator | None = None, backend: str = "auto") -> None:
        super().__init__(beta, backend)
        if not isinstance(hard, bool):
            raise ValueError(f"hard must be True or False, got {hard!r}")
        self.hard = hard
        self._init_sampling(noise, samples, generator)

    def _permutation(self, scores: Tensor, k: int | None) -> Tensor:
        """Rows of P̂ of the perturbed scores (straight-through hard rows with ``hard``): ``(B or S·B → S, B, k or n,
        n)``."""
        if self.noisy:
            g = gumbel((self.samples, *scores.shape), scores, self.generator)
            perturbed = (scores.unsqueeze(0) + g).flatten(0, 1)  # s̃ = log s + g, (S·B, n)
            return self._samples_out(self._relaxed(perturbed, k))
        return self._expanded(self._relaxed(scores, k))

    def _relaxed(self, scores: Tensor, k: int | None) -> Tensor:
        """NeuralSort's rows of ``scores`` ``(R, n)``, straight-through hard ones with ``hard``."""
        soft = super()._permutation(scores, k)
        if not self.hard:
            return soft
        order = scores.detach().argsort(dim=-1, descending=True)[:, :soft.shape[1]]
        hard = torch.zeros_like(soft).scatter_(-1, order.unsqueeze(-1), 1.0)
        return hard + (soft - soft.detach())

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, hard={self.hard}, {self._sampling_repr()}"
