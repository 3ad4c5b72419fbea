"""The engine: owns the Response across model turns and runs hosted tools between them.

``hosted.py`` plans a request's hosted tools (what the back end is offered, the history it reads);
``turns.py`` drives a back end turn by turn; ``tools/`` are the tools themselves.
"""

from .hosted import HostedTool, HostedUse, Phase, Plan, RunContext, plan_hosted
from .turns import Engine

__all__ = ["Engine", "HostedTool", "HostedUse", "Phase", "Plan", "RunContext", "plan_hosted"]
