"""The row configs of the paper tables (``configs/experiment/<family>/``): one generator per family, their shared
writer and the listing of experiment names.
"""
