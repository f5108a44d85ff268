"""Drop-in adapters for the peer libraries: porting is one changed import.

- :mod:`diffrank.compat.torchsort`: ``soft_rank`` / ``soft_sort`` with torchsort's signature
  (``regularization``, ``regularization_strength``; ascending).
- :mod:`diffrank.compat.diffsort`: ``DiffSortNet`` with diffsort's P orientation and its ``x @ P`` rule.
- :mod:`diffrank.compat.difftopk`: ``DiffTopkNet`` and ``TopKCrossEntropyLoss`` with difftopk's defaults.
- :mod:`diffrank.compat.lapsum`: the official LapSum package's ``soft_topk`` / ``log_soft_topk``, ``soft_rank``,
  ``soft_sort`` and ``cross_entropy`` (``alpha``, ``dim``, ``largest``; a tensor ``alpha`` may require grad).

The adapters are thin: they translate arguments, orientation and defaults, and call diffrank's own operators. Each
states the peer's defaults explicitly (they are not always diffrank's config defaults). docs/api.md, "Porting".
"""
