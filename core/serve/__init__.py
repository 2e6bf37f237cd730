"""`llm-ensembling serve`: one ensemble as one OpenAI-compatible model over HTTP.

The engine never imports this package; it needs the `serve` extra (starlette, uvicorn,
prometheus-client). `settings` is free of those, so a configuration is checked before they load.
"""

from .settings import EnsembleSpec, Limits, ServeSettings, build_settings, read_config

__all__ = ["EnsembleSpec", "Limits", "ServeSettings", "build_settings", "read_config"]
