"""doctor: per-node facts (probes: a command and a pure parser) and the checks made of them."""
