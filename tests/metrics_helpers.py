"""Reading /metrics in tests: one scrape as samples by name, and one sample's value."""

from prometheus_client.parser import text_string_to_metric_families


def scrape(client, **headers) -> dict[str, list]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    matching = [
        s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return matching[0]
