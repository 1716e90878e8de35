"""GENI error types. The AM API layer maps these to result codes in one table (`GENI_CODES`); nothing else
knows the numbers."""

from __future__ import annotations


class GeniError(Exception):
    """An error that reaches the user as a GENI result: a code plus a message saying what to do."""

    code = 2  # ERROR

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadArgs(GeniError):
    code = 1


class Forbidden(GeniError):
    code = 3


class BadVersion(GeniError):
    code = 4


class ServerError(GeniError):
    code = 5


class TooBig(GeniError):
    code = 6


class Refused(GeniError):
    code = 7


class TimedOut(GeniError):
    code = 8


class DbError(GeniError):
    code = 9


class RpcError(GeniError):
    code = 10


class Unavailable(GeniError):
    code = 11


class SearchFailed(GeniError):
    code = 12


class Unsupported(GeniError):
    code = 13


class Busy(GeniError):
    code = 14


class Expired(GeniError):
    code = 15


class InProgress(GeniError):
    code = 16


class AlreadyExists(GeniError):
    code = 17


class MissingArgs(GeniError):
    code = 18


class OutOfRange(GeniError):
    code = 19


class CredentialInvalid(GeniError):
    code = 20


class CredentialExpired(GeniError):
    code = 21


class CredentialMismatch(GeniError):
    code = 22


class CredentialSignerUntrusted(GeniError):
    code = 23


class VlanUnavailable(GeniError):
    code = 24


class InsufficientBandwidth(GeniError):
    code = 25


class InsufficientNodes(GeniError):
    code = 26


class InsufficientDisk(InsufficientNodes):
    """A node's disk does not fit the file system its layer would live on (the authority's admission)."""


class PortUnavailable(Unavailable):
    """A public port asked for is held by another sliver, or none of the operator's range is free (UNAVAILABLE:
    GENI has no code of its own for it)."""


GENI_CODES: dict[str, int] = {
    cls.__name__: cls.code
    for cls in (
        GeniError, BadArgs, Forbidden, BadVersion, ServerError, TooBig, Refused, TimedOut, DbError, RpcError,
        Unavailable, SearchFailed, Unsupported, Busy, Expired, InProgress, AlreadyExists, MissingArgs,
        OutOfRange, CredentialInvalid, CredentialExpired, CredentialMismatch, CredentialSignerUntrusted,
        VlanUnavailable, InsufficientBandwidth, InsufficientNodes,
    )
}
"""Error type name → GENI code (DESIGN §3)."""

SUCCESS = 0


def error_named(type_name: str, message: str) -> GeniError:
    """The GENI error of the type named (an actor's answer names it, e.g. "InsufficientNodes"); a plain
    GeniError for a name that is none."""
    cls = globals().get(type_name)
    return cls(message) if isinstance(cls, type) and issubclass(cls, GeniError) else GeniError(message)
