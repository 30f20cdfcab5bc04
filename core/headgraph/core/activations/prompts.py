"""Bundled prompt set for attention-pattern scores (IOI-style sentences), plus user prompts.

Each sentence names two people, one of whom is repeated, so duplicate-token heads have
something to find; names and places vary so no single template dominates.
"""

from __future__ import annotations

from headgraph.core.errors import InvalidInput

_IOI_SENTENCES: tuple[str, ...] = (
    "When Mary and John went to the shops, John gave the bag to",
    "When Anna and Peter went to the park, Peter gave the ball to",
    "After Sarah and Tom arrived at the school, Tom handed the book to",
    "When Emma and David went to the market, David gave the apple to",
    "While Lucy and Mark were at the station, Mark passed the ticket to",
    "When Alice and Bob went to the library, Bob gave the pen to",
    "After Kate and James visited the museum, James gave the map to",
    "When Laura and Daniel went to the beach, Daniel gave the towel to",
    "When Rachel and Paul went to the office, Paul gave the letter to",
    "After Julia and Chris reached the hospital, Chris gave the flowers to",
    "When Sophie and Michael went to the cinema, Michael gave the popcorn to",
    "While Claire and Robert sat in the garden, Robert gave the cup to",
    "When Helen and George went to the restaurant, George gave the menu to",
    "After Grace and Henry came to the airport, Henry gave the passport to",
    "When Alice and Ryan went to the bakery, Ryan gave the bread to",
    "When Nina and Oscar went to the river, Oscar gave the rope to",
    "After Zoe and Adam walked to the church, Adam gave the candle to",
    "When Lily and Jack went to the farm, Jack gave the egg to",
    "While Olivia and Sam stood at the harbour, Sam gave the key to",
    "When Ella and Max went to the hotel, Max gave the coat to",
)


def default_prompts() -> list[str]:
    """The bundled IOI-style prompt set (a fresh list each call)."""
    return list(_IOI_SENTENCES)


def with_user_prompts(user: list[str] | str | None, *, include_default: bool = True) -> list[str]:
    """Prompt list: the bundled set (unless excluded) followed by the user's prompts.

    ``user`` may be a list or one string holding one prompt per line; blank lines are dropped.
    """
    if isinstance(user, str):
        user = user.splitlines()
    extra = [p.strip() for p in (user or []) if p and p.strip()]
    prompts = (default_prompts() if include_default else []) + extra
    if not prompts:
        raise InvalidInput("no prompts given")
    return prompts
