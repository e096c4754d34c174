"""agentbox: the Python client of the agentbox daemon (standard library only).

    from agentbox import Client

    client = Client()  # AGENTBOX_HOST, AGENTBOX_API_KEY, AGENTBOX_CA_CERT
    with client.sandbox(template="debian") as sb:
        result = sb.run("python3 my_analysis.py")
        print(result.stdout)

AsyncClient is the same on asyncio, natively (async def methods over
asyncio streams)::

    async with AsyncClient().sandbox(template="debian") as sb:
        result = await sb.run("python3 my_analysis.py")

See docs/PYTHON.md for the reference.
"""

from ._http import API_VERSION, DEFAULT_HOST, ENV_API_KEY, ENV_CA_CERT, ENV_HOST
from .aio import AsyncClient, AsyncProcess, AsyncSandbox
from .client import Client
from .errors import (REASON_COMMAND_NOT_EXECUTABLE, REASON_COMMAND_NOT_FOUND, AgentboxError,
                     AlreadyExists, APIError, Conflict, DeadlineExceeded, FailedPrecondition,
                     InternalError, InvalidArgument, MergeConflict, NotFound,
                     NotImplementedByDaemon, PermissionDenied, QuotaExceeded, StreamTruncated,
                     TooLarge, TransportError, Unauthorized, Unavailable)
from ._api import sign_hook
from .sandbox import Process, Result, Sandbox, Secret

__version__ = "0.1.0"

__all__ = [
    "API_VERSION", "DEFAULT_HOST", "ENV_API_KEY", "ENV_CA_CERT", "ENV_HOST",
    "Client", "sign_hook", "Sandbox", "Process", "Result", "Secret",
    "AsyncClient", "AsyncSandbox", "AsyncProcess",
    "AgentboxError", "APIError", "InvalidArgument", "Unauthorized", "PermissionDenied",
    "NotFound", "Conflict", "AlreadyExists", "FailedPrecondition", "TooLarge",
    "QuotaExceeded", "DeadlineExceeded", "Unavailable", "NotImplementedByDaemon",
    "InternalError", "MergeConflict", "TransportError", "StreamTruncated",
    "REASON_COMMAND_NOT_FOUND", "REASON_COMMAND_NOT_EXECUTABLE",
]
