"""Loopback fleet helpers for integration tests (real sshd per node); see loopback.py."""

from .loopback import LoopbackFleet, Node, loopback_fleet

__all__ = ["LoopbackFleet", "Node", "loopback_fleet"]
