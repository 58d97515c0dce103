"""Packaging beyond setup.cfg: the run-config presets, kept at the top of the repository as configs/ (their source),
installed with the package as jaxcap/config_presets/, so `python -m jaxcap.launch --config=caprl` works after a
`pip install` from any directory (jaxcap/config/presets.py finds them in either place)."""

from setuptools import find_packages, setup

PRESETS = {"jaxcap.config_presets": "configs", "jaxcap.config_presets.experiments": "configs/experiments"}

setup(packages=find_packages(include=["jaxcap*"]) + list(PRESETS), package_dir=PRESETS)
