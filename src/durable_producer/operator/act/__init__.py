"""The operator's actions: reading and writing the cluster and scraping the agents.

Each module here fetches what a pure function in ``decide/`` needs, calls it and writes the
result back (through ``cluster.py``, the one place that builds API clients).
"""
