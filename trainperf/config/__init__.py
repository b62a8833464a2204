"""Configuration: typed tree (schema), loading (YAML + --set), the autos the machine decides and the cross-field
rules (resolve; joined with the model and the layout by trainperf.train.resolve), the resume policy (resume)."""

from trainperf.config.load import load_config
from trainperf.config.schema import Config

__all__ = ["Config", "load_config"]
