"""Configuration: typed tree (schema), loading (YAML + --set), resolution of ``auto``."""

from trainperf.config.load import load_config
from trainperf.config.schema import Config

__all__ = ["Config", "load_config"]
