"""Project-wide pytest configuration."""
