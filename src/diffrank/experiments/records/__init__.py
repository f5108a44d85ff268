"""The record of a run: ``results.json`` (:mod:`.record`) and the record archives kept in ``results/``
(:mod:`.archive`). Written by a job, read afterwards; it imports nothing of run / analysis / rows / tools.
"""
