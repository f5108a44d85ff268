"""Command-line tools around the runs: the cell launcher, throughput measurements, the embedding caches
(extract / convert) and the batch-size lookup.
"""
