"""Typed exceptions of the agentbox SDK.

Every error the daemon reports is an :class:`APIError`, or rather one of its
subclasses chosen by the API's stable error code (``not_found`` ->
:class:`NotFound`, ``resource_exhausted`` -> :class:`QuotaExceeded`, ...).
Each carries the HTTP ``status`` (0 for an error event at the end of an
exec, attach or build stream), the ``code``, the ``message`` and the
daemon's ``request_id`` (the id of its log line). A failure to reach the
daemon or to read its answer is a :class:`TransportError`.

A command that exits non-zero is never an exception: see ``Result.exit_code``.
"""

from __future__ import annotations

import builtins
import email.utils
import json
import time
from typing import Any, Dict, List, Mapping, Optional, Type

__all__ = [
    "AgentboxError",
    "APIError",
    "InvalidArgument",
    "Unauthorized",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "AlreadyExists",
    "FailedPrecondition",
    "TooLarge",
    "QuotaExceeded",
    "DeadlineExceeded",
    "Unavailable",
    "NotImplementedByDaemon",
    "InternalError",
    "MergeConflict",
    "TransportError",
    "StreamTruncated",
    "REASON_COMMAND_NOT_FOUND",
    "REASON_COMMAND_NOT_EXECUTABLE",
]

#: APIError.reason of an exec whose executable does not exist (code not_found).
REASON_COMMAND_NOT_FOUND = "command_not_found"
#: APIError.reason of an exec whose executable cannot be run (permission_denied).
REASON_COMMAND_NOT_EXECUTABLE = "command_not_executable"


class AgentboxError(Exception):
    """Base class of every exception the SDK raises."""


class APIError(AgentboxError):
    """An error reported by the daemon.

    Attributes:
        status: HTTP status; 0 for an error event inside a stream.
        code: the API's stable category (``"not_found"``, ``"conflict"``, ...).
        message: human-readable, safe to show.
        request_id: the daemon's request id (matches its log line), or "".
        reason: refines code where a caller acts on it
            (:data:`REASON_COMMAND_NOT_FOUND`, ...), usually "".
        retry_after: seconds the daemon asked the caller to wait before
            retrying (the Retry-After header of a 429 or 503), or None.
        body: the decoded JSON body of the response, or None.
    """

    code_default = "internal"

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str = "",
        request_id: str = "",
        reason: str = "",
        retry_after: Optional[float] = None,
        body: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.status = status
        self.code = code or self.code_default
        self.message = message or self.code.replace("_", " ")
        self.request_id = request_id
        self.reason = reason
        self.retry_after = retry_after
        self.body = body
        super().__init__(self.message)

    def __str__(self) -> str:
        s = self.message
        if self.request_id:
            s += " (request id %s)" % self.request_id
        return s

    def __repr__(self) -> str:
        return "%s(status=%d, code=%r, message=%r, request_id=%r)" % (
            type(self).__name__, self.status, self.code, self.message, self.request_id)


class InvalidArgument(APIError):
    """The daemon rejected the request's arguments (400)."""
    code_default = "invalid_argument"


class Unauthorized(APIError):
    """The API key is missing, wrong or revoked (401)."""
    code_default = "unauthenticated"


class PermissionDenied(APIError):
    """The key's scope or tenant does not allow the operation (403)."""
    code_default = "permission_denied"


class NotFound(APIError):
    """The object does not exist (or belongs to another tenant) (404)."""
    code_default = "not_found"


class Conflict(APIError):
    """The object's state does not allow the operation (409)."""
    code_default = "conflict"


class AlreadyExists(Conflict):
    """An object of that name already exists (409)."""
    code_default = "already_exists"


class FailedPrecondition(APIError):
    """A precondition of the operation does not hold (412)."""
    code_default = "failed_precondition"


class TooLarge(APIError):
    """The request or its result is too large (413)."""
    code_default = "too_large"


class QuotaExceeded(APIError):
    """A limit was reached, such as a tenant's quota (429).

    ``retry_after`` says, in seconds, when to try again (None if unknown).
    """
    code_default = "resource_exhausted"


class DeadlineExceeded(APIError):
    """The operation took longer than allowed (504)."""
    code_default = "deadline_exceeded"


class Unavailable(APIError):
    """The daemon (or a sandbox's guest) cannot serve the request now (503)."""
    code_default = "unavailable"


class NotImplementedByDaemon(APIError):
    """The daemon or its backend does not implement the operation (501)."""
    code_default = "not_implemented"


class InternalError(APIError):
    """The daemon failed (500); report the request id."""
    code_default = "internal"


class MergeConflict(Conflict):
    """A merge found paths changed on both sides with no side chosen.

    Nothing was applied. ``conflicts`` lists them (dicts with ``path``, ...).
    """

    @property
    def conflicts(self) -> List[Dict[str, Any]]:
        return list((self.body or {}).get("conflicts") or [])


class TransportError(AgentboxError, builtins.ConnectionError):
    """The daemon could not be reached, or its answer could not be read.

    Attributes:
        host: the configured daemon address.
        op: the request, e.g. ``"GET /sandboxes"``.
    """

    def __init__(self, host: str, op: str, cause: BaseException) -> None:
        self.host = host
        self.op = op
        self.cause = cause
        super().__init__("daemon at %s: %s: %s" % (host, op, cause))


class StreamTruncated(TransportError):
    """An exec, attach or build stream ended before its final event.

    The connection was lost; the command may still be running.
    """


_BY_CODE: Dict[str, Type[APIError]] = {
    "invalid_argument": InvalidArgument,
    "unauthenticated": Unauthorized,
    "permission_denied": PermissionDenied,
    "not_found": NotFound,
    "already_exists": AlreadyExists,
    "conflict": Conflict,
    "failed_precondition": FailedPrecondition,
    "too_large": TooLarge,
    "resource_exhausted": QuotaExceeded,
    "deadline_exceeded": DeadlineExceeded,
    "unavailable": Unavailable,
    "not_implemented": NotImplementedByDaemon,
    "internal": InternalError,
}

_CODE_BY_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "conflict",
    412: "failed_precondition",
    413: "too_large",
    429: "resource_exhausted",
    501: "not_implemented",
    503: "unavailable",
    504: "deadline_exceeded",
}


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Parse a Retry-After value (delay-seconds or an HTTP date) into seconds."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        n = int(value)
        return float(n) if n > 0 else None
    try:
        t = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    d = t - (time.time() if now is None else now)
    return d if d > 0 else None


def error_from_response(status: int, headers: Mapping[str, str], raw: bytes) -> APIError:
    """Build the typed APIError for a non-2xx response."""
    request_id = headers.get("X-Request-Id", "") or ""
    body: Optional[Dict[str, Any]] = None
    code, message, reason = "", "", ""
    try:
        decoded = json.loads(raw.decode("utf-8"))
        if isinstance(decoded, dict):
            body = decoded
    except (ValueError, UnicodeDecodeError):
        pass
    if body is not None and (body.get("code") or body.get("message")):
        code = str(body.get("code") or "")
        message = str(body.get("message") or "")
        reason = str(body.get("reason") or "")
        request_id = str(body.get("request_id") or "") or request_id
    else:
        message = raw.decode("utf-8", "replace").strip()
    if not code:
        code = _CODE_BY_STATUS.get(status, "internal")
    retry_after = None
    if status in (429, 503):
        retry_after = parse_retry_after(headers.get("Retry-After"))
    cls = _BY_CODE.get(code, APIError)
    if status == 409 and body is not None and body.get("conflicts"):
        cls = MergeConflict
    return cls(message, status=status, code=code, request_id=request_id, reason=reason,
               retry_after=retry_after, body=body)


def error_from_event(err: Optional[Dict[str, Any]]) -> APIError:
    """Build the typed APIError for the error event that ends a stream."""
    if not err:
        return InternalError("daemon reported an error without details")
    code = str(err.get("code") or "internal")
    cls = _BY_CODE.get(code, APIError)
    return cls(str(err.get("message") or ""), code=code, request_id=str(err.get("request_id") or ""),
               reason=str(err.get("reason") or ""), body=err)
