"""The Hydra config tree (package data of the wheel: ``configs/`` installs as ``diffrank.configs``)."""
