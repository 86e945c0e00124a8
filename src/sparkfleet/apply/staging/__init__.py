"""Staging, controller side: per-rank row packing of large tables, composed model directories,
sync/copy/nfs distribution, snapshot identity. The node side lives in ``sparkfleet.nodes.shipped``
(bundled into one script by ``bundle``); ``runner`` and ``composed`` drive it through a Transport.
"""
