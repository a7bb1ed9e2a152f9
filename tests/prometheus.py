"""Reading a `/metrics` scrape in tests, with prometheus_client's own parser."""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of label pairs): value} of a scrape."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scraped: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """The sum over the series of `name` whose labels include `labels` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in scraped.items() if n == name and wanted <= ls)


def exposable_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry's metrics can expose, labelled series present or not."""
    suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_count", "_sum", "_created"],
                "gauge": [""], "summary": ["", "_count", "_sum", "_created"], "info": ["_info"]}
    return {family.name + suffix for family in registry.collect() for suffix in suffixes.get(family.type, [""])}
