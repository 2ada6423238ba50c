"""`manage.py simulate`: the real platform end to end under a noisy neighbour.

- `scenarios`: who sends what, when, to which endpoints (flood, slow-endpoints,
  retry-storm) and the runs --compare makes;
- `traffic`: the publisher thread, sending through the real accept path;
- `receiver`: the fast recording receiver, a process of its own;
- `environment`: the simulation's own Redis database, database and worker processes;
- `runner`: one run, start to finish; `session`: every run and round, --json, --plot;
- `report`: one run's latencies and figures; `summary`: the table, medians and goals;
- `plot`: the SVG.
"""
