"""The spec a worker builds with now, and its version, held for the threads that read them."""

from __future__ import annotations

from ingest.spec.model import SourceSpec


class SpecHolder:
    """The spec a worker builds with now, and its version: the one place they are held. The
    loop reads its split limits and gap policy, the pipeline the spec a submitted split is
    built with, the registry the version it reports. Only an applied spec version
    (ingest.consume.controls) changes it, on the polling thread; the pair is replaced in one
    store, so a reader on another thread never sees one version's spec with another's number."""

    __slots__ = ("_current",)

    def __init__(self, spec: SourceSpec, version: int) -> None:
        self._current = (spec, version)

    @property
    def spec(self) -> SourceSpec:
        return self._current[0]

    @property
    def version(self) -> int:
        return self._current[1]

    def current(self) -> tuple[SourceSpec, int]:
        """The spec and its version, read together."""
        return self._current

    def set(self, spec: SourceSpec, version: int) -> None:
        self._current = (spec, version)
