"""Experiments: one module each, providing data and a model builder. See README.md here."""
