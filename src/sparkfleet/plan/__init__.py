"""recipe + cluster -> Plan: the frozen, per-rank description of everything ``up`` does, the
engine adapters that shape each rank's command, the memory model and the renderings. Pure."""
