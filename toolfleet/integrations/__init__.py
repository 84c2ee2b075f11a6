"""Adapters that drop the fleet into agent loops people already run (imported lazily: the core needs none of them)."""
