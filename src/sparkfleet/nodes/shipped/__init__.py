"""Code that runs on the nodes, which have no sparkfleet installed: standard library only,
shipped by ``sparkfleet.nodes.ship`` (see its ``ShippedProgram``s). Modules import each other
only with ``from sparkfleet.nodes.shipped.<module> import …`` lines, which the joining drops.
"""
