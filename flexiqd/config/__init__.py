"""The daemon's configuration file: model and loader."""

from .load import load_config, parse_config
from .model import DEFAULT_CONFIG_PATH, DaemonConfig, FlexiqOptions, PoolConfig

__all__ = ["DEFAULT_CONFIG_PATH", "DaemonConfig", "FlexiqOptions", "PoolConfig", "load_config",
           "parse_config"]
