"""What runs afterwards, on the records: the paper-table report, the P_K report, the sweep summary and the
training curves.
"""
