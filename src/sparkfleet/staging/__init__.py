"""Staging: per-rank row packing of large tables, composed model directories, disk checks.

Modules named ``failure``, ``safetensors_index``, ``ledger``, ``disk`` and ``sparse_rows`` run on
the node: they use only the standard library (numpy and xxhash when importable) and are shipped
there as one script by ``bundle``. ``runner`` and ``composed`` drive them through a Transport.
"""
