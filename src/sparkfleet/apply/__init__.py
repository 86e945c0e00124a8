"""Runs a Plan: up (preflight, images, distribution, staging, start, readiness, smoke), rollback,
down, status and logs. Reaches nodes only through ``sparkfleet.nodes``."""
