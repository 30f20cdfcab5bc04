"""The registry of named pure computations, from which every cache key derives.

A :class:`Computation` is ``fn(inputs, **params) -> payload``: given one model's inputs
(its head weights, info, pattern source, and the other registered results it builds on) and
validated parameters, it returns device-free data (numpy arrays, JSON dicts) that the store
keeps under ``make_key(fingerprint, name, key_params)`` (name + fingerprint + canonical
parameters + COMPUTE_VERSION). Which fingerprint is the computation's declaration ``reads``:
the weights fingerprint for what reads the head weights only (PK, CS, nulls, token tables),
the model fingerprint for what runs the model or reads such a result (patterns, ablations,
data-weighted PK, circuits; core.models.fingerprint). The same registry, built by the composition root,
exists in every process: a compute process runs a computation by looking up its registered
name here, never by calling a method of some service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from headgraph.core.types import HeadWeights, ModelInfo


class Inputs(Protocol):
    """What a computation reads about one model (loaded lazily, only when it is used)."""

    @property
    def heads(self) -> HeadWeights: ...

    @property
    def info(self) -> ModelInfo: ...

    @property
    def patterns(self) -> Any:
        """core PatternSource, or None when the model cannot be run here."""
        ...

    def result(self, name: str, **params: Any) -> Any:
        """Another registered computation of the same model (cached, single flight)."""
        ...


# What a computation reads, so which fingerprint keys its results (Computation.reads).
WEIGHTS = "weights"  # the head weights, W_U and tokenizer only: keyed by the weights fingerprint
MODEL = "model"  # the runnable model (a forward pass), directly or through another result
READS = (WEIGHTS, MODEL)


def _same(params: dict[str, Any]) -> dict[str, Any]:
    return params


def _identity(payload: Any) -> Any:
    return payload


@dataclass(frozen=True)
class Computation:
    """One named computation: its function, parameter checks and cache-key parameters.

    - ``checks``: parameter name -> validator returning the canonical value (raises
      InvalidInput / ApiError for a bad one); its keys are exactly the parameters;
    - ``key``: the parameters as they go into the cache key (default: as checked);
    - ``load``: stored payload -> the value callers get (e.g. PairScores);
    - ``batch``: optional ``batch(inputs, [params, ...])`` doing the work several parameter
      sets share once (e.g. every pairing's PK from one pass over the bases);
    - ``reads``: WEIGHTS or MODEL (see the module docstring), or a function of the key
      parameters returning one (their values may be strings: parsed back from a store key).
    """

    name: str
    fn: Callable[..., Any]
    checks: Mapping[str, Callable[[Any], Any]]
    key: Callable[[dict[str, Any]], dict[str, Any]] = _same
    load: Callable[[Any], Any] = _identity
    batch: Callable[[Inputs, list[dict[str, Any]]], None] | None = None
    reads: str | Callable[[Mapping[str, Any]], str] = WEIGHTS

    def __post_init__(self) -> None:
        if isinstance(self.reads, str) and self.reads not in READS:
            raise ValueError(f"computation {self.name!r}: reads must be one of {READS}")

    def prepare(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Validated, canonical parameters (TypeError for missing or unknown names)."""
        missing = set(self.checks) - set(params)
        extra = set(params) - set(self.checks)
        if missing or extra:
            raise TypeError(f"computation {self.name!r} takes {sorted(self.checks)}; "
                            f"missing {sorted(missing)}, unknown {sorted(extra)}")
        return {name: check(params[name]) for name, check in self.checks.items()}

    def key_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.key(params)

    def reads_model(self, key_params: Mapping[str, Any]) -> bool:
        """Whether results with these key parameters read the whole runnable model (so are
        keyed by the model fingerprint), not only the head weights."""
        reads = self.reads if isinstance(self.reads, str) else self.reads(key_params)
        if reads not in READS:
            raise ValueError(f"computation {self.name!r}: reads gave {reads!r}")
        return reads == MODEL

    def run(self, inputs: Inputs, params: dict[str, Any]) -> Any:
        return self.fn(inputs, **params)


class Computations:
    """Registered computations by name."""

    def __init__(self, items: list[Computation] | None = None) -> None:
        self._by_name: dict[str, Computation] = {}
        for c in items or []:
            self.register(c)

    def register(self, computation: Computation) -> Computation:
        if computation.name in self._by_name:
            raise ValueError(f"computation {computation.name!r} is registered twice")
        self._by_name[computation.name] = computation
        return computation

    def get(self, name: str) -> Computation:
        try:
            return self._by_name[name]
        except KeyError:
            raise LookupError(f"no computation named {name!r}; registered: "
                              f"{sorted(self._by_name)}") from None

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def __iter__(self) -> Iterator[Computation]:
        return iter(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name


# -- parameter checks shared by the computation modules ----------------------------------------

def any_value(value: Any) -> Any:
    return value


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TypeError(f"expected a positive int, got {value!r}")
    return value


def optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def run(value: Any) -> Any:
        return None if value is None else check(value)

    return run
