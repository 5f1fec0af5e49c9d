"""The root of durabl's exception tree, and how a report names an error."""

from __future__ import annotations

from typing import Any, ClassVar


class DurablError(Exception):
    """durabl could not do what was asked."""

    reported_as: ClassVar[str] = "DurablError"
    """The class name a report gives this error: its own, or that of the class it refines."""

    def __init_subclass__(cls, *, refines: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not refines:
            cls.reported_as = cls.__name__

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    def __reduce__(self) -> tuple[Any, ...]:
        # Fields are keyword-only, so the default (call the class with ``args``) cannot rebuild
        # an error: copies and pickles restore the finished message and the fields instead.
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[DurablError], args: tuple[Any, ...], fields: dict[str, Any]) -> DurablError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(fields)
    return error


def described(error: BaseException) -> str:
    """``Class: message``, as reports name an error (a refinement by the class it refines)."""
    name = error.reported_as if isinstance(error, DurablError) else type(error).__name__
    return f"{name}: {error}"
