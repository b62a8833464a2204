"""Cluster planner: analytical memory and time model of 3D-parallel transformer training and a
search over layouts (no torch). Entry points: :func:`search`, :func:`estimate`, ``trainperf plan``."""

from trainperf.planner.constants import DEFAULTS, Constants
from trainperf.planner.cost import Estimate, Layout, estimate
from trainperf.planner.model import ModelSpec, from_preset
from trainperf.planner.search import Fixed, Plan, search

__all__ = ["DEFAULTS", "Constants", "Estimate", "Layout", "estimate", "ModelSpec", "from_preset", "Fixed", "Plan", "search"]
