"""Test helpers that start real processes: broker, fault proxy, agent."""
