"""The experiment framework on top of the library: Hydra runner, Lightning modules, data, metrics, reports.

Installed with the ``experiments`` extra (``pip install diffrank[experiments]``); nothing in the library layer
(:mod:`diffrank.operators`, :mod:`diffrank.losses`, :mod:`diffrank.functional`) imports it.
"""
