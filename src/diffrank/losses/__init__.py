"""Losses built on the ranking operators (top-k cross-entropy, sorting, learning to rank, top-K recommendation, kNN,
smooth top-k SVM, Newton, smoothing, ReSGRO) and their helpers; docs/api.md, "Losses", has the table with shapes and
papers.

Every public class and function of the modules of this package is exported here, written out below (``from
diffrank.losses import TopKCrossEntropyLoss``); ``tests/losses/test_exports.py`` keeps the list complete.
"""

from diffrank.losses.knn import NeighbourLoss, pairwise_euclidean
from diffrank.losses.newton import (
    NewtonLoss,
    newton_step,
    per_sample_derivatives,
    per_sample_derivatives_func,
    wrap_newton,
)
from diffrank.losses.newton_closed_forms import bce_derivatives, sigmoid_bce_derivatives, softmax_ce_derivatives
from diffrank.losses.pk import PK
from diffrank.losses.ranking import (
    approx_ndcg_loss,
    listmle_loss,
    listnet_loss,
    neural_ndcg_loss,
    pirank_loss,
    sigmoid_soft_rank,
    sinkhorn_scaling,
    smooth_ap_loss,
    soft_spearman_loss,
)
from diffrank.losses.recommendation import ApproxNDCGLoss, BPRLoss, ItemSoftmaxLoss, NeuralNDCGLoss, sample_negatives
from diffrank.losses.resgro import (
    ResgroLoss,
    kendall_tau,
    kendall_tau_objective,
    path_hamming_objective,
    resgro_select,
    resgro_target,
    subset_win_probabilities,
)
from diffrank.losses.smooth_topk import (
    SmoothHardTopKLoss,
    SmoothTopKLoss,
    hard_topk_svm,
    log_elementary_symmetric,
    smooth_topk_svm,
)
from diffrank.losses.smoothing import (
    SmoothedAlgorithm,
    SmoothedLoss,
    check_noise,
    sample_noise,
    score,
    smoothed_loss_derivatives,
)
from diffrank.losses.softmax_ce import SoftmaxCrossEntropyLoss
from diffrank.losses.sorting import (
    BubbleSwapLoss,
    RowSoftmaxCELoss,
    SoftRankMSELoss,
    SortingBCELoss,
    permutation_matrix,
    true_order,
    true_ranks,
)
from diffrank.losses.topk_cross_entropy import TopKCrossEntropyLoss, m_subset
from diffrank.losses.validation import (
    LabelRangeError,
    accepts_checks,
    call_operator,
    check_logits_labels,
    index_labels,
    logits_labels_checks,
)

__all__ = [
    "ApproxNDCGLoss",
    "BPRLoss",
    "BubbleSwapLoss",
    "ItemSoftmaxLoss",
    "LabelRangeError",
    "NeighbourLoss",
    "NeuralNDCGLoss",
    "NewtonLoss",
    "PK",
    "ResgroLoss",
    "RowSoftmaxCELoss",
    "SmoothHardTopKLoss",
    "SmoothTopKLoss",
    "SmoothedAlgorithm",
    "SmoothedLoss",
    "SoftRankMSELoss",
    "SoftmaxCrossEntropyLoss",
    "SortingBCELoss",
    "TopKCrossEntropyLoss",
    "accepts_checks",
    "approx_ndcg_loss",
    "bce_derivatives",
    "call_operator",
    "check_logits_labels",
    "check_noise",
    "hard_topk_svm",
    "index_labels",
    "kendall_tau",
    "kendall_tau_objective",
    "listmle_loss",
    "listnet_loss",
    "log_elementary_symmetric",
    "logits_labels_checks",
    "m_subset",
    "neural_ndcg_loss",
    "newton_step",
    "pairwise_euclidean",
    "path_hamming_objective",
    "per_sample_derivatives",
    "per_sample_derivatives_func",
    "permutation_matrix",
    "pirank_loss",
    "resgro_select",
    "resgro_target",
    "sample_negatives",
    "sample_noise",
    "score",
    "sigmoid_bce_derivatives",
    "sigmoid_soft_rank",
    "sinkhorn_scaling",
    "smooth_ap_loss",
    "smooth_topk_svm",
    "smoothed_loss_derivatives",
    "soft_spearman_loss",
    "softmax_ce_derivatives",
    "subset_win_probabilities",
    "true_order",
    "true_ranks",
    "wrap_newton",
]
