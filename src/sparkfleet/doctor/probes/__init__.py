"""Node facts: one small module per fact, each a command (an argv list) plus a pure parser.

A parser takes the command's stdout (and exit code where it matters) and returns a frozen
dataclass; it never runs anything. `bundle` runs several probes on one node in a single
round trip, so a doctor run over SSH costs one connection per node.
"""
