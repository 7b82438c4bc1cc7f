"""Scraping helpers of the metrics tests (a module with a unique name)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample of one scrape of ``url``, parsed by the client library's parser."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: Samples, metric: str, **labels: str) -> float:
    """The sample ``metric{labels}``; 0.0 when absent (a counter not yet counted)."""
    return samples.get((metric, frozenset(labels.items())), 0.0)
