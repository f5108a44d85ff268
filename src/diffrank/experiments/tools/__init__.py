"""Command-line tools around the runs: the cell launcher, throughput measurements, the Newton losses' cost per step
(``newton_benchmark``), the embedding caches (extract / convert) and the batch-size lookup.
"""
