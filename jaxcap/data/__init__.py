"""Datasets and data pipelines."""
