"""The record of a run: ``results.json`` (:mod:`.record`), the record archives kept in ``results/``
(:mod:`.archive`), a run folder's state, done / resume / new (:mod:`.folder`), and the match of records to the
papers' table rows (:mod:`.paper_rows`). Written by a job, read by the
job runners and afterwards; it imports nothing of run / analysis / rows / tools.
"""
