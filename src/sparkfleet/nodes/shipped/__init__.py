"""Code that runs on the nodes, which have no sparkfleet installed: standard library only.

``process_agent`` is sent as a ``python3 -c`` program; the staging modules (``failure``,
``safetensors_index``, ``ledger``, ``disk``, ``layouts``, ``sparse_rows``) are joined into one
script by ``sparkfleet.apply.staging.bundle``; ``composed_worker`` is sent as it is.
"""
