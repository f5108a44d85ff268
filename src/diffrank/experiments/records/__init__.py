"""The record of a run: ``results.json`` (:mod:`.record`), made at the end of a run (:mod:`.finished`) with the facts
that decide its bits (:mod:`.environment`) and written safely (:mod:`.disk`); the record archives kept in
``results/`` (:mod:`.archive`); a run folder's state, done / resume / new, and its lock (:mod:`.folder`); and the
match of records to the papers' table rows (:mod:`.matching`, compared with Regular by :mod:`.significance`, printed
by :mod:`.table_cells`). Written by a job, read by the job runners and afterwards; it imports nothing of run /
callbacks / analysis / rows / tools.
"""
