"""Collectives between replicas."""
