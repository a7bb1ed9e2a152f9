"""The numbers of every message and config: JSON's integer and number, and nothing else.

Pydantic's lax mode reads `true` as 1 and `"3"` as 3, so `{"edge_id": false}` was edge 0 and `rounds: true` one
round, where the published schema says integer. Every int and float field of the wire messages, RunConfig and the
algorithms' params is one of these (tests/shared/test_numbers.py walks them all): an integer field takes a JSON
integer, a number field any JSON number (an integer too), and neither takes a boolean or a string. (A dict keyed
by id keeps plain int keys: JSON writes every key as a string.)"""
from __future__ import annotations

from typing import Annotated

from pydantic import Strict

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
