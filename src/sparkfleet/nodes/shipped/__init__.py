"""Code that runs on the nodes, which have no sparkfleet installed: standard library only.

Every program here travels one way, ``sparkfleet.nodes.ship.run_shipped`` (``python3 [-S] -c
PROGRAM ARGS…``): ``agent`` (the node agent), the staging worker (``failure``,
``safetensors_index``, ``ledger``, ``disk``, ``layouts``, ``sparse_rows`` joined in that order),
``composed_worker`` and ``snapshot_scan``. Modules import each other only with
``from sparkfleet.nodes.shipped.<module> import …`` lines, which the joining drops.
"""
